"""Point metrics over a multi-label test set, following the challenge's macro conventions (DESIGN §1)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from sklearn.metrics import average_precision_score, roc_auc_score


def multilabel_summary(targets: np.ndarray, probs: np.ndarray, labels: Sequence[str]) -> dict[str, float]:
    """Macro AP and AUROC plus per-class AP.

    A class enters the AP macro mean only if the split has a positive for it, and the AUROC mean only if it has
    both a positive and a negative: an undefined value must not be averaged in as 0 or 0.5. Entries marked -1
    (not labelled) are excluded per class.

    Args:
        targets: ``(N, C)`` with 1, 0 or -1 (not labelled).
        probs: ``(N, C)`` scores.
        labels: class names, ``C`` of them.

    Returns:
        ``{"mAP", "mAUROC", "ap/<class>", "auroc/<class>"}``; per-class values only for defined classes.
    """
    result: dict[str, float] = {}
    aps, aurocs = [], []
    for c, name in enumerate(labels):
        known = targets[:, c] >= 0
        y, p = targets[known, c], probs[known, c]
        if y.sum() == 0:
            continue
        ap = float(average_precision_score(y, p))
        result[f"ap/{name}"] = ap
        aps.append(ap)
        if (y == 0).any():
            auroc = float(roc_auc_score(y, p))
            result[f"auroc/{name}"] = auroc
            aurocs.append(auroc)
    result["mAP"] = float(np.mean(aps)) if aps else float("nan")
    result["mAUROC"] = float(np.mean(aurocs)) if aurocs else float("nan")
    return result


def prevalence_baseline_map(targets: np.ndarray) -> float:
    """mAP of a constant predictor: each class's AP equals its prevalence, so the macro mean is mean prevalence."""
    known = targets >= 0
    positives = ((targets == 1) & known).sum(axis=0)
    prevalence = positives / np.maximum(known.sum(axis=0), 1)
    return float(prevalence[positives > 0].mean())
