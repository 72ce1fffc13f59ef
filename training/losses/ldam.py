"""LDAM loss with Deferred Re-Weighting (Cao et al. 2019, kaidic/LDAM-DRW), adapted to multi-label data."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from training.losses.base import MultiLabelLoss
from training.losses.weights import clamp_counts, effective_number_weights, require_counts


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

    **DRW.** Before epoch ``drw_epoch`` (0-based, as passed to :meth:`on_epoch_start`) no weights; from it on,
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
        drw_epoch: first 0-based epoch with DRW weights; ``0`` re-weights from the start, ``None`` never. The
            reference switches at epoch 160 of 200; the default 6 is the same fraction of the platform's default
            ``trainer.max_epochs`` (8). It is an absolute epoch, so scale it with ``max_epochs``.
        beta: effective-number parameter of the DRW weights (reference 0.9999).
        negative_margins: also apply the negative-side margin ``m_neg`` (see above).
        reduction: see :meth:`MultiLabelLoss.reduce`; ``mean`` over labelled entries (the reference CE is a
            per-sample mean).
    """

    def __init__(
        self,
        max_m: float = 0.5,
        s: float = 30.0,
        drw_epoch: int | None = 6,
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
        self.max_m = float(max_m)
        self.s = float(s)
        self.drw_epoch = None if drw_epoch is None else int(drw_epoch)
        self.beta = float(beta)
        self.negative_margins = negative_margins
        self.reduction = reduction
        self.epoch = 0

    def on_epoch_start(self, epoch: int) -> None:
        """Record the 0-based epoch; DRW weights apply once ``epoch >= drw_epoch``."""
        self.epoch = int(epoch)

    @property
    def drw_active(self) -> bool:
        return self.drw_epoch is not None and self.epoch >= self.drw_epoch

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
        """DRW weights ``(C,)`` for positive entries: all ones before ``drw_epoch``, effective-number after."""
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
