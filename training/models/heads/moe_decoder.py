"""A query-decoder head whose output layer becomes a mixture of experts in a second phase (``head=moe_decoder``).

Overview Table 2, Task 1 row C: first the backbone with a query-based decoder head, then only the last layers and
the head, with a mixture of experts. Phase 1 is :class:`~training.models.heads.ml_decoder.MLDecoderHead`; at the
switch its group fully-connected output layer is copied into ``K`` experts gated on the mean decoded query, and
the decoder's attention keeps training. Noise, uniform gate and phase buffer as in
:class:`~training.models.heads.moe.MoEHead`.
"""

from __future__ import annotations

import torch
from torch import nn

from training.models.heads.ml_decoder import MLDecoderHead
from training.models.heads.moe import ExpertPhase


class MoEDecoderHead(ExpertPhase, MLDecoderHead):
    """``(B, F, h, w)`` map to ``(B, C)`` logits: an ML-Decoder in phase 1, its output layer as experts in phase 2.

    Arguments as :class:`MLDecoderHead` and :class:`~training.models.heads.moe.MoEHead`.
    """

    def __init__(
        self,
        in_features: int,
        num_labels: int,
        dim: int = 256,
        heads: int = 4,
        layers: int = 1,
        dropout: float = 0.1,
        groups: int | None = None,
        experts: int = 4,
        noise: float = 0.01,
        balance_weight: float = 0.01,
    ):
        super().__init__(in_features, num_labels, dim, heads, layers, dropout, groups)
        self.noise, self.balance_weight = float(noise), float(balance_weight)
        self.expert_weight = nn.Parameter(torch.empty(experts, *self.weight.shape))  # (K, Q, dim, per_group)
        self.expert_bias = nn.Parameter(torch.empty(experts, num_labels))
        self.router = nn.Linear(dim, experts)
        self._start_phases()
        self._init_experts()

    def reset_parameters(self) -> None:
        """A fresh decoder and experts copied from it (cRT); the phase is kept."""
        super().reset_parameters()
        if hasattr(self, "expert_weight"):  # the parent's constructor resets before the experts exist
            self._init_experts()

    def decode(self, features: torch.Tensor) -> torch.Tensor:
        """``(B, Q, dim)`` decoded queries (the parent's forward up to its output layer)."""
        tokens = features.flatten(2).transpose(1, 2) if features.ndim == 4 else features
        memory = self.project(tokens)  # (B, tokens, dim)
        queries = self.queries.unsqueeze(0).expand(len(memory), -1, -1)  # (B, Q, dim)
        for layer in self.layers:
            queries = layer(queries, memory)
        return queries

    def _mixture(self, features: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        queries = self.decode(features)  # (B, Q, dim)
        gates = torch.softmax(self.router(queries.mean(dim=1)), dim=-1)  # (B, K)
        logits = torch.einsum("bqd,eqdk->beqk", queries, self.expert_weight).flatten(2)  # (B, K, Q * per_group)
        logits = logits[..., : self.num_labels] + self.expert_bias  # (B, K, C)
        return torch.einsum("be,bec->bc", gates, logits), gates

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        if not self.in_phase_two:
            return super().forward(features)
        return self._mixture(features)[0]

    def training_loss(self, features, targets, mask, loss) -> torch.Tensor:
        if not self.in_phase_two:
            return loss(super().forward(features), targets, mask)
        return self.mixture_loss(features, targets, mask, loss)
