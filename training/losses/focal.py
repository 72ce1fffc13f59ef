"""Binary focal loss (Lin et al. 2017) applied independently to every label."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from training.losses.base import MultiLabelLoss


class FocalLoss(MultiLabelLoss):
    """Per-label sigmoid focal loss: ``FL = -alpha_t * (1 - p_t) ** gamma * log(p_t)``.

    Why: in a long-tailed multi-label problem the overwhelming majority of entries are easy negatives (a rare
    finding is absent from almost every image). Their many small BCE terms dominate the gradient. The factor
    ``(1 - p_t) ** gamma`` shrinks the contribution of entries the model already gets right, so the gradient is
    spent on hard and rare entries. Unlike ASL it treats positives and negatives symmetrically.

    ``p_t`` is ``sigmoid(x)`` for a positive and ``1 - sigmoid(x)`` for a negative; it is computed as
    ``exp(-BCE)`` from the numerically stable BCE-with-logits, so logits of +-50 stay finite. ``alpha_t`` is
    ``alpha`` for positives and ``1 - alpha`` for negatives (Lin et al.; the same convention as
    ``torchvision.ops.sigmoid_focal_loss``). With ``gamma = 0`` and ``alpha = None`` the loss equals BCE.

    Args:
        gamma: focusing exponent (2 in Lin et al.). 0 disables focusing.
        alpha: weight of positive entries in ``[0, 1]`` (negatives get ``1 - alpha``), or ``None`` for no
            weighting. Lin et al. use 0.25 for dense detection, where it was tuned together with gamma; for
            multi-label classification it is off by default.
        reduction: see :meth:`MultiLabelLoss.reduce`; ``mean`` over labelled entries like the BCE default.
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
