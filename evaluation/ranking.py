"""Average precision and AUROC of one class, weighted by per-image counts so a bootstrap resample is cheap.

Why weights: a resample drawn with replacement is described by how many times each image was drawn. AP and
AUROC of the resampled data equal the count-weighted AP and AUROC of the original data in its original score
order, provided ties are grouped the same way: scikit-learn evaluates the curve only at distinct scores, i.e. at
the last position of each run of equal scores in descending order.

Definitions (identical to scikit-learn's on the resampled data):

* AP = sum over distinct thresholds ``k`` (descending) of ``(R_k - R_{k-1}) * P_k`` with ``R_0 = 0``. Only tie
  groups that contain a positive move recall, so only those are evaluated.
* AUROC = weighted Mann-Whitney statistic ``sum_{i pos, j neg} w_i w_j ([s_i > s_j] + 0.5 [s_i = s_j])`` over
  ``W_pos W_neg``, which equals the trapezoidal area under scikit-learn's ROC curve.

Undefined values are NaN: AP without a positive, AUROC without a positive or a negative.

How: each class is sorted once and its descending order is cut into segments -- one per tie group holding a
positive, the runs of negatives between them, and extra cuts at decision thresholds. Every metric of the suite
needs only the weight of each segment (plus the weighted ``y - p`` per calibration bin), so a ``(K, N)`` sparse
0/1 matrix ``ClassPlan.matrix`` maps image counts to these ``K`` sufficient statistics in one sparse product for
a whole chunk of resamples; ``K`` is about three times the number of positives, tiny for tail classes. Prefix sums
over the few segments then give cumulative TP/FP at every positive group and every threshold.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

N_BINS = 15
"""Equal-width calibration bins (see ``evaluation.calibration``)."""


@dataclass(frozen=True)
class SortedClass:
    """One class's labelled entries in descending score order, and the tie groups that hold a positive."""

    index: np.ndarray  # (n,) int64 rows of the labelled entries, descending score (stable among ties)
    y: np.ndarray  # (n,) float64 0/1 targets in that order
    p: np.ndarray  # (n,) float64 scores in that order, non-increasing
    group_of: np.ndarray  # (n,) int64 tie group (run of equal scores) of each sorted position
    group_ends: np.ndarray  # (G_all,) int64 last sorted position of every tie group
    pos_group_start: np.ndarray  # (G,) first sorted position of each tie group holding a positive
    pos_group_end: np.ndarray  # (G,) last sorted position of that group

    @classmethod
    def build(cls, y: np.ndarray, p: np.ndarray) -> SortedClass:
        """Sort one class; entries with target -1 (not labelled) are left out.

        Args:
            y: ``(N,)`` targets in {-1, 0, 1}.
            p: ``(N,)`` scores.
        """
        y = np.asarray(y)
        p = np.asarray(p, dtype=np.float64)
        known = np.flatnonzero(y >= 0)  # (n,)
        order = known[np.argsort(-p[known], kind="stable")]
        ys = (y[order] == 1).astype(np.float64)
        ps = p[order]
        n = len(order)
        new_group = np.ones(n, dtype=bool)  # (n,) True where a run of equal scores starts
        new_group[1:] = ps[1:] != ps[:-1]
        starts = np.flatnonzero(new_group)  # (G_all,)
        ends = np.append(starts[1:] - 1, n - 1) if n else starts
        group_of = np.cumsum(new_group) - 1  # (n,)
        pos_groups = np.unique(group_of[ys == 1])  # (G,) ascending = descending score
        return cls(
            index=order.astype(np.int64),
            y=ys,
            p=ps,
            group_of=group_of.astype(np.int64),
            group_ends=ends.astype(np.int64),
            pos_group_start=starts[pos_groups].astype(np.int64),
            pos_group_end=ends[pos_groups].astype(np.int64),
        )

    @property
    def n(self) -> int:
        return len(self.index)

    def count_at_or_above(self, threshold: float) -> int:
        """Number of sorted entries with ``p >= threshold`` (always a tie-group boundary)."""
        return int(np.searchsorted(-self.p, -float(threshold), side="right"))


