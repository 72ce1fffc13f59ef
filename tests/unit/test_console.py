"""The terminal of a training: the framework's noise filtered, the run's summary complete."""

from __future__ import annotations

import logging

import lightning.pytorch as L
import torch

from evaluation.intervals import CI_RULE
from evaluation.report import summary_lines
from training.console import (
    CompactSummary,
    EpochLines,
    QuietProgressBar,
    console_callbacks,
    epoch_line,
    quiet_lightning,
    step_line,
)


def test_lightning_noise_is_dropped_and_everything_else_kept(caplog):
    quiet_lightning()
    logger = logging.getLogger("lightning.pytorch.utilities.rank_zero")
    with caplog.at_level(logging.INFO, logger="lightning.pytorch.utilities.rank_zero"):
        for message in ("GPU available: False, used: False", "TPU available: False, using: 0 TPU cores",
                        "💡 Tip: For seamless cloud logging ...", "Seed set to 42", "`Trainer.fit` stopped"):  # fmt: skip
            logger.info(message)
    assert [r.getMessage() for r in caplog.records] == ["Seed set to 42", "`Trainer.fit` stopped"]


def test_progress_bar_hides_the_run_id(monkeypatch):
    monkeypatch.setattr("lightning.pytorch.callbacks.RichProgressBar.get_metrics",
                        lambda self, trainer, module: {"loss": 0.3, "v_num": "163f12ce"})  # fmt: skip
    assert QuietProgressBar().get_metrics(None, None) == {"loss": 0.3}


def test_summary_has_headline_groups_tta_perturbed_and_unseen():
    metrics = {"test/mAP": 0.258, "test/mAP_ci_low": 0.251, "test/mAP_ci_high": 0.283, "test/mAUROC": 0.774,
               "test/mF1": 0.2, "test/mECE": 0.05, "test/prevalence_baseline_mAP": 0.062,
               "test/group/common/mAP": 0.613, "test/group/rare/mAP": 0.027, "test_tta/mAP": 0.25,
               "test_perturbed/mAP": 0.102, "test_perturbed/delta/mAP": -0.156}  # fmt: skip
    unseen = {"test_unseen/mAP": 0.11, "test_unseen/mAP_ci_low": 0.09, "test_unseen/mAP_ci_high": 0.13,
              "test_unseen/mAUROC": 0.55}  # fmt: skip
    lines = summary_lines(metrics, unseen)
    assert lines[0] == ("test (ranking chain; lower mECE wins): mAP 0.258 [0.251, 0.283], mAUROC 0.774, mF1 0.200, "
                        "mECE 0.050, mPrecision -, mRecall - (prevalence baseline mAP 0.062)")  # fmt: skip
    assert lines[1:] == [CI_RULE, "mAP by group: common 0.613 / rare 0.027", "mAP with TTA: 0.250",
                         "mAP perturbed: 0.102 (-0.156)",
                         "unseen classes: mAP 0.110 [0.090, 0.130], mAUROC 0.550, mF1 -, mECE -, mPrecision -, "
                         "mRecall -"]  # fmt: skip


def _handlers_reached(name: str) -> list[logging.Handler]:
    """The handlers a record logged on ``name`` passes through, walking up until a logger stops propagation."""
    found, logger = [], logging.getLogger(name)
    while logger is not None:
        found += logger.handlers
        logger = logger.parent if logger.propagate else None
    return found


def test_each_lightning_line_reaches_the_root_handlers_only():
    """Lightning's packages add console handlers of their own on import (``INFO: Seed set to 42`` on stderr beside the
    root's ``Seed set to 42``; ``Experiment ... Creating it.`` twice): once logging is configured, one handler prints."""
    root = logging.getLogger()
    added = logging.StreamHandler()
    root.addHandler(added)  # what Hydra's job logging does before the training imports Lightning
    try:
        logging.getLogger("lightning").addHandler(logging.StreamHandler())  # as lightning/__init__.py does
        logging.getLogger("lightning.pytorch").addHandler(logging.StreamHandler())  # imported before Hydra's setup
        logging.getLogger("lightning.pytorch").propagate = False
        quiet_lightning()
        for name in ("lightning.fabric.utilities.seed", "lightning.pytorch.loggers.mlflow"):
            assert _handlers_reached(name) == root.handlers, name
    finally:
        root.removeHandler(added)


