"""Every metric the platform reports, defined once: name, per-class key, function, direction, title, tie-break place.

Why one registry: the suite, the tables, the report, the validation metrics, the benchmarks and the run ranking
all need the same facts about a metric; kept in parallel lists they drift. Two registries, because the two
families are computed on different data: ``SUITE`` (the multi-label challenge suite, per class on a chunk of
bootstrap resamples, reported as macro means or pooled by a map-reduce over classes) and ``BINARY`` (the binary
benchmark metrics, on one set of labels, scores and decisions). Their order is the order of the logged keys and
of the tables.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cached_property
from typing import Generic, Protocol, TypeVar

import numpy as np
from scipy.stats import rankdata

from evaluation.calibration import ece_from_bins
from evaluation.ranking import ClassPlan, ClassStats, ap_auroc, interpolated_ap
from evaluation.thresholds import confusion_at, f1_precision_recall_from_counts

# --- suite metrics: per-class functions over a chunk of resamples ------------------------------------------------

#: AP definitions the suite can compute (``evaluation.conventions.ap``): scikit-learn's step AP, or PASCAL VOC's
#: interpolated AP over all points or 11 recall levels; the value is the number of recall points (None: all).
AP_RULES: dict[str, int | None] = {"step": None, "voc_all": None, "voc_11": 11}


@dataclass
class ClassChunk:
    """One class's sufficient statistics for a chunk of ``b`` resamples: what every suite metric function reads.

    Why an object rather than bare arguments: AP and AUROC come out of one pass over the positive tie groups
    (``ranking.ap_auroc``) and F1, precision and recall out of one confusion read; caching those here lets each be
    its own registry entry without computing anything twice. ``threshold`` is positive at ``prob >= threshold``;
    ``val_threshold`` is ``None`` when none was given.
    """

    plan: ClassPlan
    stats: ClassStats
    threshold: float
    val_threshold: float | None = None
    ap_rule: str = "step"

    @cached_property
    def ap_auroc(self) -> tuple[np.ndarray, np.ndarray]:
        """``(ap, auroc)``, each ``(b,)``, NaN where undefined in that resample."""
        return ap_auroc(self.plan, self.stats)

    @cached_property
    def ap(self) -> np.ndarray:
        """``(b,)`` AP by ``ap_rule``, NaN where undefined."""
        if self.ap_rule == "step":
            return self.ap_auroc[0]
        return interpolated_ap(self.plan, self.stats, AP_RULES[self.ap_rule])

    @cached_property
    def no_positive(self) -> np.ndarray:
        """``(b,)`` resamples without a positive of this class: left out of the macro means (challenge rule)."""
        return self.stats.positives <= 0

    def left_out_without_positive(self, values: np.ndarray) -> np.ndarray:
        """``values`` with NaN where the resample has no positive, so the macro mean skips the class there."""
        return np.where(self.no_positive, np.nan, values)

    @cached_property
    def at_threshold(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(f1, precision, recall)`` at the fixed threshold, each ``(b,)``, NaN without a positive."""
        return self._f1_precision_recall(self.threshold)

    @cached_property
    def at_val_threshold(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(f1, precision, recall)`` at the validation threshold; needs ``val_threshold``."""
        if self.val_threshold is None:
            raise ValueError("this metric needs per-class validation thresholds (compute_suite val_thresholds=...)")
        return self._f1_precision_recall(self.val_threshold)

    def _f1_precision_recall(self, threshold: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        values = f1_precision_recall_from_counts(*confusion_at(self.plan, self.stats, threshold))
        f1, precision, recall = (self.left_out_without_positive(value) for value in values)
        return f1, precision, recall


ClassFn = Callable[[ClassChunk], np.ndarray]
"""``ClassChunk -> (b,)`` for a per-class metric, or ``-> (K, b)`` statistics for a pooled one."""


def class_ap(chunk: ClassChunk) -> np.ndarray:
    return chunk.ap


def class_auroc(chunk: ClassChunk) -> np.ndarray:
    return chunk.ap_auroc[1]


def class_f1(chunk: ClassChunk) -> np.ndarray:
    return chunk.at_threshold[0]


def class_precision(chunk: ClassChunk) -> np.ndarray:
    return chunk.at_threshold[1]


def class_recall(chunk: ClassChunk) -> np.ndarray:
    return chunk.at_threshold[2]


def class_f1_valthr(chunk: ClassChunk) -> np.ndarray:
    return chunk.at_val_threshold[0]


def class_precision_valthr(chunk: ClassChunk) -> np.ndarray:
    return chunk.at_val_threshold[1]


def class_recall_valthr(chunk: ClassChunk) -> np.ndarray:
    return chunk.at_val_threshold[2]


def class_ece(chunk: ClassChunk) -> np.ndarray:
    """ECE is defined without a positive, but the challenge leaves such a class out of every macro mean."""
    return chunk.left_out_without_positive(ece_from_bins(chunk.stats.residual, chunk.stats.total))


def ece_bins(chunk: ClassChunk) -> np.ndarray:
    """``(n_bins + 1, b)``: per-bin ``sum w (y - p)``, then the total weight; summed over classes for pooled ECE."""
    return np.vstack([chunk.stats.residual, chunk.stats.total[None]])


def ece_from_pooled_bins(pooled: np.ndarray) -> np.ndarray:
    """Pooling the pairs sums the classes' bin residuals before the absolute values, hence a reduce after the sum."""
    return ece_from_bins(pooled[:-1], pooled[-1])


@dataclass(frozen=True)
class SuiteMetric:
    """One metric of the multi-label suite.

    Attributes:
        compute: per-class: ``ClassChunk -> (b,)`` value of the class in each resample (NaN = the class is left
            out of that resample's macro mean). Pooled: ``ClassChunk -> (K, b)`` statistics summed over classes.
        key: per-class key (``"ap"``, logged as ``ap/<class>``); ``None`` for a pooled metric.
        reduce: pooled only: the summed ``(K, b)`` statistics to one value per resample ``(b,)``.
        tie_break: place in the challenge's tie-break chain (0 first), ``None`` when not part of it.
    """

    name: str
    title: str
    compute: ClassFn
    key: str | None = None
    reduce: Callable[[np.ndarray], np.ndarray] | None = None
    higher_is_better: bool = True
    tie_break: int | None = None
    needs_val_thresholds: bool = False

    def __post_init__(self) -> None:
        if (self.key is None) == (self.reduce is None):
            raise ValueError(f"metric {self.name!r}: give a per-class key or a pooled reduce, exactly one")

    @property
    def per_class(self) -> bool:
        """Whether the metric is a macro mean of per-class values (else pooled over all (image, class) pairs)."""
        return self.key is not None


# --- binary benchmark metrics ------------------------------------------------------------------------------------


def roc_auc(labels: np.ndarray, scores: np.ndarray) -> float:
    """Area under the ROC curve as the Mann-Whitney statistic with tied scores counting one half.

    Equal to ``sklearn.metrics.roc_auc_score``; NaN when a class is absent.
    """
    labels = np.asarray(labels).astype(bool)
    n_pos = int(labels.sum())
    n_neg = labels.size - n_pos
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    ranks = rankdata(scores)  # average ranks for ties
    return float((ranks[labels].sum() - n_pos * (n_pos + 1) / 2.0) / (n_pos * n_neg))


def average_precision(labels: np.ndarray, scores: np.ndarray) -> float:
    """Average precision, scikit-learn's definition: ``sum_k (R_k - R_{k-1}) P_k`` over distinct thresholds.

    Tied scores form one threshold (no interpolation). NaN when there is no positive.
    """
    labels = np.asarray(labels).astype(np.float64)
    scores = np.asarray(scores, dtype=np.float64)
    if labels.sum() == 0:
        return float("nan")
    order = np.argsort(-scores, kind="mergesort")
    ranked, hits = scores[order], labels[order]
    last_of_threshold = np.r_[np.flatnonzero(np.diff(ranked)), ranked.size - 1]
    true_pos = np.cumsum(hits)[last_of_threshold]
    precision = true_pos / (last_of_threshold + 1)
    recall = true_pos / true_pos[-1]
    return float(np.sum(np.diff(np.r_[0.0, recall]) * precision))


BinaryFn = Callable[[np.ndarray, np.ndarray, np.ndarray], float]
"""``(labels, scores, decisions) -> value``: boolean labels ``(N,)``, ranking scores ``(N,)``, boolean decisions."""


def binary_auroc(labels: np.ndarray, scores: np.ndarray, decisions: np.ndarray) -> float:
    return roc_auc(labels, scores)


def binary_ap(labels: np.ndarray, scores: np.ndarray, decisions: np.ndarray) -> float:
    return average_precision(labels, scores)


def binary_accuracy(labels: np.ndarray, scores: np.ndarray, decisions: np.ndarray) -> float:
    return float(np.mean(decisions == labels)) if labels.size else float("nan")


def binary_sensitivity(labels: np.ndarray, scores: np.ndarray, decisions: np.ndarray) -> float:
    return float(decisions[labels].mean()) if labels.any() else float("nan")


def binary_specificity(labels: np.ndarray, scores: np.ndarray, decisions: np.ndarray) -> float:
    return float((~decisions[~labels]).mean()) if (~labels).any() else float("nan")


@dataclass(frozen=True)
class BinaryMetric:
    """One binary benchmark metric: ``name`` is its key in the benchmark tables, ``title`` its display title.

    Ranking metrics (ROC-AUC, AP) read the scores, decision metrics the model's own yes/no, never a threshold tuned
    on the test images.
    """

    name: str
    title: str
    compute: BinaryFn
    higher_is_better: bool = True


# --- registries --------------------------------------------------------------------------------------------------


class _Named(Protocol):
    @property
    def name(self) -> str: ...


M = TypeVar("M", bound=_Named)


class Registry(Generic[M]):
    """Ordered metrics by name; the order is that of the logged keys and the tables.

    Mutable on purpose, so a new metric (or a toy one in a test) is added in one place and read by every consumer;
    ``registered`` adds one for the duration of a ``with`` block.
    """

    def __init__(self, metrics: tuple[M, ...] = ()):
        self._metrics: dict[str, M] = {}
        for metric in metrics:
            self.add(metric)

    def add(self, metric: M) -> M:
        """Append ``metric``; raises ``ValueError`` when its name is taken."""
        if metric.name in self._metrics:
            raise ValueError(f"metric {metric.name!r} is already registered")
        self._metrics[metric.name] = metric
        return metric

    def remove(self, name: str) -> None:
        del self._metrics[name]

    @contextmanager
    def registered(self, metric: M) -> Iterator[M]:
        """``metric`` is registered inside the block and removed after it."""
        self.add(metric)
        try:
            yield metric
        finally:
            self.remove(metric.name)

    def __iter__(self) -> Iterator[M]:
        return iter(tuple(self._metrics.values()))

    def __len__(self) -> int:
        return len(self._metrics)

    def __contains__(self, name: object) -> bool:
        return name in self._metrics

    def __getitem__(self, name: str) -> M:
        if name not in self._metrics:
            raise KeyError(f"unknown metric {name!r}; registered: {list(self._metrics)}")
        return self._metrics[name]

    def titles(self) -> dict[str, str]:
        """``{name: title}`` in order."""
        return {metric.name: metric.title for metric in self}


class SuiteRegistry(Registry[SuiteMetric]):
    """The suite's metrics, with the questions its consumers ask (which keys, which direction, which chain)."""

    def add(self, metric: SuiteMetric) -> SuiteMetric:
        """Also refuses a key or name already used as a key or name (both become logged keys) and a taken place
        in the tie-break chain."""
        taken = {m.name for m in self} | {m.key for m in self if m.key is not None}
        clash = {metric.name, metric.key} & taken
        if clash:
            raise ValueError(f"metric {metric.name!r}: {sorted(clash)} already names or keys a registered metric")
        if metric.tie_break is not None and metric.tie_break in {m.tie_break for m in self}:
            raise ValueError(f"metric {metric.name!r}: tie-break place {metric.tie_break} is taken")
        return super().add(metric)

    def per_class(self, val_thresholds: bool = False) -> tuple[SuiteMetric, ...]:
        """Per-class metrics to compute; the ``*_valthr`` ones only when validation thresholds are given."""
        return tuple(m for m in self if m.per_class and (val_thresholds or not m.needs_val_thresholds))

    def pooled(self) -> tuple[SuiteMetric, ...]:
        return tuple(m for m in self if not m.per_class)

    def by_key(self, metric: str) -> SuiteMetric:
        """The per-class metric with key or macro name ``metric`` (``"ap"`` or ``"mAP"``)."""
        for m in self.per_class(val_thresholds=True):
            if metric in (m.key, m.name):
                return m
        known = [m.key for m in self.per_class(True)] + [m.name for m in self.per_class(True)]
        raise ValueError(f"unknown metric {metric!r}; expected one of {sorted(known)}")

    def headline(self) -> tuple[str, ...]:
        """Names every evaluation reports: all but those that need validation thresholds."""
        return tuple(m.name for m in self if not m.needs_val_thresholds)

    def tie_break_chain(self) -> tuple[SuiteMetric, ...]:
        """The challenge's ranking order: compare by the first, then break ties by the next, and so on."""
        return tuple(sorted((m for m in self if m.tie_break is not None), key=lambda m: m.tie_break))

    def lower_is_better(self) -> frozenset[str]:
        """Names whose smaller values win."""
        return frozenset(m.name for m in self if not m.higher_is_better)


SUITE = SuiteRegistry(
    (
        SuiteMetric("mAP", "AP", class_ap, key="ap", tie_break=0),
        SuiteMetric("mAUROC", "AUROC", class_auroc, key="auroc", tie_break=1),
        SuiteMetric("mF1", "F1", class_f1, key="f1", tie_break=2),
        SuiteMetric("mPrecision", "Precision", class_precision, key="precision", tie_break=4),
        SuiteMetric("mRecall", "Recall", class_recall, key="recall", tie_break=5),
        SuiteMetric("mECE", "ECE", class_ece, key="ece", higher_is_better=False, tie_break=3),
        SuiteMetric("mF1_valthr", "F1 (validation thresholds)", class_f1_valthr, key="f1_valthr",
                    needs_val_thresholds=True),
        SuiteMetric("mPrecision_valthr", "Precision (validation thresholds)", class_precision_valthr,
                    key="precision_valthr", needs_val_thresholds=True),
        SuiteMetric("mRecall_valthr", "Recall (validation thresholds)", class_recall_valthr, key="recall_valthr",
                    needs_val_thresholds=True),
        SuiteMetric("ECE_pooled", "Pooled ECE", ece_bins, reduce=ece_from_pooled_bins, higher_is_better=False),
    )
)  # fmt: skip
"""The challenge suite (docs/rules.md §2): AP, AUROC, F1/precision/recall at the fixed threshold and at validation
thresholds, ECE per class and pooled. Tie-break chain: mAP, mAUROC, mF1, mECE (lower wins), mPrecision, mRecall; the
paper ranks by ECE without saying which, and the per-class mean in that place is the platform's choice (docs/rules.md
§13, ``ece_ranked``), fixed here so that every run a registry compares is ranked by one chain."""

BINARY = Registry(
    (
        BinaryMetric("auroc", "ROC-AUC", binary_auroc),
        BinaryMetric("accuracy", "Accuracy", binary_accuracy),
        BinaryMetric("sensitivity", "Sensitivity", binary_sensitivity),
        BinaryMetric("specificity", "Specificity", binary_specificity),
        BinaryMetric("ap", "Average precision", binary_ap),
    )
)
"""The binary benchmark metrics (pneumonia is the positive class), in table order."""

# --- the zero-shot metric sets: prefixes a Task 2 run logs, in report order ---------------------------------------


@dataclass(frozen=True)
class MetricSetName:
    """A metric set's logged prefix and the words the report, the terminal and the card use for it.

    Why here: the unseen-class report writes these prefixes, and the report, the terminal summary, the card and
    the tests read them; one declaration keeps a renamed set from leaving a reader looking for the old name.
    """

    prefix: str
    title: str


UNSEEN_SETS = (
    MetricSetName("test_unseen", "test"),
    MetricSetName("test_unseen_tta", "test with TTA"),
    MetricSetName("test_unseen_perturbed", "test perturbed"),
    MetricSetName("heldout_unseen", "held-out subset"),
)
"""Task 2's analyses of the six unseen classes (docs/zero-shot.md, "Task 2 analyses as the paper reports them"):
the test set, its TTA copy, its fixed perturbed copy and the held-out draw of the development set. Each logs its
macros under ``<prefix>/...`` (the pooled test, resampled within source) and ``<prefix>/<scope>/...`` for every
scope of :data:`UNSEEN_SCOPES` the images have, plus ``<prefix>/source/<centre>/...``; the perturbed copy also
``<prefix>[/<scope>]/delta/<macro>`` (perturbed minus plain)."""
UNSEEN_SCOPES = ("pooled", "internal", "external")
