"""How an unseen class is scored by a model trained on the seen classes: its own text, or its text neighbours.

``conse<k>`` (Norouzi et al. 2014): the unseen text embedding as a convex combination of its ``k`` nearest
seen-class ones, and the same combination of their logits. Why: the projection is trained only against seen
directions; the part of an unseen embedding outside their span meets directions no loss constrained. Absence
classes (``Normal``, ``No Finding``) never take part: "normal chest x-ray" sits near every short description and
its logit falls when any finding is present, so borrowing it ranks diseased images last. The transfer is chosen
on validation (proxy-OOD), never on test, and stored in the model so each checkpoint carries its own choice.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

import torch

ABSENCE_CLASSES: frozenset[str] = frozenset({"Normal", "No Finding"})
_NAME = re.compile(r"^(direct|conse(\d+))$")


@dataclass(frozen=True)
class Transfer:
    """One way of scoring unseen classes.

    Attributes:
        name: ``direct`` or ``conse<k>`` (the metric names use it: ``val/proxy_ood/conse3/mAP``).
        k: neighbours of a ConSE transfer; None for ``direct``.
    """

    name: str
    k: int | None = None

    @classmethod
    def parse(cls, name: str) -> Transfer:
        match = _NAME.match(str(name))
        if match is None or (match.group(2) is not None and int(match.group(2)) < 1):
            raise ValueError(f"unknown zero-shot transfer {name!r}: expected 'direct' or 'conse<k>' with k >= 1")
        return cls(match.group(0), int(match.group(2)) if match.group(2) else None)


def parse_transfers(transfer: str, candidates: Sequence[str] | None) -> list[Transfer]:
    """The transfers a model carries: every candidate for ``auto``, else the one named."""
    if transfer != "auto":
        return [Transfer.parse(transfer)]
    if not candidates:
        raise ValueError("adapter.transfer=auto needs adapter.transfer_candidates (e.g. [direct, conse3])")
    return [Transfer.parse(name) for name in dict.fromkeys(candidates)]


def support_mask(labels: Sequence[str]) -> torch.Tensor:
    """``(C,)`` bool: seen classes allowed in a ConSE combination (every class but the absence classes)."""
    return torch.tensor([name not in ABSENCE_CLASSES for name in labels], dtype=torch.bool)


def conse_weights(
    query: torch.Tensor, support: torch.Tensor, k: int, allowed: torch.Tensor | None = None
) -> torch.Tensor:
    """ConSE weights, ``(U, D) x (C, D) -> (U, C)``: each query class as a convex combination of its ``k`` nearest
    allowed support classes by text cosine; rows sum to 1, negative similarities and disallowed classes get 0."""
    sims = query @ support.T  # (U, C)
    if allowed is not None:
        sims = sims.masked_fill(~allowed.to(sims.device), -torch.inf)
    top = sims.topk(min(k, int((sims > -torch.inf).sum(dim=1).min())), dim=1)
    weights = torch.zeros_like(sims).scatter_(1, top.indices, top.values.clamp_min(0))
    return weights / weights.sum(dim=1, keepdim=True).clamp_min(1e-12)


def transfer_weights(transfers: Sequence[Transfer], query: torch.Tensor, support: torch.Tensor,
                     allowed: torch.Tensor | None = None) -> torch.Tensor:  # fmt: skip
    """``(T, U, C)`` ConSE weights per transfer (zeros for ``direct``, which does not combine seen logits)."""
    weights = torch.zeros(len(transfers), query.shape[0], support.shape[0])
    for i, transfer in enumerate(transfers):
        if transfer.k is not None:
            weights[i] = conse_weights(query, support, transfer.k, allowed)
    return weights


def transfer_scores(transfer: Transfer, weights: torch.Tensor, seen_logits: torch.Tensor, direct) -> torch.Tensor:
    """``(B, U)`` unseen logits: ``seen_logits (B, C) @ weights (U, C).T`` for ConSE, ``direct()`` otherwise.

    ``direct`` is a callable so the text cosine is computed only when that transfer is the one used.
    """
    return direct() if transfer.k is None else seen_logits @ weights.T
