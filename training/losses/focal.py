"""Binary focal loss (Lin et al. 2017) applied independently to every label."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from training.losses.base import MultiLabelLoss


class FocalLoss(MultiLabelLoss):
    """Per-label sigmoid focal loss: ``FL = -alpha_t * (1 - p_t) ** gamma * log(p_t)``.

    Why: the easy negatives of a rare finding dominate the BCE gradient; ``(1 - p_t) ** gamma`` shrinks entries the
    model already gets right. Unlike ASL it treats positives and negatives symmetrically. ``p_t = exp(-BCE)`` keeps
    logits of +-50 finite. ``alpha_t`` follows Lin et al. and ``torchvision.ops.sigmoid_focal_loss``; ``gamma = 0``
    with ``alpha = None`` is BCE.

    Args:
        alpha: weight of positive entries (negatives get ``1 - alpha``), or ``None``. Lin et al.'s 0.25 was tuned
            with gamma for dense detection, so it is off by default here.
    """

    def __init__(self, gamma: float = 2.0, alpha: float | None = None, reduction: str = "mean"):
        super().__init__()
        if gamma < 0:
            raise ValueError(f"gamma must be >= 0, got {gamma}")
        if alpha is not None and not 0.0 <= alpha <= 1.0:
            raise ValueError(f"alpha must be in [0, 1] or null, got {alpha}")
        self.gamma = float(gamma)
        self.alpha = alpha
        self.reduction = reduction

    def forward(self, logits, targets, mask=None):
        logits = logits.float()  # (B, C); focal weights in fp16 underflow, so always work in fp32
        y = targets.to(logits.dtype)  # (B, C) in {0, 1}
        bce = F.binary_cross_entropy_with_logits(logits, y, reduction="none")  # (B, C) = -log(p_t)
        loss = bce
        if self.gamma != 0:
            # 1 - p_t = 1 - exp(-bce) = -expm1(-bce): exact even when bce is tiny (confident correct entries).
            # Clamped away from 0 so a gamma < 1 cannot produce an infinite derivative at p_t == 1.
            one_minus_pt = (-torch.expm1(-bce)).clamp_min(1e-12)  # (B, C)
            loss = one_minus_pt.pow(self.gamma) * loss
        if self.alpha is not None:
            alpha_t = self.alpha * y + (1.0 - self.alpha) * (1.0 - y)  # (B, C)
            loss = alpha_t * loss
        return self.reduce(loss, mask, self.reduction)
