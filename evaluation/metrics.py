"""Reference points for reading a run's metrics (the metrics themselves live in :mod:`evaluation.suite`)."""

from __future__ import annotations

import numpy as np


def prevalence_baseline_map(targets: np.ndarray) -> float:
    """mAP of a constant predictor: each class's AP equals its prevalence, so the macro mean is mean prevalence."""
    known = targets >= 0
    positives = ((targets == 1) & known).sum(axis=0)
    prevalence = positives / np.maximum(known.sum(axis=0), 1)
    return float(prevalence[positives > 0].mean())
