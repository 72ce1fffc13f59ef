"""The readers' *rating* agreement on REVEAL-CXR: Cohen's kappa of each reader's rating with the majority rating.

Each reader rated the labels suggested for a study "Agree all", "Agree mostly" or "Disagree"; agreement of
*ratings* is a different quantity from the *label* kappa (:mod:`apps.benchmarks.reveal.agreement`), and the
two are never to be set side by side as if comparable. The choices (the paper's binary scale and the platform's
three-level one, unweighted kappa by default, the majority rating, per-finding rows, paired intervals) and
their reasons are in docs/benchmarks.md, "REVEAL-CXR". Ratings are moved to a scale before anything else, so
the majority is taken on the scale scored.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from apps.benchmarks.reveal.agreement import ALL_READERS, COLUMNS, OVERALL, bootstrap_counts
from evaluation.bootstrap import percentile_ci

__all__ = [
    "RATINGS",
    "SCALES",
    "WEIGHTS",
    "constant_majority",
    "kappa_from_confusion",
    "majority_rating",
    "on_scale",
    "others_rating",
    "rating_agreement",
]

RATINGS = ("agree all", "agree mostly", "disagree")
"""The rating levels as read (lower case) in ordinal order; a rating's code is its index here."""

SCALES: dict[str, tuple[tuple[str, ...], tuple[int, ...]]] = {
    "binary": (("agree all", "agree mostly or disagree"), (0, 1, 1)),
    "three-level": (RATINGS, (0, 1, 2)),
}
"""scale -> (its level names, the level each code of :data:`RATINGS` moves to). ``binary`` is REVEAL-CXR's scale
(its kappa 0.622), ``three-level`` the platform's."""

WEIGHTS = {None: None, "linear": 1, "quadratic": 2}
"""``weights`` -> the power of ``|i - j|`` that weighs a disagreement (``None``: every disagreement weighs 1),
spelled as ``sklearn.metrics.cohen_kappa_score`` spells them."""


def _scale(scale: str) -> tuple[tuple[str, ...], np.ndarray]:
    if scale not in SCALES:
        raise ValueError(f"scale must be one of {list(SCALES)}, got {scale!r}")
    names, moves = SCALES[scale]
    return names, np.asarray(moves, dtype=np.int64)


def on_scale(ratings: np.ndarray, scale: str) -> np.ndarray:
    """``(N, R)`` codes of :data:`RATINGS` (-1: not rated) -> the same cells as levels of ``scale`` (-1 kept)."""
    ratings = np.asarray(ratings)
    if ratings.ndim != 2:
        raise ValueError(f"ratings must be (studies, readers), got shape {ratings.shape}")
    if ratings.size and not np.isin(ratings, (-1, *range(len(RATINGS)))).all():
        raise ValueError(f"ratings must be coded 0..{len(RATINGS) - 1} or -1 (not rated); got {np.unique(ratings)}")
    ratings = ratings.astype(np.int64)
    _, moves = _scale(scale)
    return np.where(ratings >= 0, moves[np.clip(ratings, 0, None)], -1)


def _majority(votes: np.ndarray, given: np.ndarray) -> np.ndarray:
    """The level with more than half of ``given`` votes (``votes`` ``(..., L)``), else -1."""
    winner = votes.argmax(axis=-1)
    return np.where(2 * votes.max(axis=-1) > given, winner, -1).astype(np.int64)


def _votes(levels: np.ndarray, n_levels: int) -> np.ndarray:
    return np.stack([(levels == level).sum(axis=1) for level in range(n_levels)], axis=-1)  # (N, L)


def majority_rating(ratings: np.ndarray, scale: str = "three-level") -> np.ndarray:
    """``(N, R)`` codes -> ``(N,)``: the level of ``scale`` more than half of the study's ratings give, -1 where
    none does."""
    levels, n_levels = on_scale(ratings, scale), len(_scale(scale)[0])
    votes = _votes(levels, n_levels)
    return _majority(votes, votes.sum(axis=1))


def others_rating(ratings: np.ndarray, scale: str = "three-level") -> np.ndarray:
    """``(N, R)``: for each reader the majority of the *other* readers' ratings on ``scale`` (-1 where they have
    none)."""
    levels, n_levels = on_scale(ratings, scale), len(_scale(scale)[0])
    votes = _votes(levels, n_levels)[:, None, :] - (levels[:, :, None] == np.arange(n_levels))  # (N, R, L)
    return _majority(votes, votes.sum(axis=2))


def weight_matrix(weights: str | None, n_levels: int) -> np.ndarray:
    if weights not in WEIGHTS:
        raise ValueError(f"weights must be one of {list(WEIGHTS)}, got {weights!r}")
    distance = np.abs(np.subtract.outer(np.arange(n_levels), np.arange(n_levels))).astype(np.float64)
    return (distance > 0).astype(np.float64) if WEIGHTS[weights] is None else distance ** WEIGHTS[weights]


