"""Exponential moving average (EMA) of the weights, for validation, the kept checkpoint and the test.

A configuration of Lightning's :class:`~lightning.pytorch.callbacks.WeightAveraging`. Validation runs on the
average, and checkpoints hold it under ``state_dict``, so everything that loads a checkpoint gets the averaged
weights without knowing about EMA; resume restores trained weights, average and counter alike.

Buffers are averaged too, not copied: BatchNorm statistics of the trained weights do not describe the averaged
ones, and averaging them over the same horizon matches better (timm's ``ModelEmaV3``; the exact ``update_bn``
costs an epoch). Constant buffers stay bit-exact (``lerp`` of equal values). Decay warmup as YOLOv5's
``ModelEMA``, ``decay * (1 - exp(-n / warmup_steps))``, so a short run is not mostly its random initialisation.
"""

from __future__ import annotations

import math
from functools import partial

import lightning.pytorch as L
import torch
from lightning.pytorch.callbacks import WeightAveraging
from torch.optim.swa_utils import get_ema_multi_avg_fn


def ema_decay(decay: float, warmup_steps: float, updates: int) -> float:
    """The decay applied at the update after ``updates`` averaged steps."""
    return decay * (1.0 - math.exp(-updates / warmup_steps)) if warmup_steps > 0 else decay


@torch.no_grad()
def ema_update(averaged: list[torch.Tensor], current: list[torch.Tensor], n_averaged: torch.Tensor, *,
               decay: float, warmup_steps: float) -> None:  # fmt: skip
    """``AveragedModel``'s ``multi_avg_fn``: one call per device and dtype group, so one dtype per call."""
    if not torch.is_floating_point(averaged[0]):  # counters, not weights
        for average, value in zip(averaged, current, strict=True):
            average.copy_(value)
        return
    get_ema_multi_avg_fn(ema_decay(decay, warmup_steps, int(n_averaged)))(averaged, current, n_averaged)


class EMA(WeightAveraging):
    """EMA of the weights with a decay warmup; every optimizer step is averaged.

    Args:
        decay: the decay once warmed up; the average keeps about ``1 / (1 - decay)`` steps.
        device: where the average lives (``"cpu"`` saves accelerator memory); the model's device by default.
    """

    def __init__(self, decay: float = 0.998, warmup_steps: float = 100, use_buffers: bool = True,
                 device: str | None = None) -> None:  # fmt: skip
        if not 0.0 <= decay <= 1.0:
            raise ValueError(f"decay must be in [0, 1], got {decay}")
        self.decay, self.warmup_steps = decay, warmup_steps
        super().__init__(device=device, use_buffers=use_buffers,
                         multi_avg_fn=partial(ema_update, decay=decay, warmup_steps=warmup_steps))  # fmt: skip

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Start the average from the model as the fit starts, not as it was when the callback's ``setup`` ran.

        Lightning copies the module before the module's ``setup`` sets the label statistics and head bias, so a sanity
        validation would see a stale copy. On resume the restored average is kept.
        """
        if self._average_model is not None and int(self._average_model.n_averaged) == 0:
            self._average_model.module.load_state_dict(pl_module.state_dict())
