"""Mixture-of-experts head, trained in two phases (see :class:`training.models.two_phase.TwoPhase`).

Phase 2 freezes the backbone and replaces the linear head by ``K`` experts mixed per image by a softmax gate, so
regions of feature space (views, sites) get their own tail boundaries without disturbing the representation. The
experts start as noisy copies of the phase-1 head and the gate uniform: the output at the switch is phase 1's up
to the noise, and the noise breaks the symmetry (identical experts give the gate zero gradient forever). The
phase is a buffer, so every checkpoint, a resume and the served model see the head trained at that point; experts
and gate exist from the start so the optimiser built before the first step holds them.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class ExpertPhase:
    """The second phase shared by the expert heads: experts copied from the head's trained output layer
    (``weight``, ``bias``) with a little noise, a gate that starts uniform, a phase buffer the checkpoints carry, and
    the load-balancing term. The head sets ``noise``, ``balance_weight``, ``expert_weight``, ``expert_bias`` and
    ``router``, then calls :meth:`_start_phases`; it defines ``_mixture(features) -> (logits, gates)``."""

    def _start_phases(self) -> None:
        self.register_buffer("phase", torch.ones((), dtype=torch.long))
        # A Python copy of the buffer, so forward branches without a device sync; kept in step on every load.
        self.register_load_state_dict_post_hook(_sync_after_load)
        self._phase = 1

    @property
    def in_phase_two(self) -> bool:
        return self._phase == 2

    def _sync_phase(self) -> None:
        self._phase = int(self.phase)

    @torch.no_grad()
    def _init_experts(self) -> None:
        scale = self.noise * float(self.weight.std())
        self.expert_weight.copy_(self.weight + scale * torch.randn_like(self.expert_weight))
        self.expert_bias.copy_(self.bias.expand_as(self.expert_bias))
        nn.init.zeros_(self.router.weight)
        nn.init.zeros_(self.router.bias)

    def start_phase_two(self) -> None:
        """Experts from the trained phase-1 output layer, then route through them from now on."""
        self._init_experts()
        self.phase.fill_(2)
        self._sync_phase()

    def mixture_loss(self, features, targets, mask, loss) -> torch.Tensor:
        """The phase-2 training loss: the mixture's loss plus the weighted load-balancing term."""
        logits, gates = self._mixture(features)
        importance = gates.mean(dim=0)
        balance = len(importance) * importance.square().sum() - 1
        return loss(logits, targets, mask) + self.balance_weight * balance


class MoEHead(ExpertPhase, nn.Module):
    """Pooled ``(B, F)`` features to ``(B, C)`` logits: linear in phase 1, a gated mixture of experts in phase 2.

    Args:
        noise: std of the perturbation of each expert's copy, relative to the phase-1 weights' std.
        balance_weight: weight of the load-balancing term ``K * sum_k(mean gate_k)^2 - 1`` (the squared
            coefficient of variation of the experts' batch importance), which keeps the gate from collapsing.
    """

    def __init__(
        self, in_features: int, num_labels: int, experts: int = 4, noise: float = 0.01, balance_weight: float = 0.01
    ):
        super().__init__()
        self.noise, self.balance_weight = float(noise), float(balance_weight)
        self.weight = nn.Parameter(torch.empty(num_labels, in_features))  # phase 1: the linear head
        self.bias = nn.Parameter(torch.empty(num_labels))
        self.expert_weight = nn.Parameter(torch.empty(experts, num_labels, in_features))
        self.expert_bias = nn.Parameter(torch.empty(experts, num_labels))
        self.router = nn.Linear(in_features, experts)
        self._start_phases()
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """A fresh linear head, experts copied from it and a uniform gate (cRT); the phase is kept."""
        nn.init.normal_(self.weight, std=0.01)
        nn.init.zeros_(self.bias)
        self._init_experts()

    def _mixture(self, features: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        gates = torch.softmax(self.router(features), dim=-1)  # (B, K)
        logits = torch.einsum("bf,kcf->bkc", features, self.expert_weight) + self.expert_bias  # (B, K, C)
        return torch.einsum("bk,bkc->bc", gates, logits), gates

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        if not self.in_phase_two:
            return F.linear(features, self.weight, self.bias)
        return self._mixture(features)[0]

    def training_loss(self, features, targets, mask, loss) -> torch.Tensor:
        if not self.in_phase_two:
            return loss(F.linear(features, self.weight, self.bias), targets, mask)
        return self.mixture_loss(features, targets, mask, loss)


def _sync_after_load(module: ExpertPhase, incompatible_keys) -> None:
    module._sync_phase()