def test_progress_is_the_rich_bar_on_a_terminal_and_lines_elsewhere():
    assert [type(c) for c in console_callbacks(True, "val/mAP", terminal=True)] == [CompactSummary, QuietProgressBar]
    assert [type(c) for c in console_callbacks(True, "val/mAP", terminal=False)] == [CompactSummary, EpochLines]
    assert [type(c) for c in console_callbacks(False, "val/mAP", terminal=False)] == [CompactSummary]


def test_epoch_line_names_epoch_rate_loss_monitored_metric_and_eta():
    line = epoch_line(2, 8, 11.84, {"train/loss": torch.tensor(0.24171), "val/mAUROC": 0.61}, "val/mAUROC", 312.4)
    assert line == "epoch 2/7: 11.8 step/s, train/loss 0.2417, val/mAUROC 0.6100, ETA 0:05:12"
    assert epoch_line(0, -1, 3.0, {}, "val/mAP", None) == "epoch 0: 3.0 step/s, train/loss -, val/mAP -, ETA -"


class _Tiny(L.LightningModule):
    """Logs like the platform's module: ``train/loss`` in its own ``on_train_epoch_end``, after the callbacks'."""

    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(2, 1)
        self.losses: list[float] = []

    def training_step(self, batch, batch_idx):
        loss = self.layer(batch[0]).pow(2).mean()
        self.losses.append(float(loss.detach()))
        return loss

    def on_train_epoch_end(self):
        self.log("train/loss", sum(self.losses) / len(self.losses))
        self.losses.clear()

    def validation_step(self, batch, batch_idx):
        self.log("val/mAP", 0.5 + self.current_epoch / 10)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def test_epoch_lines_write_each_epoch_once_with_its_own_loss(caplog):
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.ones(8, 2)), batch_size=2)
    module, lines = _Tiny(), EpochLines("val/mAP")
    trainer = L.Trainer(max_epochs=3, callbacks=[lines], logger=False, enable_checkpointing=False,
                        enable_model_summary=False, num_sanity_val_steps=0, accelerator="cpu")  # fmt: skip
    losses = []
    module.on_train_epoch_end = lambda: (losses.append(sum(module.losses) / len(module.losses)),
                                         _Tiny.on_train_epoch_end(module))  # fmt: skip
    with caplog.at_level(logging.INFO, logger="training.console"):
        trainer.fit(module, data, data)
    written = [r.getMessage() for r in caplog.records if r.name == "training.console"]
    assert [line.split(":")[0] for line in written] == ["epoch 0/2", "epoch 1/2", "epoch 2/2"]
    for line, loss, val in zip(written, losses, (0.5, 0.6, 0.7), strict=True):
        assert f"train/loss {loss:.4f}, val/mAP {val:.4f}, ETA " in line and " step/s, " in line
    assert written[-1].endswith("ETA 0:00:00")


def test_a_line_within_the_epoch_whenever_the_interval_passed_without_one(caplog):
    """A fake clock that advances 25 s per reading: the epoch starts at 0 s and batch k ends at 25 k s, so with a
    60 s interval the lines come after batches 3 (75 s) and 6 (150 s) of 8, at 1 batch per 25 s."""
    readings = iter(range(0, 10_000, 25))
    lines = EpochLines("val/mAP", interval_s=60)
    lines.clock = lambda: float(next(readings))
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.ones(16, 2)), batch_size=2)
    trainer = L.Trainer(max_epochs=1, callbacks=[lines], logger=False, enable_checkpointing=False,
                        enable_model_summary=False, limit_val_batches=0, accelerator="cpu")  # fmt: skip
    with caplog.at_level(logging.INFO, logger="training.console"):
        trainer.fit(_Tiny(), data)
    steps = [r.getMessage() for r in caplog.records if r.getMessage().startswith("epoch 0/0, step")]
    assert steps == [
        "epoch 0/0, step 3/8: 0.040 step/s, epoch ETA 0:02:05",
        "epoch 0/0, step 6/8: 0.040 step/s, epoch ETA 0:00:50",
    ], steps


def test_step_line_names_the_step_the_rate_and_the_epochs_remaining_time():
    assert step_line(0, 7, 120, 1117, 2.0) == "epoch 0/6, step 120/1117: 2.0 step/s, epoch ETA 0:08:18"
    assert step_line(3, None, 5, float("inf"), 1.0) == "epoch 3, step 5: 1.0 step/s, epoch ETA -"
