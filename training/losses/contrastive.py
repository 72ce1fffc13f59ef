"""Multi-label supervised contrastive loss, as an auxiliary term on the pooled feature (``aux_loss=multi_supcon``)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def multi_label_supcon(
    embeddings: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor | None = None, temperature: float = 0.1
) -> torch.Tensor:
    """Supervised contrastive loss (Khosla et al. 2020) with one anchor per (image, positive label) pair.

    Why per label: with several findings per image there is no single "same class" relation; one anchor per positive
    label (Zhang and Wu, AAAI 2024) gives a rare finding its own attraction instead of averaging it into a
    set-of-labels similarity. For anchor ``(i, c)`` with positives ``P = {j != i : y_jc = 1}``::

        l_ic = -1 / |P| * sum_{p in P} log( exp(s_ip / t) / sum_{a != i} exp(s_ia / t) )

    averaged over anchors with a non-empty ``P``; 0 (with a gradient path) when there is none. Unlabelled entries are
    not positives. Under DDP the contrast is within each process's batch.
    """
    z = F.normalize(embeddings.float(), dim=1)  # (B, D)
    y = targets.float() if mask is None else targets.float() * mask.float()  # (B, C) known positives
    b = z.shape[0]
    self_pair = torch.eye(b, dtype=torch.bool, device=z.device)  # (B, B)
    sim = (z @ z.T / temperature).masked_fill(self_pair, float("-inf"))  # (B, B), no self-contrast
    log_prob = (sim - torch.logsumexp(sim, dim=1, keepdim=True)).masked_fill(self_pair, 0.0)  # (B, B)
    sum_log_prob = log_prob @ y  # (B, C): sum over j != i with y_jc = 1 of log_prob[i, j]
    n_pos = y.sum(dim=0, keepdim=True) - y  # (B, C): positives of c other than i
    anchors = (y > 0) & (n_pos > 0)  # (B, C)
    per_anchor = -sum_log_prob / n_pos.clamp_min(1.0)  # (B, C)
    if not anchors.any():
        return sim.new_zeros(()) + 0.0 * z.sum()
    return per_anchor[anchors].mean()


class MultiSupConAux(nn.Module):
    """A projection head on the pooled feature trained with :func:`multi_label_supcon`, beside the main loss.

    The projection (as in SupCon) lets the contrastive geometry live in its own space while the backbone feature
    serves the classifier; nothing of it is used for predictions. ``num_labels`` is unused by the loss.
    """

    def __init__(
        self, in_features: int, num_labels: int, dim: int = 128, hidden: int | None = None, temperature: float = 0.1
    ):
        super().__init__()
        if temperature <= 0:
            raise ValueError(f"aux_loss.temperature must be > 0, got {temperature}")
        hidden = int(hidden or in_features)
        self.projection = nn.Sequential(nn.Linear(in_features, hidden), nn.ReLU(), nn.Linear(hidden, int(dim)))
        self.temperature = float(temperature)

    def forward(self, pooled: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        return multi_label_supcon(self.projection(pooled), targets, mask, self.temperature)
