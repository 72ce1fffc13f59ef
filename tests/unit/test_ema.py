"""EMA of the weights (training/models/ema.py): what validation, the checkpoints and a resumed fit hold, checked
against an average recomputed by hand from the weights after every optimizer step."""

from __future__ import annotations

import math
from pathlib import Path

import lightning.pytorch as L
import pytest
import torch
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from training.checkpoint_io import AtomicCheckpointIO
from training.models.ema import EMA, ema_decay

STEPS_PER_EPOCH = 4
DECAY, WARMUP = 0.9, 3.0
# Not representable in a few bits: an average computed as d*x + (1-d)*x would drift by an ulp, a lerp does not.
CONSTANT = torch.tensor([0.1, 1234.567, -3.3e-7])


class Tiny(L.LightningModule):
    """A linear layer behind BatchNorm (running statistics and an integer counter) and a constant buffer."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.norm = nn.BatchNorm1d(3)
        self.layer = nn.Linear(3, 1)
        self.register_buffer("constant", CONSTANT.clone())

    def forward(self, x):
        return self.layer(self.norm(x))

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.mse_loss(self(x), y)

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val/loss", nn.functional.mse_loss(self(x), y))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.02)

    def _data(self, seed, n):
        generator = torch.Generator().manual_seed(seed)
        x = 2 + 3 * torch.randn(n, 3, generator=generator)  # far from BatchNorm's initial statistics
        return TensorDataset(x, x @ torch.tensor([[1.0], [-2.0], [0.5]]))

    def train_dataloader(self):
        return DataLoader(self._data(0, 8 * STEPS_PER_EPOCH), batch_size=8)

    def val_dataloader(self):
        return DataLoader(self._data(1, 16), batch_size=16)


class RawWeights(Callback):
    """The trained (not averaged) state after every optimizer step."""

    def __init__(self):
        self.states = []

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        self.states.append({name: value.detach().clone() for name, value in module.state_dict().items()})


def _fit(folder: Path, epochs: int, ckpt_path: Path | None = None) -> tuple[L.Trainer, Tiny, RawWeights, EMA]:
    raw, ema = RawWeights(), EMA(decay=DECAY, warmup_steps=WARMUP)
    checkpoints = ModelCheckpoint(dirpath=folder, filename="best", monitor="val/loss", mode="min", save_top_k=1,
                                  save_last=True, enable_version_counter=False, save_on_train_epoch_end=True)  # fmt: skip
    trainer = L.Trainer(max_epochs=epochs, accelerator="cpu", logger=False, enable_progress_bar=False,
                        enable_model_summary=False, num_sanity_val_steps=0, callbacks=[checkpoints, raw, ema],
                        plugins=[AtomicCheckpointIO()])  # fmt: skip
    model = Tiny()
    trainer.fit(model, ckpt_path=ckpt_path)
    return trainer, model, raw, ema


def _by_hand(states: list[dict]) -> dict[str, torch.Tensor]:
    """The warmed-up EMA of ``states`` in float64; integer tensors are the last value."""
    average = {name: value.double() if value.is_floating_point() else value for name, value in states[0].items()}
    for n, state in enumerate(states[1:], start=1):
        d = DECAY * (1 - math.exp(-n / WARMUP))
        average = {name: d * average[name] + (1 - d) * value if value.is_floating_point() else value
                   for name, value in state.items()}  # fmt: skip
    return average


def _load(path: Path) -> dict:
    return AtomicCheckpointIO().load_checkpoint(path, map_location="cpu")


def _assert_close(got: dict, want: dict) -> None:
    assert got.keys() == want.keys()
    for name, value in want.items():
        if value.is_floating_point():
            torch.testing.assert_close(got[name].double(), value, rtol=1e-6, atol=1e-6, msg=name)
        else:
            assert torch.equal(got[name], value), name


def _assert_equal(got: dict, want: dict) -> None:
    assert got.keys() == want.keys()
    for name, value in want.items():
        assert torch.equal(got[name], value), name


def test_decay_warms_up_to_its_value():
    assert ema_decay(0.998, 0, 1) == 0.998
    assert ema_decay(0.998, 100, 10) == pytest.approx(0.998 * (1 - math.exp(-0.1)))  # 0.095: a smoke run
    assert ema_decay(0.998, 100, 1000) == pytest.approx(0.998, abs=1e-4)
    with pytest.raises(ValueError, match="decay"):
        EMA(decay=1.5)


def test_validation_and_checkpoints_hold_the_average_of_the_trained_weights(tmp_path):
    trainer, model, raw, _ = _fit(tmp_path, epochs=3)
    steps = 3 * STEPS_PER_EPOCH
    assert len(raw.states) == steps

    last, best = _load(tmp_path / "last.ckpt"), _load(tmp_path / "best.ckpt")
    expected = _by_hand(raw.states)
    _assert_close(last["state_dict"], expected)
    _assert_equal(last["current_model_state"], raw.states[-1])  # the trained weights, kept for resume
    assert int(last["averaging_state"]["n_averaged"]) == steps
    # The average is not the trained weights: a checkpoint holding the raw ones would fail above.
    assert not torch.allclose(expected["layer.weight"].float(), raw.states[-1]["layer.weight"], atol=1e-3)
    assert not torch.allclose(expected["norm.running_mean"].float(), raw.states[-1]["norm.running_mean"], atol=1e-3)
    # Constant buffers stay exact, the integer counter is copied (both would be broken by d*x + (1-d)*x).
    assert torch.equal(last["state_dict"]["constant"], CONSTANT)
    assert int(last["state_dict"]["norm.num_batches_tracked"]) == steps

    # best.ckpt, which the test phase loads, holds the average as of its own epoch.
    _assert_close(best["state_dict"], _by_hand(raw.states[: best["global_step"]]))

    # The last validation ran on the averaged weights and BatchNorm statistics.
    averaged = Tiny()
    averaged.load_state_dict(last["state_dict"])
    x, y = averaged.val_dataloader().dataset.tensors
    with torch.no_grad():
        want = nn.functional.mse_loss(averaged.eval()(x), y)
    torch.testing.assert_close(trainer.callback_metrics["val/loss"], want)
    # After fit the module holds the average too (Lightning copies it in at the end of training).
    _assert_equal(model.state_dict(), averaged.state_dict())


def test_a_resumed_fit_ends_with_the_weights_of_an_uninterrupted_one(tmp_path):
    _fit(tmp_path / "straight", epochs=2)
    _fit(tmp_path / "resumed", epochs=1)
    _, _, raw, _ = _fit(tmp_path / "resumed", epochs=2, ckpt_path=tmp_path / "resumed" / "last.ckpt")
    assert len(raw.states) == STEPS_PER_EPOCH  # the second epoch only: it continued, not restarted

    straight, resumed = _load(tmp_path / "straight" / "last.ckpt"), _load(tmp_path / "resumed" / "last.ckpt")
    for key in ("state_dict", "current_model_state", "averaging_state"):
        _assert_equal(resumed[key], straight[key])  # exact: the same float operations in the same order
    assert int(resumed["averaging_state"]["n_averaged"]) == 2 * STEPS_PER_EPOCH  # the warmup went on counting


def test_a_resumed_fit_from_a_checkpoint_without_ema_starts_the_average_there(tmp_path):
    """A run started without EMA and resumed with it: the average starts from the checkpoint's weights."""
    trainer = L.Trainer(max_epochs=1, accelerator="cpu", logger=False, enable_progress_bar=False,
                        enable_model_summary=False, num_sanity_val_steps=0, plugins=[AtomicCheckpointIO()],
                        callbacks=[ModelCheckpoint(dirpath=tmp_path, save_last=True, save_top_k=0)])  # fmt: skip
    trainer.fit(Tiny())
    start = _load(tmp_path / "last.ckpt")["state_dict"]
    _, _, raw, _ = _fit(tmp_path / "ema", epochs=2, ckpt_path=tmp_path / "last.ckpt")
    _assert_close(_load(tmp_path / "ema" / "last.ckpt")["state_dict"], _by_hand(raw.states))
    assert not torch.equal(raw.states[0]["layer.weight"], start["layer.weight"])  # it trained on from there
