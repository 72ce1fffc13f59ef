"""Binary benchmark metrics with a label-stratified bootstrap.

Pneumonia is the positive class. ROC-AUC and average precision rank the scores; accuracy, sensitivity and
specificity judge the model's own decision (probability above 0.5, or a positive prompt margin), never a
threshold tuned on the test images.

The bootstrap resamples test images with replacement *within each label*, so every resample keeps the test set's
class counts: a ratio such as specificity then always has the same denominator, and no resample lacks a class
(which would leave ROC-AUC undefined). Resample ``b`` draws from its own generator,
``evaluation.bootstrap.resample_generator(seed, b)``, the convention of the rest of the platform, so any resample
can be regenerated on its own. All protocols of one benchmark run are scored on the same resamples (paired).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pandas as pd
from scipy.stats import rankdata

from evaluation.bootstrap import percentile_ci, resample_generator

METRICS: dict[str, str] = {
    "auroc": "ROC-AUC",
    "accuracy": "Accuracy",
    "sensitivity": "Sensitivity",
    "specificity": "Specificity",
    "ap": "Average precision",
}
"""Metric key -> display name, in table order."""


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


def binary_metrics(labels: np.ndarray, scores: np.ndarray, decisions: np.ndarray) -> dict[str, float]:
    """The five metrics of one protocol.

    Args:
        labels: ``(N,)`` 1 = pneumonia, 0 = normal.
        scores: ``(N,)`` ranking scores (probability or prompt margin).
        decisions: ``(N,)`` the model's own yes/no (True = pneumonia).
    """
    labels = np.asarray(labels).astype(bool)
    decisions = np.asarray(decisions).astype(bool)
    nan = float("nan")
    return {
        "auroc": roc_auc(labels, scores),
        "accuracy": float(np.mean(decisions == labels)) if labels.size else nan,
        "sensitivity": float(decisions[labels].mean()) if labels.any() else nan,
        "specificity": float((~decisions[~labels]).mean()) if (~labels).any() else nan,
        "ap": average_precision(labels, scores),
    }


def stratified_resamples(labels: np.ndarray, n_boot: int, seed: int) -> np.ndarray:
    """``(n_boot, N)`` image indices; each row redraws every label's images with replacement, as many as it has.

    Row ``b`` lists the resampled images of each label in turn (labels in sorted order), so its class counts
    equal those of ``labels`` exactly.
    """
    labels = np.asarray(labels)
    groups = [np.flatnonzero(labels == value) for value in np.unique(labels)]
    out = np.empty((int(n_boot), labels.size), dtype=np.int64)
    for b in range(int(n_boot)):
        rng = resample_generator(seed, b)
        out[b] = np.concatenate([group[rng.integers(0, group.size, size=group.size)] for group in groups])
    return out


def bootstrap_table(
    labels: np.ndarray,
    protocols: Mapping[str, tuple[np.ndarray, np.ndarray] | None],
    n_boot: int = 1000,
    seed: int = 0,
    ci: float = 0.95,
) -> pd.DataFrame:
    """Point values and percentile CIs of every metric of every protocol, on shared resamples.

    Args:
        labels: ``(N,)`` test labels.
        protocols: protocol name -> ``(scores, decisions)``, or ``None`` for a protocol the model does not
            support (its rows are NaN, kept so every table has the same shape).
        n_boot: resamples.
        seed: bootstrap seed.
        ci: interval coverage.

    Returns:
        One row per (protocol, metric): ``protocol``, ``metric``, ``value``, ``ci_low``, ``ci_high``.
    """
    labels = np.asarray(labels).astype(int)
    resamples = stratified_resamples(labels, n_boot, seed) if n_boot > 0 else np.empty((0, labels.size), int)
    rows = []
    for protocol, outputs in protocols.items():
        if outputs is None:
            rows += [{"protocol": protocol, "metric": m, "value": np.nan, "ci_low": np.nan, "ci_high": np.nan}
                     for m in METRICS]  # fmt: skip
            continue
        scores, decisions = (np.asarray(values) for values in outputs)
        point = binary_metrics(labels, scores, decisions)
        replicates = pd.DataFrame([binary_metrics(labels[idx], scores[idx], decisions[idx]) for idx in resamples])
        for metric in METRICS:
            low, high = percentile_ci(replicates[metric].to_numpy(), ci) if n_boot > 0 else (np.nan, np.nan)
            rows.append(
                {"protocol": protocol, "metric": metric, "value": point[metric], "ci_low": low, "ci_high": high}
            )
    return pd.DataFrame(rows, columns=["protocol", "metric", "value", "ci_low", "ci_high"])
