"""`last.ckpt` follows every epoch even when the monitored metric stops improving (the resume point), while
`best.ckpt` keeps the best epoch (or, with `checkpoint.keep_last`, the final one): the two callbacks of
training.pipeline.checkpoint_callbacks."""

from __future__ import annotations

import lightning.pytorch as L
import pytest
import torch
from omegaconf import OmegaConf
from torch import nn

from training.checkpoint_io import AtomicCheckpointIO
from training.pipeline import checkpoint_callbacks


class Worsening(L.LightningModule):
    """Its monitored score is best in the first epoch and falls every epoch after."""

    def __init__(self):
        super().__init__()
        self.layer = nn.Linear(2, 1)

    def training_step(self, batch, batch_idx):
        return self.layer(batch[0]).pow(2).mean()

    def on_train_epoch_end(self):
        self.log("val/mAP", 1.0 - 0.1 * self.current_epoch)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def train_dataloader(self):
        return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(8, 2)), batch_size=4)


def _fit_worsening(tmp_path, checkpoint: dict):
    """Three epochs of ``Worsening`` with the pipeline's two callbacks for ``checkpoint``; returns (best, trainer)."""
    best, latest = checkpoint_callbacks(OmegaConf.create({"checkpoint": checkpoint}))
    best.dirpath = latest.dirpath = str(tmp_path)
    trainer = L.Trainer(max_epochs=3, callbacks=[best, latest], logger=False, enable_progress_bar=False,
                        enable_model_summary=False, plugins=[AtomicCheckpointIO()])  # fmt: skip
    trainer.fit(Worsening())
    return best, trainer


def test_last_checkpoint_is_the_last_epoch_even_without_improvement(tmp_path):
    _fit_worsening(tmp_path, {"monitor": "val/mAP", "mode": "max"})
    last = torch.load(tmp_path / "last.ckpt", weights_only=True)
    kept = torch.load(tmp_path / "best.ckpt", weights_only=True)
    assert (last["epoch"], last["global_step"]) == (2, 6)  # epochs 0..2 of 2 steps each: the end of the fit
    assert kept["epoch"] == 0  # the best score, epoch 0's
    # the resume point carries the best callback's state, so a resumed run keeps testing the right checkpoint
    (state,) = [v for k, v in last["callbacks"].items() if "val/mAP" in k]
    assert state["best_model_score"].item() == 1.0


@pytest.mark.parametrize("mode", ["max", "min"])  # "min" is the unmonitored last.ckpt callback's own mode
def test_keep_last_makes_the_kept_checkpoint_the_final_epoch(tmp_path, mode):
    best, trainer = _fit_worsening(tmp_path, {"monitor": "val/mAP", "mode": mode, "keep_last": True})
    kept = torch.load(tmp_path / "best.ckpt", weights_only=True)
    assert kept["epoch"] == 2  # the final epoch although epoch 0 scored best
    assert best.best_model_score is None and trainer.callback_metrics["val/mAP"].item() == pytest.approx(0.8)
    # both callbacks' states are in the resume point, under distinct keys
    states = torch.load(tmp_path / "last.ckpt", weights_only=True)["callbacks"]
    assert len([key for key in states if "Checkpoint" in key]) == 2