def kappa_from_confusion(counts: np.ndarray, weights: str | None = None) -> np.ndarray:
    """Cohen's kappa of every ``(..., L, L)`` confusion table (rows: reader, columns: reference); NaN if undefined.

    The same formula as ``sklearn.metrics.cohen_kappa_score``; on integer counts its denominator is exactly zero
    when, and only when, the expected disagreement is zero, so that test needs no tolerance.
    """
    counts = np.asarray(counts, dtype=np.float64)
    if counts.ndim < 2 or counts.shape[-1] != counts.shape[-2]:
        raise ValueError(f"counts must end in (L, L), got shape {counts.shape}")
    w = weight_matrix(weights, counts.shape[-1])
    rows, cols, n = counts.sum(axis=-1), counts.sum(axis=-2), counts.sum(axis=(-2, -1))
    observed = (counts * w).sum(axis=(-2, -1))
    expected = np.einsum("...i,ij,...j->...", rows, w, cols)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(expected > 0, 1.0 - n * observed / expected, np.nan)


def constant_majority(ratings: np.ndarray, scale: str = "binary") -> str | None:
    """The one majority level of ``scale`` every rated study has, or ``None`` when it varies (or none has one).

    Against a constant reference kappa is 0 (or undefined) whatever the readers do: the chance agreement equals
    the observed. REVEAL-CXR kept only studies with at least two "Agree all", so on its release this is the case
    on either scale.
    """
    levels = set(majority_rating(ratings, scale).tolist()) - {-1}
    return _scale(scale)[0][levels.pop()] if len(levels) == 1 else None


def rating_agreement(
    ratings: np.ndarray,
    readers: Sequence[str],
    carries: np.ndarray,
    findings: Sequence[str],
    resamples: np.ndarray | None,
    scale: str = "binary",
    weights: str | None = None,
    ci: float = 0.95,
) -> pd.DataFrame:
    """The rating kappa of every reader with both references, per finding and overall, with bootstrap intervals.

    Args:
        ratings: ``(N, R)`` rating codes (see :data:`RATINGS`; -1 = not rated).
        carries: ``(N, K)`` bool, whether study ``n`` carries finding ``k`` (its reference is positive).
        resamples: ``(B, N)`` study indices, shared with the label kappa so the intervals are paired.

    Returns:
        The columns of :func:`~apps.benchmarks.reveal.agreement.reader_agreement`.
    """
    levels = on_scale(ratings, scale)
    n_levels = len(_scale(scale)[0])
    n_items, n_readers = levels.shape
    carries = np.asarray(carries, dtype=bool)
    if carries.shape != (n_items, len(findings)):
        raise ValueError(f"carries must be ({n_items}, {len(findings)}), got shape {carries.shape}")
    if len(readers) != n_readers:
        raise ValueError(f"{n_readers} rating columns but {len(readers)} reader names")
    resamples = np.empty((0, n_items), np.int64) if resamples is None else np.asarray(resamples, dtype=np.int64)
    if resamples.ndim != 2 or resamples.shape[1] != n_items:
        raise ValueError(f"resamples must be (n_boot, {n_items}) study indices, got shape {resamples.shape}")
    scope = np.concatenate([carries, np.ones((n_items, 1), bool)], axis=1).astype(np.float64)  # (N, K + 1)
    full = np.broadcast_to(majority_rating(ratings, scale)[:, None], levels.shape)
    others = others_rating(ratings, scale)
    references = {"majority": (full, full), "leave-one-out": (np.where(levels >= 0, others, -1), others)}
    names = [*map(str, readers), ALL_READERS]
    labels = [*map(str, findings), OVERALL]
    rows = []
    for reference_name, (reference, available) in references.items():
        scored = (levels >= 0) & (reference >= 0)
        cell = np.where(scored, levels * n_levels + reference, 0)
        pairs = np.eye(n_levels * n_levels)[cell] * scored[..., None]  # (N, R, L*L)
        indicator = pairs[:, :, None, :] * scope[:, None, :, None]  # (N, R, K + 1, L*L)
        counts = np.concatenate([indicator.sum(axis=0)[None], bootstrap_counts(resamples, indicator)])
        counts = np.concatenate([counts, counts.sum(axis=1, keepdims=True)], axis=1)  # + all readers
        kappas = kappa_from_confusion(counts.reshape(*counts.shape[:-1], n_levels, n_levels), weights)
        blank = ((levels < 0) & (available >= 0))[:, :, None] * scope[:, None, :]
        tie = ((levels >= 0) & (reference < 0))[:, :, None] * scope[:, None, :]
        blank, tie = (np.concatenate([v.sum(axis=0), v.sum(axis=(0, 1))[None]]) for v in (blank, tie))
        for r, reader in enumerate(names):
            for k, finding in enumerate(labels):
                low, high = percentile_ci(kappas[1:, r, k], ci) if kappas.shape[0] > 1 else (np.nan, np.nan)
                rows.append({
                    "reference": reference_name, "reader": reader, "finding": finding,
                    "n": int(round(counts[0, r, k].sum())), "kappa": float(kappas[0, r, k]),
                    "ci_low": low, "ci_high": high, "n_blank": int(blank[r, k]), "n_tie": int(tie[r, k]),
                })  # fmt: skip
    return pd.DataFrame(rows, columns=COLUMNS)