@dataclass(frozen=True)
class ClassPlan:
    """Static description of one class: the sparse map from image counts to its sufficient statistics.

    Rows of ``matrix``: ``S`` segment rows (negative weight of each segment of the descending order), then ``G``
    rows (positive weight of each positive tie group), then ``n_bins`` rows (``sum w (y - p)`` per calibration
    bin). Depends only on the data and the thresholds, so it is built once per class.
    """

    matrix: sp.csr_matrix  # (S + G + n_bins, N)
    n_segments: int  # S
    n_groups: int  # G
    n_bins: int
    n_labelled: int  # n
    group_segment: np.ndarray  # (G,) segment of each positive group
    thresholds: tuple[float, ...]  # decision thresholds cut into the segments
    threshold_segments: np.ndarray  # (T,) segments entirely at or above each threshold
    threshold_groups: np.ndarray  # (T,) positive groups entirely at or above each threshold

    @classmethod
    def build(
        cls,
        y: np.ndarray,
        p: np.ndarray,
        thresholds: Sequence[float] = (),
        n_bins: int = N_BINS,
        sorted_class: SortedClass | None = None,
    ) -> ClassPlan:
        """Plan of one class.

        Args:
            y: ``(N,)`` targets in {-1, 0, 1}; -1 entries are left out.
            p: ``(N,)`` scores (probabilities in [0, 1] when calibration rows are used).
            thresholds: decision thresholds whose TP/FP will be read (``prob >= t``).
            n_bins: calibration bins.
            sorted_class: ``SortedClass.build(y, p)`` if already at hand.
        """
        sc = sorted_class if sorted_class is not None else SortedClass.build(y, p)
        n, n_items = sc.n, len(y)
        cut_at = np.array([sc.count_at_or_above(t) for t in thresholds], dtype=np.int64)  # (T,)
        cuts = np.unique(np.concatenate([np.array([0, n]), sc.pos_group_start, sc.pos_group_end + 1, cut_at]))
        n_segments = max(len(cuts) - 1, 0)
        segment = np.searchsorted(cuts, np.arange(n), side="right") - 1  # (n,) segment of each sorted position
        group_segment = np.searchsorted(cuts, sc.pos_group_start)  # (G,) cuts hold every group start
        n_groups = len(group_segment)
        is_pos = sc.y == 1
        row = segment.copy()  # negatives -> their segment's row
        row[is_pos] = n_segments + np.searchsorted(group_segment, segment[is_pos])  # positives -> their group's row
        bins = calibration_bin(sc.p, n_bins)  # (n,)
        rows = np.concatenate([row, n_segments + n_groups + bins])  # (2n,)
        cols = np.concatenate([sc.index, sc.index])
        data = np.concatenate([np.ones(n), sc.y - sc.p])
        matrix = sp.csr_matrix((data, (rows, cols)), shape=(n_segments + n_groups + n_bins, n_items))
        cut_index = np.searchsorted(cuts, cut_at)  # (T,) segments entirely above each cut
        return cls(
            matrix=matrix,
            n_segments=n_segments,
            n_groups=n_groups,
            n_bins=n_bins,
            n_labelled=n,
            group_segment=group_segment.astype(np.int64),
            thresholds=tuple(float(t) for t in thresholds),
            threshold_segments=cut_index.astype(np.int64),
            threshold_groups=np.searchsorted(group_segment, cut_index).astype(np.int64),
        )

    def stats(self, counts_t: np.ndarray) -> ClassStats:
        """Sufficient statistics for a chunk of resamples.

        Args:
            counts_t: ``(N, b)`` C-contiguous image counts, resample last (one sparse product for all ``b``).
        """
        out = self.matrix @ counts_t  # (K, b)
        s, g = self.n_segments, self.n_groups
        return ClassStats(
            neg_cum=np.cumsum(out[:s], axis=0),  # (S, b)
            pos=out[s : s + g],  # (G, b)
            tp_cum=np.cumsum(out[s : s + g], axis=0),  # (G, b)
            residual=out[s + g :],  # (n_bins, b)
        )


