"""Head-to-tail groups by training prevalence (docs/rules.md §5): is the tail actually improving?"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

GROUPS: tuple[str, ...] = ("normal", "common", "medium", "rare", "very_rare")
NORMAL_LABELS = frozenset({"Normal", "No Finding"})


def frequency_group(name: str, prevalence: float) -> str:
    """Group of one class: Normal; common >10%; medium 1-10%; rare 0.1-1%; very rare <0.1%.

    The paper's ranges share their ends; the platform puts exactly 10% in medium and exactly 1% and 0.1% in rare
    (docs/rules.md §13, ``group_bounds``).
    """
    if name in NORMAL_LABELS:
        return "normal"
    if prevalence > 0.10:
        return "common"
    if prevalence > 0.01:
        return "medium"
    if prevalence >= 0.001:
        return "rare"
    return "very_rare"


def class_groups(labels: Sequence[str], train_positives: np.ndarray, n_train: int) -> dict[str, list[int]]:
    """Class indices per non-empty group, from training positive counts ``(C,)`` out of ``n_train`` images."""
    prevalence = np.asarray(train_positives, dtype=float) / max(int(n_train), 1)
    groups: dict[str, list[int]] = {}
    for index, (name, value) in enumerate(zip(labels, prevalence, strict=True)):
        groups.setdefault(frequency_group(name, value), []).append(index)
    return {group: groups[group] for group in GROUPS if group in groups}


def group_means(per_class: np.ndarray, groups: dict[str, list[int]]) -> dict[str, float]:
    """Mean of a per-class metric within each group, skipping classes where it is undefined (NaN)."""
    out = {}
    for group, members in groups.items():
        values = np.asarray(per_class, dtype=float)[members]
        values = values[~np.isnan(values)]
        if len(values):
            out[group] = float(values.mean())
    return out
