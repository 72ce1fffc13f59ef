"""Class-balanced loss (Cui et al. 2019): every class re-weighted by the inverse of its effective number of samples.

Why effective numbers rather than ``1 / n_c``, and the multi-label adaptation (the weight belongs to the class
column, positives and negatives alike): docs/losses.md, "Effective-number weights". The base term is sigmoid
cross-entropy (``gamma = 0``) or its focal variant.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from training.losses.base import MultiLabelLoss
from training.losses.weights import effective_number_weights, require_counts


class ClassBalancedLoss(MultiLabelLoss):
    """``w_c * (1 - p_t) ** gamma * BCE(x, y)`` per entry, ``w_c`` from class ``c``'s effective number.

    ``beta``: Cui et al.'s 0.9999 is their default on large long-tailed sets.
    """

    def __init__(self, beta: float = 0.9999, gamma: float = 0.0, reduction: str = "mean"):
        super().__init__()
        if not 0.0 <= beta < 1.0:
            raise ValueError(f"loss.beta must be in [0, 1), got {beta}")
        if gamma < 0:
            raise ValueError(f"loss.gamma must be >= 0, got {gamma}")
        self.beta, self.gamma, self.reduction = float(beta), float(gamma), reduction

    def class_weights(self) -> torch.Tensor:
        """``(C,)`` weights from the training counts (fails if ``set_class_counts`` was never called)."""
        counts, _ = require_counts(self)
        return effective_number_weights(counts, self.beta)

    def forward(self, logits, targets, mask=None):
        logits = logits.float()  # (B, C); the focal factor underflows in half precision
        y = targets.to(logits.dtype)
        loss = F.binary_cross_entropy_with_logits(logits, y, reduction="none")  # (B, C) = -log(p_t)
        if self.gamma != 0:
            loss = (-torch.expm1(-loss)).clamp_min(1e-12).pow(self.gamma) * loss  # (1 - p_t) ** gamma
        loss = loss * self.class_weights().to(logits.device)  # (B, C) * (C,)
        return self.reduce(loss, mask, self.reduction)
