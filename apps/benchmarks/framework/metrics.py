"""Binary benchmark metrics with a label-stratified bootstrap.

Pneumonia is the positive class. ROC-AUC and average precision rank the scores; accuracy, sensitivity and
specificity judge the model's own decision (probability above 0.5, or a positive prompt margin), never a
threshold tuned on the test images. The metrics are ``evaluation.metric_registry.BINARY``.

The bootstrap resamples test images with replacement *within each label*, so every resample keeps the test set's
class counts: a ratio such as specificity then always has the same denominator, and no resample lacks a class
(which would leave ROC-AUC undefined). The draws are ``evaluation.bootstrap.resample_indices`` with the labels as
strata, the convention of the rest of the platform, so any resample can be regenerated on its own. All protocols
of one benchmark run are scored on the same resamples (paired).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pandas as pd

from evaluation.bootstrap import percentile_ci, resample_indices
from evaluation.metric_registry import BINARY, average_precision, roc_auc

__all__ = ["METRICS", "average_precision", "binary_metrics", "bootstrap_table", "roc_auc"]

METRICS: dict[str, str] = BINARY.titles()
"""Metric key -> display name, in table order (``evaluation.metric_registry.BINARY`` as registered at import)."""


def binary_metrics(labels: np.ndarray, scores: np.ndarray, decisions: np.ndarray) -> dict[str, float]:
    """Every binary metric of ``evaluation.metric_registry.BINARY`` for one protocol.

    Args:
        labels: ``(N,)`` 1 = pneumonia, 0 = normal.
        scores: ``(N,)`` ranking scores (probability or prompt margin).
        decisions: ``(N,)`` the model's own yes/no (True = pneumonia).
    """
    labels = np.asarray(labels).astype(bool)
    decisions = np.asarray(decisions).astype(bool)
    return {metric.name: metric.compute(labels, scores, decisions) for metric in BINARY}


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
    resamples = (
        resample_indices(labels.size, n_boot, seed, strata=labels) if n_boot > 0 else np.empty((0, labels.size), int)
    )
    rows = []
    names = [metric.name for metric in BINARY]
    for protocol, outputs in protocols.items():
        if outputs is None:
            rows += [{"protocol": protocol, "metric": m, "value": np.nan, "ci_low": np.nan, "ci_high": np.nan}
                     for m in names]  # fmt: skip
            continue
        scores, decisions = (np.asarray(values) for values in outputs)
        point = binary_metrics(labels, scores, decisions)
        replicates = pd.DataFrame([binary_metrics(labels[idx], scores[idx], decisions[idx]) for idx in resamples])
        for metric in names:
            low, high = percentile_ci(replicates[metric].to_numpy(), ci) if n_boot > 0 else (np.nan, np.nan)
            rows.append(
                {"protocol": protocol, "metric": metric, "value": point[metric], "ci_low": low, "ci_high": high}
            )
    return pd.DataFrame(rows, columns=["protocol", "metric", "value", "ci_low", "ci_high"])
