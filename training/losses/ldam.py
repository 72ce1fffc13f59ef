"""LDAM loss with Deferred Re-Weighting (Cao et al. 2019, kaidic/LDAM-DRW), adapted to multi-label data."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from training.losses.base import MultiLabelLoss
from training.losses.weights import clamp_counts, effective_number_weights, require_counts
from training.models.schedule import epoch_at_fraction


class LDAMLoss(MultiLabelLoss):
    """Label-distribution-aware margins per label, plus class-balanced weights switched on late (DRW).

    The per-label binary adaptation of the single-label reference, why negatives get margins but no DRW weight, and
    why ``s = 30`` suits a cosine head but multiplies a linear head's gradient by 30: docs/losses.md, "LDAM-DRW".

    Args:
        max_m: largest of all ``2C`` margins after normalisation (reference 0.5); margins are in logit units.
        s: logit scale applied to the margin-shifted logits (reference 30).
        drw_start: share of ``trainer.max_epochs`` trained before DRW starts (reference 0.8), so one setting serves
            runs of any length; ``None`` never re-weights.
        drw_epoch: an absolute 0-based DRW epoch instead; wins over ``drw_start``. Kept so that configs written
            before ``drw_start`` rebuild as they trained.
        negative_margins: also apply the negative-side margin ``m_neg``.
    """

    def __init__(
        self,
        max_m: float = 0.5,
        s: float = 30.0,
        drw_start: float | None = 0.8,
        drw_epoch: int | None = None,
        beta: float = 0.9999,
        negative_margins: bool = True,
        reduction: str = "mean",
    ):
        super().__init__()
        if max_m < 0:
            raise ValueError(f"max_m must be >= 0, got {max_m}")
        if s <= 0:
            raise ValueError(f"s must be > 0, got {s}")
        if drw_epoch is not None and int(drw_epoch) < 0:
            raise ValueError(f"drw_epoch must be a non-negative epoch or null, got {drw_epoch}")
        if drw_start is not None and not 0.0 <= drw_start <= 1.0:
            raise ValueError(f"drw_start must be a share of the run in [0, 1] or null, got {drw_start}")
        self.max_m = float(max_m)
        self.s = float(s)
        self.drw_epoch = None if drw_epoch is None else int(drw_epoch)
        self.drw_start = None if drw_start is None else float(drw_start)
        self.beta = float(beta)
        self.negative_margins = negative_margins
        self.reduction = reduction
        self.epoch = 0
        self.max_epochs: int | None = None

    def on_epoch_start(self, epoch: int, max_epochs: int | None = None) -> None:
        """Record the 0-based epoch and the run's length; DRW weights apply from :attr:`drw_first_epoch` on."""
        self.epoch = int(epoch)
        self.max_epochs = None if max_epochs is None else int(max_epochs)

    @property
    def drw_first_epoch(self) -> int | None:
        """The first DRW epoch: ``drw_epoch`` when set, else ``drw_start`` of the run's ``max_epochs``.

        Before any epoch has started (a loss called outside a fit) the run's length is unknown: only a share of 0
        has then begun. Past epoch 0 a missing length is a wiring bug, reported rather than guessed.
        """
        if self.drw_epoch is not None or self.drw_start is None:
            return self.drw_epoch
        if self.max_epochs is None:
            if self.epoch == 0:
                return 0 if self.drw_start == 0 else None
            raise RuntimeError(
                "LDAMLoss(drw_start=...) needs the run's length: the LightningModule must call "
                "loss.on_epoch_start(epoch, trainer.max_epochs) at each epoch start"
            )
        return epoch_at_fraction(self.drw_start, self.max_epochs)

    @property
    def drw_active(self) -> bool:
        first = self.drw_first_epoch
        return first is not None and self.epoch >= first

    def margins(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-class margins ``(m_pos (C,), m_neg (C,))``, the largest of all equal to ``max_m``."""
        counts, n_samples = require_counts(self)
        n_pos = clamp_counts(counts)  # (C,)
        n_neg = clamp_counts(n_samples - counts.float())  # (C,)
        m_pos = n_pos.pow(-0.25)  # (C,)
        m_neg = n_neg.pow(-0.25) if self.negative_margins else torch.zeros_like(m_pos)  # (C,)
        scale = self.max_m / torch.maximum(m_pos.max(), m_neg.max())
        return m_pos * scale, m_neg * scale

    def class_weights(self) -> torch.Tensor:
        """DRW weights ``(C,)`` for positive entries: all ones before the DRW epoch, effective-number after."""
        counts, _ = require_counts(self)
        if not self.drw_active:
            return torch.ones_like(counts, dtype=torch.float32)
        return effective_number_weights(counts, self.beta)

    def forward(self, logits, targets, mask=None):
        x = logits.float()  # (B, C)
        y = targets.to(x.dtype)  # (B, C) in {0, 1}
        m_pos, m_neg = (m.to(x.device) for m in self.margins())  # (C,), (C,)
        shifted = torch.where(y > 0.5, x - m_pos, x + m_neg)  # (B, C): margin against the true side
        per_entry = F.binary_cross_entropy_with_logits(self.s * shifted, y, reduction="none")  # (B, C)
        w_pos = self.class_weights().to(x.device)  # (C,)
        weight = y * w_pos + (1.0 - y)  # (B, C): positives w_c, negatives 1
        return self.reduce(weight * per_entry, mask, self.reduction)
