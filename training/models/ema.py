"""Exponential moving average (EMA) of the weights, for validation, the kept checkpoint and the test.

A configuration of Lightning's :class:`~lightning.pytorch.callbacks.WeightAveraging` (``configs/ema/ema.yaml``).
After every optimizer step the callback folds the trained weights into an average held beside the model. What
each phase sees, and why it is enough for the rest of the platform:

- **Validation** runs on the average: Lightning swaps the averaged values into the module for the validation
  epoch and swaps the trained ones back afterwards, so ``val/*`` and the checkpoint selection judge the average.
- **Checkpoints** (``best.ckpt`` and ``last.ckpt``) hold the average under ``state_dict``, so whatever loads a
  checkpoint's ``state_dict`` (the test phase in training/pipeline.py, ``make evaluate``, registration and serving)
  gets the averaged weights without knowing about EMA. The trained weights go to ``current_model_state`` and the
  averaging counter to ``averaging_state``.
- **Resume** from ``last.ckpt`` restores all three (trained weights, average, counter), so an interrupted run
  ends with the weights of an uninterrupted one; the decay warmup below counts averaged steps, which are saved.

Buffers are averaged too (``use_buffers=True``), not copied. The BatchNorm running statistics of the trained
model describe the activations of the *trained* weights over the last few batches; the averaged weights give
other activations, and averaging the statistics over the same horizon as the weights matches them better (timm's
``ModelEmaV3`` does the same). The exact answer, re-estimating them with a pass over the training set
(``torch.optim.swa_utils.update_bn``), costs an epoch of forward passes and is not done. Buffers that do not
change during training (``train_counts``, ``logit_temperature``) stay bit-exact: the update is a ``lerp``, which
returns the value itself when both sides agree. Integer buffers (BatchNorm's ``num_batches_tracked``) are copied.

Decay warmup: a fixed decay of 0.998 keeps about 1/(1-0.998) = 500 steps in the average, so a short run (a smoke
run has 10 steps) would be mostly its random initialisation. As in YOLOv5's ``ModelEMA``, the decay after ``n``
updates is ``decay * (1 - exp(-n / warmup_steps))``: close to 0 at first (the average follows the model), close to
``decay`` after a few times ``warmup_steps``.
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
        warmup_steps: the time constant of the warmup in steps; 0 for none.
        use_buffers: average the buffers (BatchNorm statistics) too; ``False`` copies the trained model's.
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

        Lightning copies the module in the callback's ``setup``, before the module's own ``setup`` sets the label
        statistics and the initial head bias; a validation before the first update (a sanity check) would see that
        stale copy. The first update overwrites the average anyway; on resume the counter is above 0 and the
        restored average is kept.
        """
        if self._average_model is not None and int(self._average_model.n_averaged) == 0:
            self._average_model.module.load_state_dict(pl_module.state_dict())
