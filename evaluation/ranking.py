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
over the few segments then give cumulative TP/FP at every positive group and every threshold. The suite does the same
for all classes at once (``SuiteRanking``: one stacked matrix on packed counts, the same statistics exactly).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

try:  # the kernel behind ``csr_matrix @ dense``, called with a reused output array
    from scipy.sparse._sparsetools import csr_matvecs as _csr_matvecs
except ImportError:  # pragma: no cover - a SciPy that moved it: fall back to the public product
    _csr_matvecs = None

from evaluation.packed_counts import CLIP, ROW_IMAGES, LanePacking

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


# --- all classes of the suite at once ----------------------------------------------------------------------------


@dataclass(frozen=True)
class ClassLayout:
    """What the metric functions read of one class's plan (``ClassPlan`` without its matrix).

    Same meaning as the ``ClassPlan`` fields; ``evaluation.thresholds.confusion_at`` and ``ap_auroc`` accept it.
    """

    n_segments: int
    n_groups: int
    n_bins: int
    n_labelled: int
    group_segment: np.ndarray
    thresholds: tuple[float, ...]
    threshold_segments: np.ndarray
    threshold_groups: np.ndarray


def _runs_rank(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For a non-decreasing ``keys``: the rank of each entry within its run of equal keys, and where runs end."""
    n = len(keys)
    first = np.ones(n, dtype=bool)
    first[1:] = keys[1:] != keys[:-1]
    index = np.arange(n)
    rank = index - np.maximum.accumulate(np.where(first, index, 0))
    last = np.ones(n, dtype=bool)
    last[:-1] = first[1:]
    return rank, last


@dataclass(frozen=True)
class _ClassRows:
    """One class's rows in ``SuiteRanking.matrix`` (local row numbers; row 0 is an empty row whose sums are 0)."""

    layout: ClassLayout
    neg_images: np.ndarray  # images of the negative rows, in row order
    neg_rows: np.ndarray
    pos_images: np.ndarray
    pos_rows: np.ndarray
    n_rows: int
    neg_block: int  # rows [0, neg_block) are the negatives' prefix-sum block, [neg_block, n_rows) the positives'
    segment_row: np.ndarray  # (S,) last negative row at or before each segment (0: none)
    group_row: np.ndarray  # (G,) last row of each positive group


def _class_rows(y: np.ndarray, p: np.ndarray, thresholds: Sequence[float], n_bins: int) -> _ClassRows:
    """Segments of one class as ``ClassPlan.build`` cuts them, as rows of at most ``ROW_IMAGES`` images each.

    The descending order is sorted without stability: a segment is a union of whole tie groups (cuts fall only at
    group boundaries and thresholds, and tied scores sit on the same side of a threshold), so the order inside a
    tie does not change which images a row sums.
    """
    known = np.flatnonzero(y >= 0)
    order = known[np.argsort(-p[known])]
    ps = p[order]
    is_pos = y[order] == 1
    n = len(order)
    new_group = np.ones(n, dtype=bool)
    new_group[1:] = ps[1:] != ps[:-1]
    starts = np.flatnonzero(new_group)
    ends = np.append(starts[1:] - 1, n - 1) if n else starts
    group_of = np.cumsum(new_group) - 1
    pos_positions = np.flatnonzero(is_pos)
    pos_group_of = group_of[pos_positions]  # non-decreasing
    group_rank, group_last = _runs_rank(pos_group_of)
    pos_groups = pos_group_of[group_last]
    pos_group_start, pos_group_end = starts[pos_groups], ends[pos_groups]
    cut_at = np.array([np.searchsorted(-ps, -float(t), side="right") for t in thresholds], dtype=np.int64)
    # cuts as ClassPlan.build makes them (np.unique of 0, n, group starts, group ends + 1, thresholds), marked on
    # the positions instead of sorted: cut_number[k] is how many cuts lie at or before position k
    is_cut = np.zeros(n + 1, dtype=bool)
    is_cut[[0, n]] = True
    is_cut[pos_group_start] = True
    is_cut[pos_group_end + 1] = True
    is_cut[cut_at] = True
    cut_number = np.cumsum(is_cut)
    n_segments = max(int(cut_number[-1]) - 1, 0)
    segment = cut_number[:n] - 1  # (n,) segment of each sorted position
    group_segment = segment[pos_group_start].astype(np.int64)
    n_groups = len(group_segment)
    cut_index = (cut_number[cut_at] - 1).astype(np.int64)  # position of each threshold's cut among the cuts
    layout = ClassLayout(
        n_segments=n_segments,
        n_groups=n_groups,
        n_bins=n_bins,
        n_labelled=n,
        group_segment=group_segment,
        thresholds=tuple(float(t) for t in thresholds),
        threshold_segments=cut_index,
        threshold_groups=np.searchsorted(group_segment, cut_index).astype(np.int64),
    )
    neg_positions = np.flatnonzero(~is_pos)
    neg_segment = segment[neg_positions]
    neg_rank, neg_last = _runs_rank(neg_segment)
    neg_rows = np.cumsum(neg_rank % ROW_IMAGES == 0)  # rows 1, 2, ...: a new row every ROW_IMAGES of a segment
    n_neg_rows = int(neg_rows[-1]) if len(neg_rows) else 0
    segment_row = np.zeros(n_segments, dtype=np.int64)
    segment_row[neg_segment[neg_last]] = neg_rows[neg_last]
    segment_row = np.maximum.accumulate(segment_row) if n_segments else segment_row
    pos_rows = n_neg_rows + np.cumsum(group_rank % ROW_IMAGES == 0)
    return _ClassRows(
        layout=layout,
        neg_images=order[neg_positions],
        neg_rows=neg_rows,
        pos_images=order[pos_positions],
        pos_rows=pos_rows,
        n_rows=1 + n_neg_rows + (int(pos_rows[-1]) - n_neg_rows if len(pos_rows) else 0),
        neg_block=1 + n_neg_rows,
        segment_row=segment_row,
        group_row=pos_rows[group_last].astype(np.int64),
    )


def _leading_rows_with_zero(values: np.ndarray) -> int:
    """Rows from the top of ``values`` (non-decreasing down each column, non-negative) that hold a 0."""
    lo, hi = 0, len(values)
    if not hi or values[0].min() > 0:  # the usual case past a class's first block
        return 0
    while lo < hi:
        mid = (lo + hi) // 2
        if values[mid].min() == 0:
            lo = mid + 1
        else:
            hi = mid
    return lo


GROUP_BLOCK_ELEMENTS = 2**15
"""Resamples x positive groups per block of AP/AUROC arithmetic: its few float64 arrays stay in cache (2**15
measured fastest at 150,000 x 30, against 2**13 to 2**18)."""


class SuiteRanking:
    """Every class's ranking statistics for a chunk of resamples, from one sparse product on packed counts.

    Why one stacked matrix: a Python loop of per-class products, prefix sums and unpacking cost more than the
    arithmetic at 150,000 x 30. Rows of ``matrix``, per class: an empty row, the negatives of each segment of the
    descending order, the positives of each positive tie group, every row cut to at most ``ROW_IMAGES`` images so
    that narrow lanes cannot overflow (``evaluation.packed_counts``). After the product the lanes are widened and
    prefix-summed per block, which gives, exactly, ``ClassStats.neg_cum``/``tp_cum`` at the last row of each
    segment/group; only the rows that the metrics read are gathered and unpacked.

    Args:
        targets: ``(N, C)`` in {-1, 0, 1}.
        probs: ``(N, C)`` scores.
        thresholds: ``C`` tuples of decision thresholds to plan (the same number for every class).
        columns: ``(N,)`` column of each image in the count vectors (the suite orders images by stratum).
        n_bins: calibration bins (recorded in the layouts).
    """

    def __init__(
        self,
        targets: np.ndarray,
        probs: np.ndarray,
        thresholds: Sequence[Sequence[float]],
        columns: np.ndarray,
        n_bins: int = N_BINS,
    ):
        n_items, n_classes = probs.shape
        self.n_items = n_items
        self.packing = LanePacking.for_sums(n_items)  # every sum of one resample's counts is at most its N draws
        classes = [_class_rows(targets[:, c], probs[:, c], thresholds[c], n_bins) for c in range(n_classes)]
        self.layouts = [rows.layout for rows in classes]
        offsets = np.cumsum([0] + [rows.n_rows for rows in classes])
        self.n_rows = int(offsets[-1])
        row_ids = np.concatenate(
            [np.concatenate([r.neg_rows, r.pos_rows]) + o for r, o in zip(classes, offsets[:-1], strict=True)]
        )
        images = np.concatenate([np.concatenate([rows.neg_images, rows.pos_images]) for rows in classes])
        indptr = np.zeros(self.n_rows + 1, dtype=np.int64)
        np.cumsum(np.bincount(row_ids, minlength=self.n_rows), out=indptr[1:])
        self.matrix = sp.csr_matrix(
            (np.ones(len(images), dtype=np.int64), columns[images], indptr), shape=(self.n_rows, n_items)
        )
        self.blocks = [
            (int(o), int(o) + rows.neg_block, int(o) + rows.n_rows)
            for rows, o in zip(classes, offsets[:-1], strict=True)
        ]
        n_thresholds = len(thresholds[0]) if n_classes else 0
        reads = []  # per class: positive total, negative total, tp and fp at each threshold
        self.group_rows, self.segment_rows, self.tied = [], [], []
        for rows, o in zip(classes, offsets[:-1], strict=True):
            lay = rows.layout
            seg = np.concatenate([[0], rows.segment_row]) + o  # seg[s + 1]: last negative row at or before s
            grp = np.concatenate([[0], rows.group_row]) + o  # grp[g + 1]: last row of group g; grp[0]: empty
            reads.append(
                [grp[lay.n_groups], seg[lay.n_segments]]
                + [grp[g] for g in lay.threshold_groups]
                + [seg[s] for s in lay.threshold_segments]
            )
            self.group_rows.append(grp[1:])
            self.segment_rows.append(seg)
            hi, lo = seg[lay.group_segment + 1], seg[lay.group_segment]  # through the group's segment, before it
            tied = np.flatnonzero(hi != lo)  # groups whose segment holds negatives (tied with a positive)
            self.tied.append((tied, hi[tied], lo[tied]))
        self.n_thresholds = n_thresholds
        self.reads = np.array(reads, dtype=np.int64).reshape(n_classes, 2 + 2 * n_thresholds)
        self._by_image: sp.csc_matrix | None = None
        self._by_image_lock = threading.Lock()
        self._local = threading.local()  # scratch arrays per thread: the suite evaluates chunks on several threads

    def chunk(self, counts: np.ndarray, single_sums: bool = False) -> RankingChunk:
        """Statistics of a chunk of resamples.

        One product for all classes, then class by class: widen its rows, add back clipped counts, prefix-sum, read
        the summary statistics and compute AP/AUROC while the class's rows are still in cache (the widened array of
        a chunk is tens of MB; touching it once per class instead of once per step took about a third less time at
        150k x 30, measured).

        Args:
            counts: ``(b, N)`` non-negative integer counts, columns as ``columns``. Counts above ``CLIP`` are clipped
                in place (their excess is added back to the sums exactly), so pass a copy to keep them.
            single_sums: sum each resample's AP as ``einsum`` sums one resample alone (``RankingChunk``), as the
                landed path did when its chunks held one resample.
        """
        b = counts.shape[0]
        packing = self.packing
        excess = None
        if counts.max(initial=0) > CLIP:
            resample, image = np.nonzero(counts > CLIP)
            excess = self._excess_entries(resample, image, counts[resample, image] - CLIP)
            counts[resample, image] = CLIP
        width = packing.width(b)
        packed = packing.pack(
            counts,
            out=self._scratch("packed", (self.n_items, width), np.int64),
            scratch=self._scratch("pack_rows", (width + 1, self.n_items), np.int64),
        )
        narrow = self._product(packed, self._scratch("narrow", (self.n_rows, width), np.int64))  # (R, width)
        wide = self._scratch("wide", (packing.group, self.n_rows, width), np.int64)
        chunk = RankingChunk(self, wide, b, single_sums)
        for c, (start, middle, stop) in enumerate(self.blocks):
            for lo, hi in ((start, middle), (middle, stop)):
                for sub in range(lo, hi, ROW_BLOCK):
                    rows = slice(sub, min(sub + ROW_BLOCK, hi))
                    packing.widen(narrow[rows], out=chunk.wide[:, rows])
                    if excess is not None:
                        self._add_excess(chunk.wide, rows, *excess)
                    carried = slice(sub - 1 if sub > lo else sub, rows.stop)  # the previous row holds its sum
                    np.cumsum(chunk.wide[:, carried], axis=1, out=chunk.wide[:, carried])
            chunk.finish_class(c)
        return chunk

    def _scratch(self, name: str, shape: tuple[int, ...], dtype: type) -> np.ndarray:
        """A work array kept from chunk to chunk: at 150,000 images a chunk's arrays are ~150 MB, and fresh ones
        are zeroed page by page by the kernel every chunk (a sixth of the time, measured). The previous chunk's
        ``RankingChunk`` reads ``wide``, so it is valid until the same thread's next ``chunk`` call."""
        work = getattr(self._local, "work", None)
        if work is None:
            work = self._local.work = {}
        array = work.get(name)
        if array is None or array.shape != shape:
            array = work[name] = np.empty(shape, dtype=dtype)
        return array

    def _product(self, packed: np.ndarray, out: np.ndarray) -> np.ndarray:
        """``matrix @ packed`` into ``out`` (same integers; SciPy's own kernel, minus its fresh output array)."""
        if _csr_matvecs is None:
            out[:] = self.matrix @ packed
            return out
        out[:] = 0
        m = self.matrix
        _csr_matvecs(m.shape[0], m.shape[1], packed.shape[1], m.indptr, m.indices, m.data, packed.ravel(), out.ravel())
        return out

    def _excess_entries(
        self, resample: np.ndarray, image: np.ndarray, excess: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(rows, columns, values)`` to add to the widened sums for what ``CLIP`` cut off, sorted by row."""
        with self._by_image_lock:
            if self._by_image is None:
                self._by_image = self.matrix.tocsc()
        by_image = self._by_image
        starts, stops = by_image.indptr[image], by_image.indptr[image + 1]
        lengths = stops - starts
        packing = self.packing
        lane = resample % packing.lanes
        plane_column = resample // packing.lanes * packing.group + lane % packing.group  # column * group + plane
        value = excess.astype(np.int64) << (lane // packing.group * packing.spacing)
        first = np.cumsum(lengths) - lengths
        positions = np.repeat(starts - first, lengths) + np.arange(lengths.sum())
        rows = by_image.indices[positions]
        order = np.argsort(rows, kind="stable")
        return rows[order], np.repeat(plane_column, lengths)[order], np.repeat(value, lengths)[order]

    @staticmethod
    def _add_excess(wide: np.ndarray, rows: slice, entry_rows: np.ndarray, columns: np.ndarray, values: np.ndarray):
        """Add the clipped-off counts of the rows in ``rows`` (rare: Poisson(1) counts above ``CLIP``)."""
        lo, hi = np.searchsorted(entry_rows, [rows.start, rows.stop])
        if hi > lo:
            column, plane = np.divmod(columns[lo:hi], wide.shape[0])
            np.add.at(wide, (plane, entry_rows[lo:hi], column), values[lo:hi])


ROW_BLOCK = 2**14
"""Rows widened and prefix-summed at a time (a few MB), so each step reads what the previous one just wrote."""


class RankingChunk:
    """Prefix-summed wide lanes of one chunk, and the per-class statistics read from them (resample order).

    Attributes:
        positives, negatives: ``(C, b)`` total positive/negative weight of each class.
        tp, fp: ``(C, T, b)`` weights at or above each planned threshold.
    """

    def __init__(self, ranking: SuiteRanking, wide: np.ndarray, b: int, single_sums: bool = False):
        self.ranking, self.wide, self.b = ranking, wide, b
        self.single_sums = single_sums or b == 1
        packing = ranking.packing
        self.order = np.argsort(packing.column_resamples(wide.shape[2]))[:b]  # column of each resample
        n_classes, t = len(ranking.layouts), ranking.n_thresholds
        self.positives, self.negatives = np.zeros((n_classes, b)), np.zeros((n_classes, b))
        self.tp, self.fp = np.zeros((n_classes, t, b)), np.zeros((n_classes, t, b))
        self._ap_auroc: list[tuple[np.ndarray, np.ndarray] | None] = [None] * n_classes

    def finish_class(self, c: int) -> None:
        """Read class ``c``'s statistics once its rows are prefix-summed."""
        reads = self.unpack_rows(self.ranking.reads[c])
        t = self.ranking.n_thresholds
        self.positives[c], self.negatives[c] = reads[0], reads[1]
        self.tp[c], self.fp[c] = reads[2 : 2 + t], reads[2 + t :]
        self._ap_auroc[c] = self._compute_ap_auroc(c)

    def unpack_rows(self, rows: np.ndarray) -> np.ndarray:
        """``(len(rows), b)`` float64 prefix sums at ``rows`` of the stacked matrix."""
        packing = self.ranking.packing
        return packing.unpack(packing.rows(self.wide, rows))[:, self.order]

    def stats(self, c: int, residual: np.ndarray) -> ClassStats:
        """Class ``c``'s full ``ClassStats`` (for a metric that reads more than the summary statistics)."""
        tp_cum = self.unpack_rows(self.ranking.group_rows[c])
        pos = tp_cum.copy()
        pos[1:] -= tp_cum[:-1]
        return ClassStats(neg_cum=self.unpack_rows(self.ranking.segment_rows[c][1:]), pos=pos, tp_cum=tp_cum,
                          residual=residual)  # fmt: skip

    def ap_auroc(self, c: int) -> tuple[np.ndarray, np.ndarray]:
        """``(ap, auroc)`` of class ``c``, each ``(b,)`` (see ``_compute_ap_auroc``)."""
        return self._ap_auroc[c]

    def _compute_ap_auroc(self, c: int) -> tuple[np.ndarray, np.ndarray]:
        """``ap_auroc`` of class ``c``, bit for bit.

        Per positive group ``g`` (``A_g`` cumulative positive weight, ``P_g = A_g + F_g`` cumulative weight of all
        labelled images, ``a_g`` the group's positive weight): AP sums ``a_g A_g / P_g`` over ``g`` in order, as
        ``einsum`` sums a ``(G, b)`` pair (one running sum per resample; carried from block to block as a leading
        row ``1 * sum``, so blocks change nothing), and for ``b = 1`` (or ``single_sums``) one resample at a time over
        the whole class, as the landed
        point estimate did. AUROC needs ``sum_g a_g (F_g + F'_g)``, with ``F'_g`` the negative weight strictly above
        the group; it is ``2 sum_g a_g F_g - sum_g a_g t_g`` (``t_g``: negatives tied with the group, only for
        groups that have any). These are sums of integers below ``2**53``, exact in float64 in any order, so the AUROC
        is the landed one exactly.
        """
        ranking = self.ranking
        packing = ranking.packing
        w_pos, w_neg = self.positives[c], self.negatives[c]
        rows = ranking.group_rows[c]
        if len(rows) == 0:
            return np.full(self.b, np.nan), np.full(self.b, np.nan)
        lay = ranking.layouts[c]
        f_rows = ranking.segment_rows[c][lay.group_segment + 1]
        tied, tied_hi, tied_lo = ranking.tied[c]
        planes = self.wide  # (group, R, width): each plane holds width * per_group resamples, see column_resamples
        width = planes.shape[2]
        b_plane = width * packing.per_group
        step = len(rows) if self.single_sums else max(1, GROUP_BLOCK_ELEMENTS // b_plane)
        tiny = np.finfo(np.float64).tiny
        scratch = ranking._scratch
        sums = np.zeros((3, planes.shape[0], b_plane))  # AP sum, sum a F, sum a t per plane
        for r, plane in enumerate(planes):
            if self.b == 1 and r:  # the point estimate's one resample is in plane 0, column 0
                break
            ap_sum, a_f, a_t = sums[:, r]
            before = np.zeros(b_plane)  # A at the end of the previous block
            for g0 in range(0, len(rows), step):
                g1 = min(g0 + step, len(rows))
                n = g1 - g0
                if rows[g1 - 1] - rows[g0] == n - 1:  # groups of one row each: their rows are a range, no gather
                    cum_a = plane[rows[g0] : rows[g1 - 1] + 1]
                else:
                    cum_a = np.take(plane, rows[g0:g1], axis=0, out=scratch("cum_a", (n, width), np.int64), mode="clip")
                cum_f = np.take(plane, f_rows[g0:g1], axis=0, out=scratch("cum_f", (n, width), np.int64), mode="clip")
                a_cum = scratch("a_cum", (n + 1, b_plane), np.float64)  # row 0: the running AP sum's carrier
                lane = scratch("lane", (n * width,), np.int64)
                packing.unpack(cum_a, out=a_cum[1:], work=lane)
                p_cum = packing.unpack(cum_f, out=scratch("p_cum", (n, b_plane), np.float64), work=lane)  # F
                a = scratch("a", (n + 1, b_plane), np.float64)
                a[0] = 1.0
                np.subtract(a_cum[2:], a_cum[1:-1], out=a[2:])
                np.subtract(a_cum[1], before, out=a[1])
                before = a_cum[-1].copy()
                a_f += np.einsum("gb,gb->b", a[1:], p_cum)
                np.add(p_cum, a_cum[1:], out=p_cum)  # P = A + F
                if len(tied):
                    inside = (tied >= g0) & (tied < g1)
                    if inside.any():
                        hi = np.take(plane, tied_hi[inside], axis=0) - np.take(plane, tied_lo[inside], axis=0)
                        a_t += np.einsum("gb,gb->b", a[1 + tied[inside] - g0], packing.unpack(hi))
                # tp / predicted, 0 where nothing is predicted (then tp = 0, and 0 / tiny = 0). P never decreases
                # down the groups, so only a leading run of rows can hold a 0: found by bisection, not a pass.
                zero_rows = _leading_rows_with_zero(p_cum)
                if zero_rows:
                    np.maximum(p_cum[:zero_rows], tiny, out=p_cum[:zero_rows])
                np.divide(a_cum[1:], p_cum, out=a_cum[1:])
                a_cum[0] = ap_sum
                if self.single_sums:  # one (G, 1) einsum per resample, over the whole class
                    for k in range(1 if self.b == 1 else b_plane):
                        column = (np.ascontiguousarray(x[1:, k : k + 1]) for x in (a, a_cum))
                        ap_sum[k] = np.einsum("gb,gb->b", *column)[0]
                else:
                    ap_sum[:] = np.einsum("gb,gb->b", a, a_cum)
        ap_sum, a_f, a_t = (s.ravel() for s in sums)
        ap_sum, a_f, a_t = ap_sum[self.order], a_f[self.order], a_t[self.order]
        pairs = 2.0 * a_f - a_t  # sum_g a_g (F_g + F'_g)
        with np.errstate(invalid="ignore", divide="ignore"):
            ap = ap_sum / w_pos
            auroc = (w_neg * w_pos - 0.5 * pairs) / (w_pos * w_neg)
        ap[w_pos <= 0] = np.nan
        auroc[(w_pos <= 0) | (w_neg <= 0)] = np.nan
        return ap, auroc
