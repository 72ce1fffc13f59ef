"""LDAM loss with Deferred Re-Weighting (Cao et al. 2019, kaidic/LDAM-DRW), adapted to multi-label data."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from training.losses.base import MultiLabelLoss
from training.losses.weights import clamp_counts, effective_number_weights, require_counts
from training.models.schedule import epoch_at_fraction


class LDAMLoss(MultiLabelLoss):
    """Label-distribution-aware margins per label, plus class-balanced weights switched on late (DRW).

    Why: LDAM's generalisation bound says a class seen ``n`` times should be separated by a margin
    proportional to ``n ** (-1/4)``: rare classes get larger margins, so the decision boundary is pushed away
    from their few training examples instead of hugging them. DRW keeps the loss unweighted while features are
    learned, then switches to class-balanced weights for the final epochs; re-weighting from the start hurts
    representation learning (Cao et al., section 3.2).

    **Multi-label adaptation.** The reference is single-label softmax CE on ``s * (z - m_y * onehot(y))``. Here
    every label ``c`` is its own two-way problem, "positive" (``n_pos_c`` = training count) against "negative"
    (``n_neg_c = N - n_pos_c``). For two classes with logits ``(z_neg, z_pos)`` the softmax equals a sigmoid of
    ``x = z_pos - z_neg``, and subtracting the LDAM margin from the true-class logit becomes:

    - positive entry: ``x - m_pos_c`` with ``m_pos_c`` proportional to ``n_pos_c ** (-1/4)``;
    - negative entry: ``x + m_neg_c`` with ``m_neg_c`` proportional to ``n_neg_c ** (-1/4)`` (the margin is
      toward the negative side: a negative must score below ``-m_neg_c`` to reach the same loss).

    Both sets share one scale so that the largest of all ``2C`` margins equals ``max_m`` (the reference
    normalises by the largest margin). Positives of rare findings therefore get the largest margins; the
    negatives of a rare finding (``n_neg ~ N``) get a small one. With ``negative_margins=False`` negatives get
    no margin and only the positive margins are normalised. The loss per entry is then
    ``BCE_with_logits(s * (x -/+ m), y)``, the exact binary counterpart of the reference's
    ``cross_entropy(s * output, target)``.

    **The scale ``s``.** The reference multiplies every (margin-shifted) logit by ``s = 30``, but its LDAM runs
    use a cosine classifier (``NormedLinear``, logits in ``[-1, 1]``), so ``s`` sets the softmax temperature of
    bounded logits. The platform's heads are plain linear layers with unbounded logits: ``s`` still multiplies
    ``x -/+ m`` exactly as in the reference, but it then also multiplies the gradient by ``s`` (an effective
    learning-rate factor of 30 on the head) and makes the sigmoid saturate at small ``|x|``. Use a normalised
    head with ``s = 30``, or lower ``s`` (and/or the learning rate) with a linear head. Margins are in logit
    units either way, so ``max_m = 0.5`` is large relative to cosine logits and small relative to raw ones.

    **DRW.** Before the DRW epoch (0-based, as passed to :meth:`on_epoch_start`) no weights; from it on,
    each positive entry of class ``c`` is weighted by ``w_c = (1 - beta) / (1 - beta ** n_pos_c)``, normalised
    to sum to ``C`` (kaidic/LDAM-DRW ``cifar_train.py``). Negative entries keep weight 1: in the reference a
    class weight multiplies the loss of the samples *of* that class, and the multi-label analogue of "a sample
    of class c" is a positive entry of label c. Negatives are the majority side of every label; giving them
    effective-number weights from their large counts would mostly shrink all negatives relative to positives,
    a change the reference never makes. The reduction does not divide by the sum of weights (the reference's weighted
    ``cross_entropy`` does, per batch); with weights of mean 1 the scale stays comparable.

    Zero-count classes: ``n_pos`` and ``n_neg`` are clamped to ``>= 1`` (finite, largest margin).

    Args:
        max_m: largest margin after normalisation (reference 0.5).
        s: logit scale applied to the margin-shifted logits (reference 30; see above for linear heads).
        drw_start: share of ``trainer.max_epochs`` trained before DRW starts (reference: epoch 160 of 200, 0.8);
            the epoch is :func:`training.models.schedule.epoch_at_fraction` of the run's own ``max_epochs``, so
            one setting serves a 20-epoch run (epoch 16), the default 8 (epoch 6) and a smoke run. ``None``
            never re-weights.
        drw_epoch: an absolute 0-based DRW epoch instead (``0`` re-weights from the start); when set it wins
            over ``drw_start``. Kept so that configs written before ``drw_start`` (finished runs) rebuild as
            they trained.
        beta: effective-number parameter of the DRW weights (reference 0.9999).
        negative_margins: also apply the negative-side margin ``m_neg`` (see above).
        reduction: see :meth:`MultiLabelLoss.reduce`; ``mean`` over labelled entries (the reference CE is a
            per-sample mean).
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
