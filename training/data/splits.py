"""Patient-disjoint split assignment for sources that come without an official split."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import numpy as np


def patient_split(patient_ids: Sequence[str], fractions: dict[str, float] | None = None, seed: int = 0) -> np.ndarray:
    """Assign every image to a split so that all images of a patient land in the same one.

    Each patient gets a uniform number from a hash of ``(seed, patient id)``, so the assignment does not depend
    on row order and adding patients later never moves existing ones to another split (which would leak).

    Args:
        patient_ids: one per image.
        fractions: split name to fraction of patients, in order; defaults to 70/10/20 train/val/test.
        seed: changes the draw.

    Returns:
        ``(N,)`` array of split names.
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
