"""The best k checkpoints: kept by Lightning after every validation (several per epoch), ranked, slimmed to their
weights for MLflow, and named by ``<run id>:rank<n>`` / ``<run id>:top<k>`` (training.top_checkpoints)."""

from __future__ import annotations

import math

import lightning.pytorch as L
import pytest
import torch
from omegaconf import OmegaConf
from torch import nn

from apps.ensemble import EnsembleError, parse_weights
from training.checkpoint_io import AtomicCheckpointIO
from training.errors import UserError
from training.pipeline import checkpoint_callbacks, effective_batch_size, one_validation_per_epoch
from training.run_lookup import BadReference, parse_reference, split_checkpoint
from training.top_checkpoints import (
    index_document,
    kept_checkpoints,
    kept_ranks,
    ranked,
    weights_only,
    write_weights,
)

#: The monitored value of each validation, in order: two validations per epoch (``val_check_interval=0.5``).
SCORES = [0.1, 0.5, 0.3, 0.9, 0.2, 0.4]


class Scripted(L.LightningModule):
    """Validation ``i`` of the fit logs ``SCORES[i]``; 8 samples in batches of 2 train 4 steps an epoch."""

    def __init__(self):
        super().__init__()
        self.layer = nn.Linear(2, 1)
        self.validations = 0

    def training_step(self, batch, batch_idx):
        return self.layer(batch[0]).pow(2).mean()

    def validation_step(self, batch, batch_idx):
        return None

    def on_validation_epoch_end(self):
        self.log("val/mAP", SCORES[self.validations])
        self.validations += 1

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=0.1)

    def train_dataloader(self):
        return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(8, 2)), batch_size=2)

    def val_dataloader(self):
        return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(2, 2)), batch_size=2)


def _fit(tmp_path, top_k: int):
    cfg = OmegaConf.create({"checkpoint": {"monitor": "val/mAP", "mode": "max", "save_top_k": top_k}})
    best, latest = checkpoint_callbacks(cfg)
    best.dirpath = latest.dirpath = str(tmp_path)
    trainer = L.Trainer(max_epochs=3, val_check_interval=0.5, callbacks=[best, latest], logger=False,
                        num_sanity_val_steps=0, enable_progress_bar=False, enable_model_summary=False,
                        plugins=[AtomicCheckpointIO()])  # fmt: skip
    trainer.fit(Scripted())
    return best


def test_the_best_three_of_six_mid_epoch_validations_are_kept_and_ranked(tmp_path):
    best = _fit(tmp_path, top_k=3)
    kept = kept_checkpoints(best.best_k_models, "max", "val/mAP", first=best.best_model_path)
    # Validations after steps 2, 4 (end of epoch 0), 6, 8 (end of epoch 1), 10, 12: the 4th, 2nd and 6th win.
    assert [(k.rank, k.epoch, k.step) for k in kept] == [(1, 1, 8), (2, 0, 4), (3, 2, 12)]
    assert [k.value for k in kept] == pytest.approx([0.9, 0.5, 0.4])  # logged as float32
    assert kept[0].path == best.best_model_path
    assert sorted(p.name for p in tmp_path.glob("*.ckpt")) == sorted(
        ["last.ckpt", "top-e1-s8.ckpt", "top-e0-s4.ckpt", "top-e2-s12.ckpt"]
    )  # the dropped ones removed
    last = torch.load(tmp_path / "last.ckpt", weights_only=True)
    assert (last["epoch"], last["global_step"]) == (2, 12)  # the resume point is the end of the last epoch


def test_default_keeps_the_single_best_as_best_ckpt(tmp_path):
    best = _fit(tmp_path, top_k=1)
    assert best.best_model_path.endswith("best.ckpt") and best.best_model_score.item() == pytest.approx(0.9)
    assert torch.load(best.best_model_path, weights_only=True)["global_step"] == 8  # a mid-run validation's


def test_uploaded_weights_drop_the_optimizer_and_shrink(tmp_path):
    best = _fit(tmp_path, top_k=1)
    full = torch.load(best.best_model_path, weights_only=True)
    slim_path = write_weights(best.best_model_path, tmp_path / "slim.ckpt")
    slim = torch.load(slim_path, weights_only=True)
    assert set(slim) == {"state_dict", "epoch", "global_step"} and "optimizer_states" in full
    assert all(torch.equal(slim["state_dict"][k], v) for k, v in full["state_dict"].items())
    assert slim_path.stat().st_size < (tmp_path / "best.ckpt").stat().st_size


def test_weights_only_keeps_the_ema_average_not_the_trained_weights():
    average, trained = {"w": torch.ones(1)}, {"w": torch.zeros(1)}
    full = {"state_dict": average, "current_model_state": trained, "averaging_state": {}, "epoch": 3,
            "global_step": 40, "optimizer_states": [{}], "lr_schedulers": [], "loops": {}, "callbacks": {}}  # fmt: skip
    assert weights_only(full) == {"state_dict": average, "epoch": 3, "global_step": 40}


