"""Asymmetric Loss (Ridnik et al. 2021, Alibaba-MIIL/ASL) for multi-label classification."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from training.losses.base import MultiLabelLoss


class AsymmetricLoss(MultiLabelLoss):
    """Asymmetric focusing plus probability shifting for the positive/negative imbalance of multi-label data.

    With ``p = sigmoid(x)`` and the shifted negative probability ``p_m = max(p - clip, 0)``::

        loss = -(y * (1 - p) ** gamma_pos * log(p) + (1 - y) * p_m ** gamma_neg * log(1 - p_m))

    The negative weight grows with ``p`` on purpose (docs/losses.md, "Asymmetric loss"). The logs are the
    reference's ``eps``-clamped ones, evaluated without the float32 cancellation of ``1 - sigmoid(x)``.

    Args:
        gamma_pos: reference training script 0 (the reference class default is 1).
        clip: 0 or null disables shifting.
        disable_torch_grad_focal_loss: treat the focusing weights as constants (reference option).
        reduction: ``sum`` as the reference, so its learning rates carry over; see :meth:`MultiLabelLoss.reduce`.
    """

    def __init__(
        self,
        gamma_neg: float = 4.0,
        gamma_pos: float = 0.0,
        clip: float | None = 0.05,
        eps: float = 1e-8,
        disable_torch_grad_focal_loss: bool = False,
        reduction: str = "sum",
    ):
        super().__init__()
        if gamma_neg < 0 or gamma_pos < 0:
            raise ValueError(f"gamma_neg and gamma_pos must be >= 0, got {gamma_neg}, {gamma_pos}")
        if clip is not None and not 0.0 <= clip < 1.0:
            raise ValueError(f"clip must be in [0, 1) or null, got {clip}")
        self.gamma_neg = float(gamma_neg)
        self.gamma_pos = float(gamma_pos)
        self.clip = float(clip) if clip else 0.0
        self.eps = float(eps)
        self.disable_torch_grad_focal_loss = disable_torch_grad_focal_loss
        self.reduction = reduction

    def forward(self, logits, targets, mask=None):
        x = logits.float()  # (B, C)
        y = targets.to(x.dtype)  # (B, C) in {0, 1}
        log_eps = math.log(self.eps)

        # log(p), clamped like the reference's log(p.clamp(min=eps))
        log_p = F.logsigmoid(x).clamp_min(log_eps)  # (B, C)
        # 1 - p_m = min(1 - p + clip, 1); 1 - p is sigmoid(-x) computed without cancellation
        one_minus_p = torch.sigmoid(-x)  # (B, C)
        if self.clip > 0:
            log_one_minus_pm = torch.log((one_minus_p + self.clip).clamp(max=1.0).clamp_min(self.eps))  # (B, C)
        else:
            log_one_minus_pm = F.logsigmoid(-x).clamp_min(log_eps)  # (B, C)

        loss_pos = log_p  # (B, C), L+ before focusing
        loss_neg = log_one_minus_pm  # (B, C), L- before focusing
        if self.gamma_pos > 0 or self.gamma_neg > 0:
            with torch.set_grad_enabled(torch.is_grad_enabled() and not self.disable_torch_grad_focal_loss):
                p_m = (torch.sigmoid(x) - self.clip).clamp_min(0.0)  # (B, C) shifted probability
                w_pos = one_minus_p.pow(self.gamma_pos)  # (B, C) (1 - p) ** gamma_pos
                w_neg = p_m.pow(self.gamma_neg)  # (B, C) p_m ** gamma_neg: grows with p (hard negatives)
            loss_pos = w_pos * loss_pos
            loss_neg = w_neg * loss_neg

        loss = -(y * loss_pos + (1.0 - y) * loss_neg)  # (B, C)
        return self.reduce(loss, mask, self.reduction)
