"""What a training prints: the run's own progress and results, not the framework's advertisements.

Lightning announces GPU/TPU availability on every start, advertises its cloud products, prints a model table
whose FLOPs column is always 0 here (FLOPs are only counted on a meta-device pass the trainer never makes) and
shows the logger's version, an MLflow run id, as ``v_num`` in the progress bar. None of it helps a user reading
the terminal; the run's summary at the end (``training.pipeline``) does.
"""

from __future__ import annotations

import logging
import warnings

from lightning.pytorch.callbacks import ModelSummary, RichProgressBar
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


def quiet_lightning() -> None:
    """Filter Lightning's noise lines and its pytree deprecation warning (idempotent)."""
    logger = logging.getLogger("lightning.pytorch.utilities.rank_zero")
    if not any(isinstance(f, _DropNoise) for f in logger.filters):
        logger.addFilter(_DropNoise())
    warnings.filterwarnings("ignore", message=r".*isinstance\(treespec, LeafSpec\)` is deprecated")


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


def console_callbacks(progress_bar: bool) -> list:
    """The callbacks that replace Lightning's defaults (a progress bar only when the trainer shows one)."""
    return [CompactSummary(), *([QuietProgressBar()] if progress_bar else [])]