@dataclass(frozen=True)
class ClassStats:
    """One class's sufficient statistics for a chunk of ``b`` resamples (resample on the last axis)."""

    neg_cum: np.ndarray  # (S, b) cumulative negative weight up to the end of each segment
    pos: np.ndarray  # (G, b) positive weight of each positive tie group
    tp_cum: np.ndarray  # (G, b) cumulative positive weight up to each positive group
    residual: np.ndarray  # (n_bins, b) sum of w (y - p) per calibration bin

    @property
    def negatives(self) -> np.ndarray:
        """``(b,)`` total negative weight."""
        return self.neg_cum[-1] if len(self.neg_cum) else np.zeros(self.residual.shape[1])

    @property
    def positives(self) -> np.ndarray:
        """``(b,)`` total positive weight."""
        return self.tp_cum[-1] if len(self.tp_cum) else np.zeros(self.residual.shape[1])

    @property
    def total(self) -> np.ndarray:
        """``(b,)`` total labelled weight."""
        return self.positives + self.negatives


def calibration_bin(p: np.ndarray, n_bins: int = N_BINS) -> np.ndarray:
    """Bin of each probability, ``(n,)`` -> ``(n,)`` in ``0..n_bins-1``.

    Bin 0 is ``[0, 1/n_bins]`` and bin ``k`` is ``(k/n_bins, (k+1)/n_bins]``: ``np.digitize(p, edges[1:-1],
    right=True)`` with ``edges = linspace(0, 1, n_bins + 1)``.
    """
    edges = np.linspace(0.0, 1.0, n_bins + 1)
    return np.searchsorted(edges[1:-1], np.asarray(p, dtype=np.float64), side="left")


def ap_auroc(plan: ClassPlan, stats: ClassStats) -> tuple[np.ndarray, np.ndarray]:
    """Weighted AP and AUROC for each resample of a chunk.

    For each positive tie group ``g``: ``a_g`` is its positive weight, ``tp_g``/``fp_g`` the cumulative
    positive/negative weights to its end, ``fp_before_g`` the negative weight strictly above it.

    Returns:
        ``(ap, auroc)``, each ``(b,)``; NaN where undefined in that resample.
    """
    w_pos, w_neg = stats.positives, stats.negatives  # (b,)
    if plan.n_groups == 0:
        return np.full(len(w_pos), np.nan), np.full(len(w_pos), np.nan)
    a, tp = stats.pos, stats.tp_cum  # (G, b)
    fp = stats.neg_cum[plan.group_segment]  # (G, b)
    fp_before = stats.neg_cum[plan.group_segment - 1]  # (G, b); row -1 where the group starts the order:
    fp_before[plan.group_segment == 0] = 0.0  # nothing above it
    predicted = tp + fp
    # tp / predicted, 0 where nothing is predicted (then tp = 0, so dividing by the smallest normal gives 0 too):
    precision = np.divide(tp, np.maximum(predicted, np.finfo(np.float64).tiny, out=predicted), out=predicted)
    fp += fp_before
    with np.errstate(invalid="ignore", divide="ignore"):
        ap = np.einsum("gb,gb->b", a, precision) / w_pos
        # a_g * (negatives below g + half those tied with g) = a_g * (w_neg - (fp_g + fp_before_g) / 2)
        auroc = (w_neg * w_pos - 0.5 * np.einsum("gb,gb->b", a, fp)) / (w_pos * w_neg)
    ap[w_pos <= 0] = np.nan
    auroc[(w_pos <= 0) | (w_neg <= 0)] = np.nan
    return ap, auroc


