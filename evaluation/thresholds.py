"""F1, precision and recall at a threshold (weighted for the bootstrap), and per-class thresholds from validation.

Convention: an image is predicted positive for a class iff ``prob >= threshold`` (so threshold 0.5 calls 0.5
positive), matching scikit-learn's metrics on ``y_pred = prob >= threshold``. Zero division gives 0, as
scikit-learn's ``zero_division=0``: precision is 0 when nothing is predicted positive, recall 0 when there is no
positive, and F1 = ``2 TP / (2 TP + FP + FN)`` is 0 when that denominator is 0.

Because predicted positives are a prefix of the descending score order, the weighted TP/FP of any resample are
read off the cumulative sums of ``evaluation.ranking`` at a fixed position: no extra pass over the data.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from evaluation.ranking import ClassPlan, ClassStats, SortedClass

DEFAULT_THRESHOLD = 0.5


def confusion_at(plan: ClassPlan, stats: ClassStats, threshold: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Weighted true positives, false positives and positives at ``prob >= threshold`` for a chunk of resamples.

    ``threshold`` must be one of ``plan.thresholds`` (the plan cut its segments there).

    Returns:
        ``(tp, fp, positives)``, each ``(b,)``.
    """
    if float(threshold) not in plan.thresholds:
        raise ValueError(f"threshold {threshold} was not planned; the plan has {plan.thresholds}")
    t = plan.thresholds.index(float(threshold))
    b = stats.residual.shape[1]
    segments, groups = plan.threshold_segments[t], plan.threshold_groups[t]
    fp = stats.neg_cum[segments - 1] if segments else np.zeros(b)  # (b,)
    tp = stats.tp_cum[groups - 1] if groups else np.zeros(b)  # (b,)
    return tp, fp, stats.positives


def f1_precision_recall_from_counts(
    tp: np.ndarray, fp: np.ndarray, positives: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """F1, precision and recall from (weighted) confusion counts, with zero division -> 0."""
    tp, fp, positives = (np.asarray(a, dtype=np.float64) for a in (tp, fp, positives))
    fn = positives - tp
    zeros = np.zeros(np.broadcast(tp, fp, positives).shape)
    precision = np.divide(tp, tp + fp, out=zeros.copy(), where=(tp + fp) > 0)
    recall = np.divide(tp, positives, out=zeros.copy(), where=positives > 0)
    f1 = np.divide(2 * tp, 2 * tp + fp + fn, out=zeros.copy(), where=(2 * tp + fp + fn) > 0)
    return f1, precision, recall


def best_f1_threshold(y: np.ndarray, p: np.ndarray, fallback: float = DEFAULT_THRESHOLD) -> float:
    """The threshold maximising F1 of one class on validation data.

    Candidate cut points lie between consecutive distinct scores (every distinct prediction set is one of them).
    The returned threshold is the midpoint between the last score kept positive and the next lower distinct score,
    so that the same validation predictions come out while test scores falling in the gap are split evenly; if the
    midpoint rounds onto the lower score, the kept score itself is used. When every score is kept, the lowest
    score is the threshold. Ties in F1 go to the highest threshold (fewest positive calls).

    Args:
        y: ``(N,)`` targets in {-1, 0, 1}; -1 entries are left out.
        p: ``(N,)`` validation probabilities.
        fallback: returned when the class has no labelled positive on validation (F1 is 0 at every threshold).
    """
    sc = SortedClass.build(y, p)
    n_pos = int(sc.y.sum())
    if n_pos == 0:
        return float(fallback)
    ends = sc.group_ends  # (G_all,) last sorted position of each tie group
    tp = np.cumsum(sc.y)[ends]  # (G_all,)
    f1 = 2 * tp / (ends + 1.0 + n_pos)  # 2TP / (2TP + FP + FN) = 2TP / (predicted + positives)
    g = int(np.argmax(f1))
    kept = sc.p[ends[g]]
    if g + 1 == len(ends):
        return float(kept)
    below = sc.p[ends[g] + 1]
    middle = 0.5 * (kept + below)
    return float(middle if below < middle <= kept else kept)


def select_thresholds(
    val_targets: np.ndarray, val_probs: np.ndarray, fallback: float = DEFAULT_THRESHOLD
) -> np.ndarray:
    """Per-class F1-maximising thresholds chosen on validation (see ``best_f1_threshold``).

    Args:
        val_targets: ``(N, C)`` targets in {-1, 0, 1}.
        val_probs: ``(N, C)`` probabilities.
        fallback: threshold of a class without a labelled validation positive.

    Returns:
        ``(C,)`` thresholds, to pass as ``val_thresholds`` to ``evaluation.suite.compute_suite`` on the test set.
    """
    val_targets, val_probs = np.asarray(val_targets), np.asarray(val_probs, dtype=np.float64)
    if val_targets.shape != val_probs.shape or val_targets.ndim != 2:
        raise ValueError(f"val_targets {val_targets.shape} and val_probs {val_probs.shape} must be the same (N, C)")
    return np.array(
        [best_f1_threshold(val_targets[:, c], val_probs[:, c], fallback) for c in range(val_probs.shape[1])]
    )


def thresholds_from_mapping(thresholds: Sequence[float] | Mapping[str, float], labels: Sequence[str]) -> np.ndarray:
    """``(C,)`` thresholds from a sequence in label order or a ``{class: threshold}`` mapping covering every class."""
    if isinstance(thresholds, Mapping):
        missing = [name for name in labels if name not in thresholds]
        if missing:
            raise ValueError(f"val_thresholds has no threshold for class {missing[0]!r}")
        values = np.array([thresholds[name] for name in labels], dtype=np.float64)
    else:
        values = np.asarray(thresholds, dtype=np.float64).ravel()
        if values.shape != (len(labels),):
            raise ValueError(f"val_thresholds has {values.size} values but there are {len(labels)} labels")
    bad = np.flatnonzero(~np.isfinite(values) | (values < 0) | (values > 1))
    if bad.size:
        raise ValueError(f"val_thresholds must be finite and in [0, 1]; class index {bad[0]} has {values[bad[0]]}")
    return values
