"""An all-zero label row is unlabelled, not a confirmed normal (docs/rules.md §12).

A report-mined row with no positive either was called normal by no one or named findings outside the label list
(the CXR-LT 2026 overview warns against reading it as ``Normal``). Training a ``Normal`` output on such rows as
negatives, or an implicit "no finding" as positives, would teach it a label nobody gave, so their ``Normal`` target
is made "not labelled" (``-1``), which every loss masks exactly as an empty manifest cell.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

NORMAL = "Normal"


def mask_unlabelled_normal(targets: np.ndarray, labels: Sequence[str], normal: str = NORMAL) -> np.ndarray:
    """``targets (N, C)`` with ``-1`` in the ``normal`` column of every row that has no positive; a copy.

    Findings keep their ``0``s (negatives by the manifest contract); without a ``normal`` label nothing changes.
    """
    labels = list(labels)
    if normal not in labels:
        return targets
    out = targets.copy()
    out[~(targets == 1).any(axis=1), labels.index(normal)] = -1.0
    return out


def unlabelled_rows(targets: np.ndarray) -> int:
    """How many rows of ``targets (N, C)`` have no positive label (the rows :func:`mask_unlabelled_normal` masks)."""
    return int((~(targets == 1).any(axis=1)).sum())
