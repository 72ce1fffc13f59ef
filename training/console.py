"""What a training prints: the run's own progress and results, not the framework's advertisements.

Lightning's accelerator announcements, cloud adverts, a model table whose FLOPs are always 0 here and ``v_num``
help no one reading the terminal; the run's summary at the end does. Written to a file (``nohup``, a cluster job's
log) Lightning's rich bar shows nothing until the fit ends, so there each epoch is one line (:class:`EpochLines`),
plus a line whenever a minute passed without one: a log silent for hours cannot be told from a hung job.
"""

from __future__ import annotations

import datetime
import logging
import sys
import time
import warnings

from lightning.pytorch.callbacks import ModelSummary, ProgressBar, RichProgressBar
from lightning.pytorch.utilities.model_summary import get_human_readable_count

log = logging.getLogger(__name__)

#: Lightning info lines that carry nothing for this platform's users.
NOISE = (
    "GPU available:",
    "TPU available:",
    "💡 Tip:",
    "Trainer already configured with model summary",
    "Loading `train_dataloader` to estimate",
)


class _DropNoise(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.getMessage()).startswith(NOISE)


#: Loggers to which Lightning's packages attach a console handler of their own when imported: ``lightning`` always
#: (``INFO: ...`` on stderr, still propagating to the root), its subpackages when the root had no handler yet.
LIGHTNING_LOGGERS = ("lightning", "lightning.pytorch", "lightning.fabric")


def quiet_lightning() -> None:
    """Filter Lightning's noise lines and its pytree deprecation warning, and print each of its lines once
    (idempotent; call it before Lightning logs anything, e.g. ``Seed set to 42``).

    Once Hydra's handler is on the root logger, Lightning's own handlers repeat every line, so they are removed;
    without a root handler they stay, being then the only way its lines reach the terminal.
    """
    logger = logging.getLogger("lightning.pytorch.utilities.rank_zero")
    if not any(isinstance(f, _DropNoise) for f in logger.filters):
        logger.addFilter(_DropNoise())
    warnings.filterwarnings("ignore", message=r".*isinstance\(treespec, LeafSpec\)` is deprecated")
    if logging.getLogger().handlers:
        for name in LIGHTNING_LOGGERS:
            package = logging.getLogger(name)
            for handler in [h for h in package.handlers if type(h) is logging.StreamHandler]:
                package.removeHandler(handler)
            package.propagate = True


class CompactSummary(ModelSummary):
    """One line instead of Lightning's model table: the sizes that matter, no FLOPs column of zeros."""

    @staticmethod
    def summarize(summary_data, total_parameters: int, trainable_parameters: int, model_size: float, *args, **kwargs):
        log.info("model: %s parameters (%s trainable), %.1f MB", get_human_readable_count(int(total_parameters)),
                 get_human_readable_count(int(trainable_parameters)), model_size)  # fmt: skip


class QuietProgressBar(RichProgressBar):
    """Lightning's rich progress bar without ``v_num`` (the MLflow run id, printed once at the end instead)."""

    def get_metrics(self, trainer, pl_module):
        items = super().get_metrics(trainer, pl_module)
        items.pop("v_num", None)
        return items


def epoch_line(epoch: int, max_epochs: int | None, steps_per_s: float, metrics: dict, monitor: str,
               eta_s: float | None) -> str:  # fmt: skip
    """``epoch 2/7: 11.8 step/s, train/loss 0.2417, val/mAP 0.0781, ETA 0:05:12``: the epoch counted from 0 out
    of the last one, as the MLflow step and ``best epoch`` of the summary count it; ``-`` for what is not known
    (no validation that epoch, no epoch limit)."""

    def value(key: str) -> str:
        return f"{float(metrics[key]):.4f}" if key in metrics else "-"

    last = f"/{max_epochs - 1}" if max_epochs and max_epochs > 0 else ""
    eta = str(datetime.timedelta(seconds=round(eta_s))) if eta_s is not None else "-"
    return (f"epoch {epoch}{last}: {steps_per_s:.1f} step/s, train/loss {value('train/loss')}, "
            f"{monitor} {value(monitor)}, ETA {eta}")  # fmt: skip