def interpolated_ap(plan: ClassPlan, stats: ClassStats, points: int | None = None) -> np.ndarray:
    """PASCAL VOC's interpolated AP for each resample of a chunk: all-point (``points=None``) or ``points``-point.

    Why it is here: the CXR-LT 2026 paper cites PASCAL VOC for AP, whose AP differs from scikit-learn's step AP
    (:func:`ap_auroc`); the platform offers it as a configurable alternative (``evaluation.conventions``).

    Definitions (Everingham et al., PASCAL VOC): the interpolated precision at recall ``r`` is the largest precision
    at any recall ``>= r``. All-point (VOC 2010 and later): the area under that monotone envelope, i.e.
    ``sum_k (R_k - R_{k-1}) * max_{j >= k} P_j``. 11-point (VOC 2007, ``points=11``): the mean of the interpolated
    precision at ``r = 0, 0.1, ..., 1`` (0 where no recall reaches ``r``). Recall levels are compared exactly
    (``10 tp >= k n_pos``), not through a rounded ``k / 10``. Tied scores form one threshold, as in :func:`ap_auroc`;
    the VOC devkit ranks tied detections in an arbitrary order, so on ties the two can differ.

    Only the ends of tie groups holding a positive are needed: any other point of the curve has the recall of the
    last such group above it and no higher precision, so it never raises the envelope.

    Returns:
        ``(b,)``; NaN where the resample has no positive.
    """
    w_pos = stats.positives  # (b,)
    if plan.n_groups == 0:
        return np.full(len(w_pos), np.nan)
    tp = stats.tp_cum  # (G, b)
    predicted = tp + stats.neg_cum[plan.group_segment]  # (G, b)
    precision = np.divide(tp, np.maximum(predicted, np.finfo(np.float64).tiny))
    envelope = np.maximum.accumulate(precision[::-1], axis=0)[::-1]  # (G, b) best precision at this recall or above
    with np.errstate(invalid="ignore", divide="ignore"):
        if points is None:
            ap = np.einsum("gb,gb->b", stats.pos, envelope) / w_pos
        else:
            if points < 2:
                raise ValueError(f"interpolated AP needs at least 2 recall points, got {points}")
            columns = np.arange(tp.shape[1])
            total = np.zeros(tp.shape[1])
            for k in range(points):  # recall level k / (points - 1)
                reached = (points - 1) * tp >= k * w_pos  # (G, b), False then True along G
                first = np.argmax(reached, axis=0)  # (b,)
                total += np.where(reached.any(axis=0), envelope[first, columns], 0.0)
            ap = total / points
    ap[w_pos <= 0] = np.nan
    return ap


def counts_matrix(n_items: int, counts: np.ndarray | None) -> tuple[np.ndarray, bool]:
    """``counts`` as ``(N, b)`` C-contiguous float64 (resample last), and whether the caller passed a batch.

    Args:
        n_items: ``N``.
        counts: ``None`` (each image once), ``(N,)`` or ``(B, N)``.
    """
    if counts is None:
        return np.ones((n_items, 1)), False
    counts = np.asarray(counts, dtype=np.float64)
    if counts.ndim not in (1, 2) or counts.shape[-1] != n_items:
        raise ValueError(f"counts must be ({n_items},) or (B, {n_items}), got shape {counts.shape}")
    return np.ascontiguousarray(np.atleast_2d(counts).T), counts.ndim == 2


def ap_auroc_weighted(
    y: np.ndarray, p: np.ndarray, counts: np.ndarray | None = None
) -> tuple[float | np.ndarray, float | np.ndarray]:
    """AP and AUROC of one class, optionally weighted by per-image counts.

    Args:
        y: ``(N,)`` targets in {-1, 0, 1}; -1 entries are left out.
        p: ``(N,)`` scores.
        counts: ``None`` (each image once), ``(N,)`` counts, or ``(B, N)`` counts of ``B`` resamples.

    Returns:
        Floats, or ``(B,)`` arrays when ``counts`` is 2-D; NaN where undefined.
    """
    plan = ClassPlan.build(y, p)
    counts_t, batch = counts_matrix(len(y), counts)
    ap, auroc = ap_auroc(plan, plan.stats(counts_t))
    return (ap, auroc) if batch else (float(ap[0]), float(auroc[0]))


def average_precision(y: np.ndarray, p: np.ndarray, counts: np.ndarray | None = None) -> float | np.ndarray:
    """Weighted AP (scikit-learn's ``average_precision_score`` on the resampled data); see ``ap_auroc_weighted``."""
    return ap_auroc_weighted(y, p, counts)[0]


def roc_auc(y: np.ndarray, p: np.ndarray, counts: np.ndarray | None = None) -> float | np.ndarray:
    """Weighted AUROC (scikit-learn's ``roc_auc_score`` on the resampled data); see ``ap_auroc_weighted``."""
    return ap_auroc_weighted(y, p, counts)[1]
