"""Class-statistics helpers shared by the long-tailed losses (LDAM-DRW, Distribution-Balanced).

Every helper clamps counts to at least 1: a class with no training positive is possible (a tiny split, a label
only in test), and ``1 / n``, ``n ** -0.25`` or ``log(N / n - 1)`` would poison the batch with inf/NaN. Count 1
treats it as the rarest class, which is what rebalancing wants anyway.
"""

from __future__ import annotations

import torch

from training.losses.base import MultiLabelLoss


def require_counts(loss: MultiLabelLoss) -> tuple[torch.Tensor, int]:
    """Return ``(class_counts (C,), n_samples)`` or fail loudly if they were never provided.

    No silent default: uniform counts would quietly turn LDAM into plain scaled BCE.
    """
    counts = getattr(loss, "class_counts", None)
    if counts is None or not hasattr(loss, "n_samples"):
        raise RuntimeError(
            f"{type(loss).__name__} depends on training class counts, but set_class_counts() was not called "
            "before forward(); the LightningModule must call loss.set_class_counts(counts, n_samples) with the "
            "training-manifest statistics before the first step."
        )
    return counts, int(loss.n_samples)


def clamp_counts(counts: torch.Tensor) -> torch.Tensor:
    """Counts as float, clamped to ``>= 1`` so zero-count classes stay finite (see module docstring)."""
    return counts.float().clamp_min(1.0)


def effective_number_weights(counts: torch.Tensor, beta: float) -> torch.Tensor:
    """Class-balanced weights ``w_c = (1 - beta) / (1 - beta ** n_c)`` normalised to sum to ``C``.

    The sum ``C`` keeps the average weight 1, so switching weights on changes the balance between classes, not the
    loss scale (docs/losses.md, "Effective-number weights"). ``beta = 0`` gives all ones.
    """
    if not 0.0 <= beta < 1.0:
        raise ValueError(f"beta must be in [0, 1), got {beta}")
    # float64 on the CPU: 1 - 0.9999 ** n loses digits in float32, and some accelerators (MPS) lack float64
    n = clamp_counts(counts.detach().cpu()).double()  # (C,)
    effective_num = 1.0 - torch.pow(torch.tensor(beta, dtype=torch.float64), n)  # (C,)
    weights = (1.0 - beta) / effective_num  # (C,)
    weights = weights / weights.sum() * n.numel()
    return weights.float().to(counts.device)
