"""The linear probe: a logistic regression on frozen, standardised image embeddings.

Fixed settings, nothing tuned: the protocol has no validation images, and tuning the regularisation on the test
pool would flatter every model. Standardising first puts every embedding (a CNN's pooled activations, a CLIP
model's unit-norm vectors) on one scale, so the one regularisation strength ``C = 1`` means the same thing for
all of them. ``lbfgs`` is deterministic, so the probe adds no randomness of its own.
"""

from __future__ import annotations

import warnings

import numpy as np
from sklearn.exceptions import ConvergenceWarning
from sklearn.linear_model import LogisticRegression
from sklearn.pipeline import Pipeline, make_pipeline
from sklearn.preprocessing import StandardScaler

C = 1.0
MAX_ITER = 2000


def fit_probe(features: np.ndarray, labels: np.ndarray) -> tuple[Pipeline, bool]:
    """Fit the probe on ``(N, F)`` training embeddings; returns the pipeline and whether lbfgs converged.

    A probe that did not converge within ``MAX_ITER`` is still used (and reported): stopping rules are part of
    the protocol, and a silent retry with other settings would not be.
    """
    labels = np.asarray(labels).astype(int)
    if np.unique(labels).size < 2:
        raise ValueError("the probe needs training images of both labels")
    probe = make_pipeline(StandardScaler(), LogisticRegression(C=C, max_iter=MAX_ITER))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ConvergenceWarning)
        probe.fit(np.asarray(features, dtype=np.float64), labels)
    converged = not any(issubclass(w.category, ConvergenceWarning) for w in caught)
    return probe, converged


def probe_probabilities(probe: Pipeline, features: np.ndarray) -> np.ndarray:
    """``(N,)`` probability of the positive label (pneumonia) for ``(N, F)`` embeddings."""
    return probe.predict_proba(np.asarray(features, dtype=np.float64))[:, 1]
