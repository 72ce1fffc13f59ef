"""Expected calibration error per class and pooled, weighted by per-image counts for the bootstrap.

ECE (L1, equal width): ``sum_b |B_b| / n * |mean(y in b) - mean(p in b)|`` over ``n_bins`` bins of [0, 1], which
equals ``sum_b |sum_{i in b} (y_i - p_i)| / n``; with counts ``w`` it is ``sum_b |sum_{i in b} w_i (y_i - p_i)| /
sum_i w_i``, the ECE of the resampled data. Empty bins contribute 0.

Bin edges: ``edges = linspace(0, 1, n_bins + 1)``; bin ``k`` is ``(edges[k], edges[k+1]]`` except that bin 0 also
takes ``p = 0``, i.e. ``np.digitize(p, edges[1:-1], right=True)`` (``evaluation.ranking.calibration_bin``). So 1/15 is
in bin 0 and 1.0 in the last bin.

The per-bin sums ``sum w (y - p)`` are rows of ``evaluation.ranking.ClassPlan``'s sparse matrix, computed for a
chunk of resamples together with the ranking statistics.
"""

from __future__ import annotations

import numpy as np

from evaluation.ranking import N_BINS, ClassPlan, counts_matrix

__all__ = ["N_BINS", "ece", "ece_from_bins", "pooled_ece"]


def ece_from_bins(residuals: np.ndarray, total: np.ndarray) -> np.ndarray:
    """ECE from per-bin sums of ``w (y - p)`` ``(n_bins, b)`` and total weight ``(b,)``; NaN where the total is 0."""
    with np.errstate(invalid="ignore", divide="ignore"):
        value = np.abs(residuals).sum(axis=0) / total
    value[total <= 0] = np.nan
    return value


def ece(y: np.ndarray, p: np.ndarray, counts: np.ndarray | None = None, n_bins: int = N_BINS) -> float | np.ndarray:
    """ECE of one class, optionally weighted by per-image counts.

    Args:
        y: ``(N,)`` targets in {-1, 0, 1}; -1 entries are left out.
        p: ``(N,)`` probabilities in [0, 1].
        counts: ``None``, ``(N,)`` counts or ``(B, N)`` counts of ``B`` resamples.
        n_bins: number of equal-width bins.

    Returns:
        Float, or ``(B,)`` when ``counts`` is 2-D; NaN without labelled entries.
    """
    plan = ClassPlan.build(y, p, n_bins=n_bins)
    counts_t, batch = counts_matrix(len(y), counts)
    stats = plan.stats(counts_t)
    value = ece_from_bins(stats.residual, stats.total)
    return value if batch else float(value[0])


def pooled_ece(
    targets: np.ndarray, probs: np.ndarray, counts: np.ndarray | None = None, n_bins: int = N_BINS
) -> float | np.ndarray:
    """ECE over all labelled (image, class) pairs pooled into one set of bins, optionally count-weighted.

    Pooling the pairs means summing the classes' per-bin residuals before taking absolute values.

    Args:
        targets: ``(N, C)`` in {-1, 0, 1}.
        probs: ``(N, C)`` probabilities.
        counts: ``None``, ``(N,)`` or ``(B, N)`` image counts (a resampled image brings all its classes).
    """
    targets, probs = np.asarray(targets), np.asarray(probs, dtype=np.float64)
    counts_t, batch = counts_matrix(targets.shape[0], counts)
    residuals = np.zeros((n_bins, counts_t.shape[1]))
    total = np.zeros(counts_t.shape[1])
    for c in range(targets.shape[1]):
        stats = ClassPlan.build(targets[:, c], probs[:, c], n_bins=n_bins).stats(counts_t)
        residuals += stats.residual
        total += stats.total
    value = ece_from_bins(residuals, total)
    return value if batch else float(value[0])
