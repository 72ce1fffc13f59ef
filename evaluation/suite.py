"""The challenge's metric suite with case-level bootstrap CIs, in one vectorised pass over chunks of resamples.

Metrics: docs/rules.md §2-§3; the readings the paper leaves open (threshold side ``prob >= t``, ECE bins, which
AP) are named in :mod:`evaluation.conventions`. Entries with target -1 are left out per class; a class without
a positive (AUROC: or without a negative) is left out of a macro mean, per resample too.

Why it is fast: each class is sorted once; a resample is a vector of per-image counts, and every metric of the
resampled data is a count-weighted metric on the original sorted order (``evaluation.ranking``), one sparse
product per class and chunk. Memory is bounded by the chunk size whatever ``n_boot`` is. Per-resample values
are kept, so macro CIs of any subset of classes reuse the same resamples. The metrics are those of
``evaluation.metric_registry.SUITE``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from evaluation.bootstrap import auto_chunk, iter_count_chunks, percentile_ci, strata_members
from evaluation.metric_registry import AP_RULES, SUITE, ClassChunk, SuiteMetric
from evaluation.ranking import N_BINS, ClassPlan
from evaluation.thresholds import DEFAULT_THRESHOLD, thresholds_from_mapping

#: Macros whose bootstrap also reports how many resamples left out a class (``mAP_resamples_dropping_a_class``):
#: mAP for the no-positive rule every per-class metric shares, mAUROC for its no-positive-or-no-negative rule.
DROP_COUNTED = ("mAP", "mAUROC")
DROPPED_SUFFIX = "_resamples_dropping_a_class"
LEFT_OUT_SUFFIX = "_classes_left_out"  # classes the full set defines no value for: out of the point estimate
#: Classes entering the point estimate: with ``LEFT_OUT_SUFFIX``, the note's "2 of 30" for a set that logs no
#: per-class values (``test_perturbed``, ``test_tta``, ``heldout``, or ``evaluation.per_class_metrics=false``).
SCORED_SUFFIX = "_classes_scored"
COUNT_SUFFIXES = (LEFT_OUT_SUFFIX, SCORED_SUFFIX, DROPPED_SUFFIX)  # the counts every metric set logs


@dataclass(frozen=True)
class SuiteResult:
    """Flat metrics plus the per-class point values and per-resample values behind them.

    Attributes:
        metrics: flat ``{name: value}`` ready for MLflow (macro means with ``_ci_low``/``_ci_high``, per-class
            ``<metric>/<class>`` for the classes entering the macro mean, ``group/<g>/<macro>``). Macro means over
            no defined class are NaN.
        per_class: ``{metric: (C,)}`` point values, NaN where the class is undefined for that metric.
        replicates: ``{metric: (B, C)}`` values in each resample, NaN where undefined in that resample.
    """

    metrics: dict[str, float]
    labels: tuple[str, ...]
    per_class: dict[str, np.ndarray]
    replicates: dict[str, np.ndarray]
    pooled_replicates: dict[str, np.ndarray]
    val_thresholds: np.ndarray | None = None
    n_boot: int = 0
    seed: int = 0
    ci: float = 0.95

    def _columns(self, classes: Sequence[int | str] | None) -> np.ndarray:
        if classes is None:
            return np.arange(len(self.labels))
        return np.array([_class_index(cls, self.labels) for cls in classes], dtype=np.int64)

    def macro(self, metric: str, classes: Sequence[int | str] | None = None) -> tuple[float, float, float]:
        """Macro mean of ``metric`` over ``classes`` (indices or names; all by default) with its bootstrap CI.

        Args:
            metric: per-class key (``"ap"``) or macro name (``"mAP"``).
            classes: subset of classes, e.g. one head-to-tail group.

        Returns:
            ``(point, ci_low, ci_high)``; the CI is NaN when ``n_boot`` is 0.
        """
        key = SUITE.by_key(metric).key
        if key not in self.per_class:
            raise ValueError(f"metric {metric!r} was not computed (val_thresholds missing?)")
        cols = self._columns(classes)
        point = float(_macro(self.per_class[key][None, cols])[0])
        if self.n_boot == 0:
            return point, float("nan"), float("nan")
        low, high = percentile_ci(_macro(self.replicates[key][:, cols]), self.ci)
        return point, low, high

    def resamples_dropping_a_class(self, metric: str) -> int:
        """How many resamples left out a class that the full test set defines for ``metric``.

        A resample without a rare class averages over fewer, usually easier classes, so many such resamples can push
        the interval above its own point estimate (docs/rules.md §3).
        """
        key = SUITE.by_key(metric).key
        if self.n_boot == 0:
            return 0
        defined = np.isfinite(self.per_class[key])  # (C,)
        return int((np.isnan(self.replicates[key]) & defined).any(axis=1).sum())

    def group_metrics(self, groups: Mapping[str, Sequence[int | str]]) -> dict[str, float]:
        """``group/<g>/<macro>`` with ``_ci_low``/``_ci_high`` for every macro metric, from the same resamples."""
        out: dict[str, float] = {}
        for group, members in groups.items():
            for key in self.per_class:
                point, low, high = self.macro(key, members)
                name = f"group/{group}/{SUITE.by_key(key).name}"
                out[name] = point
                if self.n_boot:
                    out[f"{name}_ci_low"], out[f"{name}_ci_high"] = low, high
        return out


def _class_index(cls: int | str, labels: Sequence[str]) -> int:
    if isinstance(cls, str):
        if cls not in labels:
            raise ValueError(f"unknown class {cls!r} in class_groups")
        return list(labels).index(cls)
    index = int(cls)
    if not 0 <= index < len(labels):
        raise ValueError(f"class index {index} in class_groups is out of range for {len(labels)} classes")
    return index


def _macro(values: np.ndarray) -> np.ndarray:
    """Mean over classes (axis 1) of the defined (finite) values: ``(B, C)`` -> ``(B,)``; NaN where none is."""
    defined = np.isfinite(values)
    count = defined.sum(axis=1)
    total = np.where(defined, values, 0.0).sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(count > 0, total / np.maximum(count, 1), np.nan)


def validate_inputs(targets: np.ndarray, probs: np.ndarray, labels: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """Check shapes and values, naming the first offending row/column; returns float64 copies-or-views.

    Raises:
        ValueError: shape mismatch, label count mismatch, empty input, non-finite or out-of-[0, 1] probabilities,
            or targets outside {-1, 0, 1}.
    """
    targets = np.asarray(targets)
    probs = np.asarray(probs)
    if probs.ndim != 2:
        raise ValueError(f"probs must be a 2-D (N, C) array, got shape {probs.shape}")
    if targets.shape != probs.shape:
        raise ValueError(f"targets shape {targets.shape} does not match probs shape {probs.shape}")
    if len(labels) != probs.shape[1]:
        raise ValueError(f"got {len(labels)} labels for {probs.shape[1]} columns of targets/probs")
    if probs.shape[0] == 0 or probs.shape[1] == 0:
        raise ValueError(f"targets/probs need at least one row and one column, got shape {probs.shape}")
    if targets.dtype.kind not in "biuf" or probs.dtype.kind not in "biuf":
        raise ValueError(f"targets/probs must be numeric, got dtypes {targets.dtype} and {probs.dtype}")
    probs = probs.astype(np.float64, copy=False)
    bad = ~np.isfinite(probs)
    if bad.any():
        row, col = np.argwhere(bad)[0]
        raise ValueError(
            f"probs has a non-finite value ({probs[row, col]}) at row {row}, column {col} ({labels[col]!r})"
        )
    bad = (probs < 0) | (probs > 1)
    if bad.any():
        row, col = np.argwhere(bad)[0]
        raise ValueError(f"probs must lie in [0, 1]; row {row}, column {col} ({labels[col]!r}) has {probs[row, col]}")
    bad = ~np.isin(targets, (-1, 0, 1))
    if bad.any():
        row, col = np.argwhere(bad)[0]
        raise ValueError(
            f"targets must be -1 (not labelled), 0 or 1; row {row}, column {col} ({labels[col]!r}) has "
            f"{targets[row, col]}"
        )
    return targets.astype(np.int8), probs


def _evaluate(
    plans: list[ClassPlan],
    counts_t: np.ndarray,
    threshold: float,
    val_thresholds: np.ndarray | None,
    per_class: tuple[SuiteMetric, ...],
    pooled: tuple[SuiteMetric, ...],
    ap: str = "step",
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """Every registered metric for a chunk of count vectors ``(N, b)``: ``{key: (b, C)}`` and ``{pooled: (b,)}``.

    A class without a labelled entry is left out of everything; a pooled metric over no labelled pair is NaN.
    """
    b, n_classes = counts_t.shape[1], len(plans)
    out = {metric.key: np.full((b, n_classes), np.nan) for metric in per_class}
    sums: dict[str, np.ndarray] = {}  # pooled name -> statistics summed over the classes so far
    for c, plan in enumerate(plans):
        if plan.n_labelled == 0:
            continue
        val_threshold = None if val_thresholds is None else float(val_thresholds[c])
        chunk = ClassChunk(plan, plan.stats(counts_t), threshold, val_threshold, ap)
        for metric in per_class:
            out[metric.key][:, c] = metric.compute(chunk)
        for metric in pooled:
            stats = metric.compute(chunk)
            sums[metric.name] = sums[metric.name] + stats if metric.name in sums else stats
    nan = np.full(b, np.nan)
    return out, {m.name: m.reduce(sums[m.name]) if m.name in sums else nan.copy() for m in pooled}


def compute_suite(
    targets: np.ndarray,
    probs: np.ndarray,
    labels: Sequence[str],
    *,
    n_boot: int = 1000,
    seed: int = 0,
    threshold: float = DEFAULT_THRESHOLD,
    val_thresholds: Sequence[float] | Mapping[str, float] | np.ndarray | None = None,
    ci: float = 0.95,
    chunk: int | None = None,
    class_groups: Mapping[str, Sequence[int | str]] | None = None,
    n_bins: int = N_BINS,
    strata: Sequence | np.ndarray | None = None,
    ap: str = "step",
) -> SuiteResult:
    """Every challenge metric with bootstrap CIs on one split.

    Args:
        targets: ``(N, C)`` in {-1, 0, 1}; -1 = not labelled, left out for that class.
        n_boot: number of case-level resamples; 0 skips the CIs.
        threshold: fixed decision threshold; positive iff ``prob >= threshold``.
        val_thresholds: per-class thresholds chosen on validation (``(C,)`` or ``{class: threshold}``); adds the
            ``*_valthr`` metrics. They stay fixed across resamples, so those CIs reflect test-set sampling only.
        strata: ``(N,)`` label per image; each resample then keeps every stratum's image count.
        ap: ``"step"`` (scikit-learn's), ``"voc_all"`` or ``"voc_11"`` (``evaluation.ranking.interpolated_ap``).
    """
    targets, probs = validate_inputs(targets, probs, labels)
    labels = tuple(labels)
    if not np.isfinite(threshold) or not 0.0 <= threshold <= 1.0:
        raise ValueError(f"threshold must be in [0, 1], got {threshold}")
    if int(n_boot) != n_boot or n_boot < 0:
        raise ValueError(f"n_boot must be a non-negative integer, got {n_boot}")
    if not 0.0 < ci < 1.0:
        raise ValueError(f"ci must be in (0, 1), got {ci}")
    if int(n_bins) != n_bins or n_bins < 1:
        raise ValueError(f"n_bins must be a positive integer, got {n_bins}")
    if chunk is not None and chunk < 1:
        raise ValueError(f"chunk must be >= 1, got {chunk}")
    if ap not in AP_RULES:
        raise ValueError(f"ap must be one of {sorted(AP_RULES)}, got {ap!r}")
    thresholds = None if val_thresholds is None else thresholds_from_mapping(val_thresholds, labels)
    for members in (class_groups or {}).values():
        for cls in members:
            _class_index(cls, labels)  # raises on an unknown class
    n_items, n_classes = probs.shape
    n_boot = int(n_boot)
    strata_members(strata, n_items)  # raises on a strata array of the wrong length, with or without resamples
    plans = []
    for c in range(n_classes):
        planned = (threshold,) if thresholds is None else (threshold, float(thresholds[c]))
        plans.append(ClassPlan.build(targets[:, c], probs[:, c], thresholds=planned, n_bins=n_bins))
    registered = SUITE.per_class(val_thresholds=thresholds is not None), SUITE.pooled()
    point, pooled_point = _evaluate(plans, np.ones((n_items, 1)), threshold, thresholds, *registered, ap)
    replicates = {key: np.full((n_boot, n_classes), np.nan) for key in point}
    pooled_replicates = {name: np.full(n_boot, np.nan) for name in pooled_point}
    if n_boot:
        chunks = iter_count_chunks(n_items, n_boot, seed, chunk or auto_chunk(n_items, n_boot), strata=strata)
        for rows, counts in chunks:
            values, pooled = _evaluate(plans, np.ascontiguousarray(counts.T), threshold, thresholds, *registered, ap)
            for key, array in values.items():
                replicates[key][rows] = array
            for name, array in pooled.items():
                pooled_replicates[name][rows] = array

    result = SuiteResult(
        metrics={},
        labels=labels,
        per_class={key: values[0] for key, values in point.items()},
        replicates=replicates,
        pooled_replicates=pooled_replicates,
        val_thresholds=thresholds,
        n_boot=n_boot,
        seed=int(seed),
        ci=float(ci),
    )
    metrics = result.metrics
    for key in point:
        value, low, high = result.macro(key)
        name = SUITE.by_key(key).name
        metrics[name] = value
        if n_boot:
            metrics[f"{name}_ci_low"], metrics[f"{name}_ci_high"] = low, high
            if name in DROP_COUNTED:
                metrics[f"{name}{DROPPED_SUFFIX}"] = result.resamples_dropping_a_class(key)
        if name in DROP_COUNTED:  # the classes the point estimate itself leaves out (evaluation.intervals)
            metrics[f"{name}{LEFT_OUT_SUFFIX}"] = int(np.isnan(result.per_class[key]).sum())
            metrics[f"{name}{SCORED_SUFFIX}"] = int(np.isfinite(result.per_class[key]).sum())
    for name, values in pooled_point.items():
        metrics[name] = float(values[0])
        if n_boot:
            metrics[f"{name}_ci_low"], metrics[f"{name}_ci_high"] = percentile_ci(pooled_replicates[name], ci)
    for key, values in result.per_class.items():
        for name, value in zip(labels, values, strict=True):
            if np.isfinite(value):
                metrics[f"{key}/{name}"] = float(value)
    if class_groups is not None:
        metrics.update(result.group_metrics(class_groups))
    return result


def group_metrics(result: SuiteResult, groups: Mapping[str, Sequence[int | str]]) -> dict[str, float]:
    """Macro metrics with CIs per class group from an existing result (same resamples); see ``SuiteResult``."""
    return result.group_metrics(groups)
