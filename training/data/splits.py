"""Patient-disjoint split assignment for sources that come without an official split."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import numpy as np


def patient_split(patient_ids: Sequence[str], fractions: dict[str, float] | None = None, seed: int = 0) -> np.ndarray:
    """Assign every image to a split so that all images of a patient land in the same one.

    Each patient gets a uniform number from a hash of ``(seed, patient id)``, so the assignment does not depend
    on row order and adding patients later never moves existing ones to another split (which would leak).
    ``fractions`` defaults to 70/10/20 train/val/test. Returns ``(N,)`` split names.
    """
    fractions = fractions or {"train": 0.7, "val": 0.1, "test": 0.2}
    names = list(fractions)
    edges = np.cumsum([fractions[name] for name in names])
    if not np.isclose(edges[-1], 1.0):
        raise ValueError(f"split fractions must sum to 1, got {fractions}")

    def uniform(patient: str) -> float:
        digest = hashlib.sha256(f"{seed}:{patient}".encode()).digest()
        return int.from_bytes(digest[:8], "big") / 2**64

    draws = np.array([uniform(str(p)) for p in patient_ids])
    return np.array(names, dtype=object)[np.searchsorted(edges, draws, side="right").clip(max=len(names) - 1)]


def stratified_patient_split(
    patient_ids: Sequence[str], labels: np.ndarray, fractions: dict[str, float], seed: int = 0
) -> np.ndarray:
    """Patient-disjoint split whose label proportions match across splits (iterative stratification).

    A random patient split of a long-tailed set can leave a rare class with no positive in validation or test;
    iterative stratification (Sechidis et al. 2011, ``iterstrat``) gives every split its share of each label.
    A patient's label vector is the union of their images' (NaN counts as negative for balancing only).
    The result does not depend on row order. Returns ``(N,)`` split names.
    """
    from iterstrat.ml_stratifiers import MultilabelStratifiedShuffleSplit

    if not np.isclose(sum(fractions.values()), 1.0):
        raise ValueError(f"split fractions must sum to 1, got {fractions}")
    patients, inverse = np.unique(np.asarray(patient_ids, dtype=str), return_inverse=True)
    values = np.nan_to_num(np.asarray(labels, dtype=np.float64).reshape(len(inverse), -1))
    per_patient = np.zeros((len(patients), values.shape[1]))
    np.maximum.at(per_patient, inverse, values)
    if per_patient.shape[1] == 1:  # a binary task: stratify on both classes (iterstrat wants multi-label input)
        per_patient = np.hstack([per_patient, 1 - per_patient])

    names = list(fractions)
    assignment = np.full(len(patients), names[-1], dtype=object)
    remaining, left = np.arange(len(patients)), 1.0
    for name in names[:-1]:
        share = fractions[name] / left if left > 0 else 0.0
        left -= fractions[name]
        if share <= 0 or len(remaining) == 0:
            continue
        n_take = int(round(share * len(remaining)))
        if n_take >= len(remaining):
            assignment[remaining] = name
            remaining = remaining[:0]
            break
        if n_take == 0:
            continue
        splitter = MultilabelStratifiedShuffleSplit(
            n_splits=1, train_size=n_take, test_size=len(remaining) - n_take, random_state=seed
        )
        taken, rest = next(splitter.split(np.zeros(len(remaining)), per_patient[remaining]))
        assignment[remaining[taken]] = name
        remaining = remaining[rest]
    return assignment[inverse]