def test_ranking_by_mode_with_nan_last():
    scores = {"a": torch.tensor(0.2), "b": torch.tensor(float("nan")), "c": torch.tensor(0.7), "d": torch.tensor(0.2)}
    assert [p for p, _ in ranked(scores, "max")] == ["c", "a", "d", "b"]  # equal scores: the earlier first
    assert [p for p, _ in ranked(scores, "min")] == ["a", "d", "c", "b"]
    assert math.isnan(ranked(scores, "max")[-1][1])


def test_a_removed_checkpoint_is_skipped_and_the_ranks_close_up(tmp_path):
    best = _fit(tmp_path, top_k=3)
    (tmp_path / "top-e0-s4.ckpt").unlink()  # removed by a process killed after the resume point was written
    kept = kept_checkpoints(best.best_k_models, "max", "val/mAP")
    assert [(k.rank, k.step) for k in kept] == [(1, 8), (2, 12)]
    document = index_document(kept)
    assert [row["artifact"] for row in document["checkpoints"]] == ["checkpoints/best.ckpt",
                                                                    "checkpoints/top/rank2.ckpt"]  # fmt: skip
    assert "path" not in document["checkpoints"][0] and kept_ranks(document, "index") == 2


@pytest.mark.parametrize(
    "document",
    [[], {"format": 2, "checkpoints": [{"rank": 1}]}, {"format": 1, "checkpoints": []},
     {"format": 1, "checkpoints": [{"rank": 1}, {"rank": 3}]}, {"format": 1, "checkpoints": ["rank1"]}],
)  # fmt: skip
def test_a_malformed_index_is_refused_in_one_line(document):
    with pytest.raises(UserError, match="^run x index.json: "):
        kept_ranks(document, "run x index.json")


def test_top_k_with_keep_last_or_below_one_is_refused():
    for checkpoint in ({"keep_last": True, "save_top_k": 2}, {"save_top_k": 0}):
        cfg = OmegaConf.create({"checkpoint": {"monitor": "val/mAP", "mode": "max", **checkpoint}})
        with pytest.raises(UserError, match="checkpoint.save_top_k"):
            checkpoint_callbacks(cfg)


@pytest.mark.parametrize(
    ("reference", "expected"),
    [("abc123", ("abc123", 1, None)), ("abc123:rank2", ("abc123", 2, None)), ("run:abc123:top3", ("abc123", 1, 3)),
     ("models:/m@champion", ("models:/m@champion", 1, None)), ("runs:/abc/x", ("runs:/abc/x", 1, None))],
)  # fmt: skip
def test_checkpoint_references(reference, expected):
    assert split_checkpoint(reference) == expected


@pytest.mark.parametrize("reference", ["abc:rank0", "abc:top0", "abc:best", "abc:rank2:rank3", "abc:rank"])
def test_malformed_checkpoint_references_are_refused(reference):
    with pytest.raises(BadReference, match="expected <run id>"):
        split_checkpoint(reference)


def test_a_single_run_lookup_takes_a_rank_but_not_a_top():
    assert parse_reference("abc:rank3") == ("run", "abc")
    with pytest.raises(BadReference, match="only make ensemble"):
        parse_reference("abc:top3")


def _weights(members):
    return {"format": 1, "weighting": "mean", "members": members, "labels": ["A"],
            "weights": [[1.0 / len(members)]] * len(members)}  # fmt: skip


def test_stored_ensembles_may_name_kept_checkpoints_and_nothing_else():
    assert parse_weights(_weights(["abc", "abc:rank2", "abc:rank10"]), "e").members == [
        "abc",
        "abc:rank2",
        "abc:rank10",
    ]
    for member in ("abc:rank1", "abc:top2", "abc:rank0", "../abc", "abc:rank2/x"):  # rank1 is stored as the bare id
        with pytest.raises(EnsembleError, match="'members'"):
            parse_weights(_weights(["abc", member]), "e")


def test_effective_batch_size_is_batch_times_accumulation_times_processes():
    assert effective_batch_size(16, 1, 1) == 16
    assert effective_batch_size(16, 4, 2) == 128  # 16 images x 4 accumulated batches x 2 GPUs per step
    assert effective_batch_size(8, 3, 1) == 24


def test_validation_once_an_epoch_only_for_the_default_interval():
    assert one_validation_per_epoch(1.0)
    assert not one_validation_per_epoch(0.25)  # four validations an epoch
    assert not one_validation_per_epoch(1)  # an int counts batches: a validation after every batch


def test_early_stopping_counts_mid_epoch_validations(tmp_path):
    """configs/early_stopping/patience.yaml with patience 1: 0.1, then 0.5 (better), then 0.3 (not): the fit stops
    after the third validation, in the middle of epoch 1 (step 6 of 4 per epoch), not at an epoch's end."""
    from hydra.utils import instantiate

    from training.config_files import CONFIGS

    node = OmegaConf.load(CONFIGS / "early_stopping" / "patience.yaml").callbacks.early_stopping
    node.monitor, node.mode, node.patience = "val/mAP", "max", 1
    module = Scripted()
    trainer = L.Trainer(max_epochs=3, val_check_interval=0.5, callbacks=[instantiate(node)], logger=False,
                        num_sanity_val_steps=0, enable_progress_bar=False, enable_model_summary=False,
                        enable_checkpointing=False)  # fmt: skip
    trainer.fit(module)
    assert (module.validations, trainer.global_step) == (3, 6)  # step 6: half-way through epoch 1
