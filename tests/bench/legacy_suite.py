"""The bootstrap path of ``evaluation.suite.compute_suite`` as landed before issue 31, frozen for side-by-side timing.

Why a frozen copy: the speed target (issue 31: bootstrap CIs on 150,000 x 30 at least 4x faster than the landed
code) is a ratio measured in one run by ``tests/bench/bench_metrics.py``, and the unit tests check that the new path
gives the same replicates. Both need the old path unchanged, so its resample generation (one ``strata_members`` and
one float64 ``bincount`` per resample, per chunk), its per-class float64 sparse products over ``(N, ~6)`` count
chunks, its prefix sums and its AP/AUROC arithmetic are copied here verbatim from commit 577f5ed. Only what the
platform shares unchanged (input checks, thresholds, the metric registry's per-class functions, ``SuiteResult``) is
imported. Nothing in the platform imports this module.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import cached_property

import numpy as np
import scipy.sparse as sp

from evaluation.bootstrap import _check_range, _draw, percentile_ci, resample_generator, strata_members
from evaluation.metric_registry import SUITE, ClassChunk
from evaluation.ranking import N_BINS, SortedClass, calibration_bin
from evaluation.suite import (
    DROP_COUNTED,
    DROPPED_SUFFIX,
    LEFT_OUT_SUFFIX,
    SCORED_SUFFIX,
    SuiteResult,
    _class_index,
    validate_inputs,
)
from evaluation.thresholds import DEFAULT_THRESHOLD, thresholds_from_mapping

CHUNK_BYTES = 8 * 2**20


def resample_counts(n_items, n_boot, seed, *, start=0, stop=None, strata=None):
    stop = _check_range(n_items, n_boot, start, stop)
    members = strata_members(strata, n_items)
    out = np.empty((stop - start, n_items), dtype=np.float64)
    for row, b in enumerate(range(start, stop)):
        out[row] = np.bincount(_draw(resample_generator(seed, b), n_items, members), minlength=n_items)
    return out


def auto_chunk(n_items, n_boot, chunk_bytes=CHUNK_BYTES):
    return int(max(1, min(max(int(n_boot), 1), chunk_bytes // (8 * max(int(n_items), 1)))))


def iter_count_chunks(n_items, n_boot, seed, chunk, strata=None):
    for start in range(0, n_boot, chunk):
        stop = min(start + chunk, n_boot)
        yield slice(start, stop), resample_counts(n_items, n_boot, seed, start=start, stop=stop, strata=strata)


class LegacyStats:
    def __init__(self, neg_cum, pos, tp_cum, residual):
        self.neg_cum, self.pos, self.tp_cum, self.residual = neg_cum, pos, tp_cum, residual

    @property
    def negatives(self):
        return self.neg_cum[-1] if len(self.neg_cum) else np.zeros(self.residual.shape[1])

    @property
    def positives(self):
        return self.tp_cum[-1] if len(self.tp_cum) else np.zeros(self.residual.shape[1])

    @property
    def total(self):
        return self.positives + self.negatives


class LegacyPlan:
    """``ClassPlan`` as landed: one float64 ``(S + G + n_bins, N)`` matrix per class."""

    def __init__(self, y, p, thresholds=(), n_bins=N_BINS):
        sc = SortedClass.build(y, p)
        n, n_items = sc.n, len(y)
        cut_at = np.array([sc.count_at_or_above(t) for t in thresholds], dtype=np.int64)
        cuts = np.unique(np.concatenate([np.array([0, n]), sc.pos_group_start, sc.pos_group_end + 1, cut_at]))
        n_segments = max(len(cuts) - 1, 0)
        segment = np.searchsorted(cuts, np.arange(n), side="right") - 1
        group_segment = np.searchsorted(cuts, sc.pos_group_start)
        n_groups = len(group_segment)
        is_pos = sc.y == 1
        row = segment.copy()
        row[is_pos] = n_segments + np.searchsorted(group_segment, segment[is_pos])
        bins = calibration_bin(sc.p, n_bins)
        rows = np.concatenate([row, n_segments + n_groups + bins])
        cols = np.concatenate([sc.index, sc.index])
        data = np.concatenate([np.ones(n), sc.y - sc.p])
        self.matrix = sp.csr_matrix((data, (rows, cols)), shape=(n_segments + n_groups + n_bins, n_items))
        self.n_segments, self.n_groups, self.n_bins, self.n_labelled = n_segments, n_groups, n_bins, n
        self.group_segment = group_segment.astype(np.int64)
        self.thresholds = tuple(float(t) for t in thresholds)
        cut_index = np.searchsorted(cuts, cut_at)
        self.threshold_segments = cut_index.astype(np.int64)
        self.threshold_groups = np.searchsorted(group_segment, cut_index).astype(np.int64)

    def stats(self, counts_t):
        out = self.matrix @ counts_t
        s, g = self.n_segments, self.n_groups
        return LegacyStats(np.cumsum(out[:s], axis=0), out[s : s + g], np.cumsum(out[s : s + g], axis=0), out[s + g :])


def ap_auroc(plan, stats):
    w_pos, w_neg = stats.positives, stats.negatives
    if plan.n_groups == 0:
        return np.full(len(w_pos), np.nan), np.full(len(w_pos), np.nan)
    a, tp = stats.pos, stats.tp_cum
    fp = stats.neg_cum[plan.group_segment]
    fp_before = np.zeros_like(fp)
    above = plan.group_segment > 0
    fp_before[above] = stats.neg_cum[plan.group_segment[above] - 1]
    predicted = tp + fp
    precision = np.divide(tp, predicted, out=np.zeros_like(tp), where=predicted > 0)
    with np.errstate(invalid="ignore", divide="ignore"):
        ap = np.einsum("gb,gb->b", a, precision) / w_pos
        auroc = (w_neg * w_pos - 0.5 * np.einsum("gb,gb->b", a, fp + fp_before)) / (w_pos * w_neg)
    ap[w_pos <= 0] = np.nan
    auroc[(w_pos <= 0) | (w_neg <= 0)] = np.nan
    return ap, auroc


class LegacyChunk(ClassChunk):
    @cached_property
    def ap_auroc(self):
        return ap_auroc(self.plan, self.stats)


def _evaluate(plans, counts_t, threshold, val_thresholds, per_class, pooled):
    b, n_classes = counts_t.shape[1], len(plans)
    out = {metric.key: np.full((b, n_classes), np.nan) for metric in per_class}
    sums = {}
    for c, plan in enumerate(plans):
        if plan.n_labelled == 0:
            continue
        val_threshold = None if val_thresholds is None else float(val_thresholds[c])
        chunk = LegacyChunk(plan, plan.stats(counts_t), threshold, val_threshold)
        for metric in per_class:
            out[metric.key][:, c] = metric.compute(chunk)
        for metric in pooled:
            stats = metric.compute(chunk)
            sums[metric.name] = sums[metric.name] + stats if metric.name in sums else stats
    nan = np.full(b, np.nan)
    return out, {m.name: m.reduce(sums[m.name]) if m.name in sums else nan.copy() for m in pooled}


def legacy_compute_suite(
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
) -> SuiteResult:
    """``compute_suite`` as landed (same arguments, same ``SuiteResult``)."""
    targets, probs = validate_inputs(targets, probs, labels)
    labels = tuple(labels)
    thresholds = None if val_thresholds is None else thresholds_from_mapping(val_thresholds, labels)
    for members in (class_groups or {}).values():
        for cls in members:
            _class_index(cls, labels)
    n_items, n_classes = probs.shape
    n_boot = int(n_boot)
    strata_members(strata, n_items)
    plans = []
    for c in range(n_classes):
        planned = (threshold,) if thresholds is None else (threshold, float(thresholds[c]))
        plans.append(LegacyPlan(targets[:, c], probs[:, c], thresholds=planned, n_bins=n_bins))
    registered = SUITE.per_class(val_thresholds=thresholds is not None), SUITE.pooled()
    point, pooled_point = _evaluate(plans, np.ones((n_items, 1)), threshold, thresholds, *registered)
    replicates = {key: np.full((n_boot, n_classes), np.nan) for key in point}
    pooled_replicates = {name: np.full(n_boot, np.nan) for name in pooled_point}
    if n_boot:
        chunks = iter_count_chunks(n_items, n_boot, seed, chunk or auto_chunk(n_items, n_boot), strata=strata)
        for rows, counts in chunks:
            values, pooled = _evaluate(plans, np.ascontiguousarray(counts.T), threshold, thresholds, *registered)
            for key, array in values.items():
                replicates[key][rows] = array
            for name, array in pooled.items():
                pooled_replicates[name][rows] = array
    result = SuiteResult(
        metrics={}, labels=labels, per_class={key: values[0] for key, values in point.items()},
        replicates=replicates, pooled_replicates=pooled_replicates, val_thresholds=thresholds, n_boot=n_boot,
        seed=int(seed), ci=float(ci),
    )  # fmt: skip
    metrics = result.metrics
    for key in point:
        value, low, high = result.macro(key)
        name = SUITE.by_key(key).name
        metrics[name] = value
        if n_boot:
            metrics[f"{name}_ci_low"], metrics[f"{name}_ci_high"] = low, high
            if name in DROP_COUNTED:
                metrics[f"{name}{DROPPED_SUFFIX}"] = result.resamples_dropping_a_class(key)
        if name in DROP_COUNTED:
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
