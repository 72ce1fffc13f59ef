"""The contract every multi-label loss follows, so the LightningModule never needs to know which one it holds."""

from __future__ import annotations

import torch
from torch import nn


class MultiLabelLoss(nn.Module):
    """Base class for losses over ``(B, C)`` logits and binary targets.

    Class counts are never typed by hand: the LightningModule calls :meth:`set_class_counts` with the training
    manifest's counts before the first step. ``mask`` marks labelled entries; an empty manifest cell must contribute
    nothing, not count as a negative.
    """

    def set_class_counts(self, class_counts: torch.Tensor, n_samples: int) -> None:
        """Receive per-class positive counts ``(C,)`` and the number of training images."""
        self.register_buffer("class_counts", class_counts.detach().float().clone(), persistent=False)
        self.n_samples = int(n_samples)

    def on_epoch_start(self, epoch: int, max_epochs: int | None = None) -> None:
        """Hook for losses whose weighting depends on the epoch (deferred re-weighting).

        ``max_epochs`` lets a schedule be a share of the run (:func:`training.models.schedule.epoch_at_fraction`).
        """

    def init_bias(self) -> torch.Tensor | None:
        """Optional classifier-bias initialisation ``(C,)`` the loss wants (DB's class-prior init)."""
        return None

    def forward(
        self, logits: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor | None = None
    ) -> torch.Tensor:  # pragma: no cover - abstract
        raise NotImplementedError

    @staticmethod
    def reduce(elementwise: torch.Tensor, mask: torch.Tensor | None, reduction: str) -> torch.Tensor:
        """Reduce a ``(B, C)`` loss over the labelled entries only.

        ``reduction``: ``mean`` (over labelled entries), ``sum``, or ``batch_mean`` (sum over classes, mean over images,
        independent of batch size).
        """
        if mask is not None:
            elementwise = elementwise * mask.to(elementwise.dtype)
            n_labelled = mask.sum().clamp_min(1)
        else:
            n_labelled = torch.tensor(elementwise.numel(), device=elementwise.device)
        reducers = {
            "mean": lambda e: e.sum() / n_labelled,
            "sum": lambda e: e.sum(),
            "batch_mean": lambda e: e.sum() / e.shape[0],
        }
        if reduction not in reducers:
            raise ValueError(f"unknown reduction {reduction!r}; choose one of {sorted(reducers)}")
        return reducers[reduction](elementwise)
