"""Class-specific residual attention (CSRA; Zhu and Wu, ICCV 2021), the head of the 2026 CXR-LT Task 1 winner.

A class's logit is the mean of its per-location scores (a linear head on the pooled feature) plus ``lam`` times a
softmax-weighted mean leaning towards its highest-scoring locations: a small finding lifts its class without the
rest of the image averaging it away. CSRA's 1x1 convolution has no bias; the platform's ``bias`` starts at zero,
so the head equals the published one until a loss's prior initialisation sets it.
"""

from __future__ import annotations

import math

import torch
from torch import nn


class CSRAHead(nn.Module):
    """``(B, F, h, w)`` feature map (or ``(B, N, F)`` tokens) to ``(B, C)`` logits.

    Args:
        lam: weight of the attention branch (the winner's 0.1).
        temperature: sharpness of the attention over locations; ``inf``: the maximum score.
    """

    uses_feature_map = True

    def __init__(self, in_features: int, num_labels: int, lam: float = 0.1, temperature: float = 1.0,
                 batch_norm: bool = True):  # fmt: skip
        super().__init__()
        self.lam, self.temperature = float(lam), float(temperature)
        # BatchNorm1d over (B, F, locations) normalises each channel over the batch and the map, as BatchNorm2d does.
        self.norm = nn.BatchNorm1d(in_features) if batch_norm else nn.Identity()
        self.weight = nn.Parameter(torch.empty(num_labels, in_features))
        self.bias = nn.Parameter(torch.zeros(num_labels))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))  # a 1x1 convolution's default initialisation
        nn.init.zeros_(self.bias)
        if isinstance(self.norm, nn.BatchNorm1d):
            self.norm.reset_parameters()

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        # A CNN's (B, F, h, w) map as (B, F, h*w); a transformer's (B, N, F) tokens likewise.
        located = features.flatten(2) if features.ndim == 4 else features.transpose(1, 2)
        unit = self.weight / self.weight.norm(dim=1, keepdim=True)
        scores = torch.einsum("bfl,cf->bcl", self.norm(located), unit)  # (B, C, locations)
        if math.isinf(self.temperature):
            attended = scores.amax(dim=2)
        else:
            attended = (scores * torch.softmax(self.temperature * scores, dim=2)).sum(dim=2)
        return scores.mean(dim=2) + self.lam * attended + self.bias
