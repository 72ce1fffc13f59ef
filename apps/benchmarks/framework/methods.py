"""Zero-shot and the linear probe for one binary finding: the two ways a protocol can ask any model a yes/no
question, whether it was trained for it (zero-shot: nothing is fitted) or only gives features (the probe).

Zero-shot needs nothing fitted, so a protocol reads ``Features.zero_shot`` and decides by its own rule (e.g.
apps/benchmarks/pneumonia.py's card rule); the probe, here, returns its
:class:`~apps.benchmarks.framework.protocol.Prediction` on the test items, the columns it adds to ``scores.csv``
and the note that tells the reader how the answer was made.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from apps.benchmarks.framework.probe import MAX_ITER, C, fit_probe, probe_probabilities
from apps.benchmarks.framework.protocol import Features, Prediction

PROBE_THRESHOLD = 0.5
PROBE_PARAMS = {"probe_C": C, "probe_max_iter": MAX_ITER}
"""The probe's fixed settings, logged with every run that uses it."""


@dataclass
class MethodResult:
    """One method on the test items.

    Attributes:
        prediction: its answers, or ``None`` when the model cannot answer this way.
        columns: ``scores.csv`` column -> ``(N,)`` values, in column order.
        note: one line for the report.
    """

    prediction: Prediction | None
    columns: dict[str, np.ndarray] = field(default_factory=dict)
    note: str = ""


def binary_probe(features: Features, train_labels: np.ndarray, label: str, train: str = "train",
                 test: str = "test") -> MethodResult:  # fmt: skip
    """Logistic regression on the ``train`` subset's embeddings (:mod:`apps.benchmarks.framework.probe`), scoring the
    ``test`` subset and deciding at a probability of 0.5."""
    train_embeddings = features.get(train).embeddings
    probe, converged = fit_probe(train_embeddings, train_labels)
    probs = probe_probabilities(probe, features.get(test).embeddings)  # (N,)
    decisions = probs > PROBE_THRESHOLD
    warning = "" if converged else " (lbfgs did NOT converge within max_iter)"
    note = (f"probe: logistic regression on {train_embeddings.shape[1]}-d standardised embeddings of "
            f"{len(train_labels)} training images{warning}")  # fmt: skip
    columns = {"probe_probability": probs, f"probe_{label.lower()}": decisions.astype(int)}
    return MethodResult(Prediction(probs, decisions), columns, note)
