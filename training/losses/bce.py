"""Binary cross-entropy, the default and the rung every other loss is checked against."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from training.losses.base import MultiLabelLoss


class BCELoss(MultiLabelLoss):
    """Per-label binary cross-entropy with an optional positive weight.

    Args:
        pos_weight: ``None`` (plain BCE), a number applied to every class, or ``"auto"``: ``n_neg / n_pos`` per class
            from the training counts, clipped at ``max_pos_weight`` so a class with two positives cannot dominate.
        max_pos_weight: upper clip for the automatic weights.
        reduction: see :meth:`MultiLabelLoss.reduce`.
    """

    def __init__(self, pos_weight: float | str | None = None, max_pos_weight: float = 100.0, reduction: str = "mean"):
        super().__init__()
        if isinstance(pos_weight, str) and pos_weight != "auto":
            raise ValueError(f"loss.pos_weight must be a number, null or 'auto', got {pos_weight!r}")
        self.pos_weight_spec = pos_weight
        self.max_pos_weight = max_pos_weight
        self.reduction = reduction

    def _pos_weight(self, logits: torch.Tensor) -> torch.Tensor | None:
        if self.pos_weight_spec is None:
            return None
        if self.pos_weight_spec == "auto":
            counts = self.class_counts.to(logits.device)
            neg = self.n_samples - counts
            return (neg / counts.clamp_min(1)).clamp(max=self.max_pos_weight)
        return torch.full((logits.shape[1],), float(self.pos_weight_spec), device=logits.device)

    def forward(self, logits, targets, mask=None):
        per_entry = F.binary_cross_entropy_with_logits(
            logits, targets.to(logits.dtype), pos_weight=self._pos_weight(logits), reduction="none"
        )  # (B, C)
        return self.reduce(per_entry, mask, self.reduction)