def step_line(epoch: int, max_epochs: int | None, step: int, steps: float, steps_per_s: float) -> str:
    """``epoch 0/6, step 120/1117: 2.0 step/s, epoch ETA 0:08:18``: where an epoch stands, between its epoch lines."""
    last = f"/{max_epochs - 1}" if max_epochs and max_epochs > 0 else ""
    known = steps != float("inf") and steps_per_s > 0
    total = f"/{int(steps)}" if steps != float("inf") else ""
    eta = str(datetime.timedelta(seconds=round((steps - step) / steps_per_s))) if known else "-"
    rate = f"{steps_per_s:.1f}" if steps_per_s >= 1 else f"{steps_per_s:.3f}"  # a slow large-image epoch: 0.040
    return f"epoch {epoch}{last}, step {step}{total}: {rate} step/s, epoch ETA {eta}"


class EpochLines(ProgressBar):
    """One log line per finished epoch (:func:`epoch_line`), for output that is not a terminal.

    Written once the epoch is wholly done, its training loss and checkpoint included: at the start of the next epoch
    or when the fit ends. The ETA (mean epoch time times epochs left) is an upper bound when early stopping ends
    the fit sooner.
    """

    clock = staticmethod(time.monotonic)

    def __init__(self, monitor: str, interval_s: float = 60.0):
        super().__init__()
        self.monitor = monitor
        self.interval_s = interval_s  # the longest a log stays silent during an epoch
        self._last_line = 0.0
        self.enabled = True
        self._fit_started = self._epoch_started = self._train_seconds = 0.0
        self._epochs = self._steps_at_start = self._steps = 0
        self._pending: int | None = None  # the finished epoch whose line is not written yet

    def disable(self) -> None:
        self.enabled = False

    def enable(self) -> None:
        self.enabled = True

    def on_train_start(self, trainer, pl_module) -> None:
        self._fit_started, self._epochs = self.clock(), 0

    def on_train_epoch_start(self, trainer, pl_module) -> None:
        self._write(trainer)
        self._epoch_started, self._steps_at_start, self._train_seconds = self.clock(), trainer.global_step, 0.0
        self._last_line = self._epoch_started

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        now = self.clock()
        if not self.enabled or now - self._last_line < self.interval_s:
            return
        self._last_line = now
        rate = (batch_idx + 1) / (now - self._epoch_started)
        log.info("%s", step_line(trainer.current_epoch, trainer.max_epochs, batch_idx + 1,
                                 trainer.num_training_batches, rate))  # fmt: skip

    def on_validation_start(self, trainer, pl_module) -> None:
        if not trainer.sanity_checking:  # the epoch's training part ends here
            self._train_seconds = self.clock() - self._epoch_started

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        self._pending = trainer.current_epoch
        self._train_seconds = self._train_seconds or self.clock() - self._epoch_started
        self._steps = trainer.global_step - self._steps_at_start

    def on_train_end(self, trainer, pl_module) -> None:
        self._write(trainer)

    def _write(self, trainer) -> None:
        if self._pending is None:
            return
        epoch, self._pending = self._pending, None
        self._epochs += 1
        if not self.enabled:
            return
        per_epoch = (self.clock() - self._fit_started) / self._epochs
        left = trainer.max_epochs - 1 - epoch if trainer.max_epochs and trainer.max_epochs > 0 else None
        rate = self._steps / self._train_seconds if self._train_seconds > 0 else 0.0
        metrics = trainer.callback_metrics
        log.info("%s", epoch_line(epoch, trainer.max_epochs, rate, metrics, self.monitor,
                                  per_epoch * left if left is not None else None))  # fmt: skip


def console_callbacks(progress_bar: bool, monitor: str, terminal: bool | None = None) -> list:
    """The callbacks that replace Lightning's defaults: the rich bar on a terminal, one line per epoch elsewhere
    (``terminal`` None: whether stdout is one), nothing when the trainer shows no progress."""
    terminal = sys.stdout.isatty() if terminal is None else terminal
    bar = QuietProgressBar() if terminal else EpochLines(monitor)
    return [CompactSummary(), *([bar] if progress_bar else [])]
