"""One test set under several runs' stored predictions, or the reason there is none.

A paired comparison (``evaluation.paired``) is only meaningful when every run was scored on the same images with
the same labels and, for the stratified resamples, the same source of each image: otherwise a difference could be
the test set's. Runs whose ``predictions/test.csv`` (``evaluation.prediction_columns``: ``image_id``, one column per
class, ``true/<class>``, and ``source`` where the data has one) disagree on any of these are refused, naming the
two runs and what differs; rows are matched by image id, so the order a run wrote them in does not matter.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import pandas as pd

from evaluation.prediction_columns import ID_COLUMN, TRUE_PREFIX

SOURCE_COLUMN = "source"
SHOWN = 3  # examples named in a refusal


class DifferentTestSets(ValueError):
    """The runs were not scored on one test set (ids, labels, classes or sources differ); the message says which."""


@dataclass(frozen=True)
class PairedData:
    """The shared test set: ``targets (N, C)`` in {-1, 0, 1}, each run's ``probs (N, C)`` in the same row order,
    and the source of each image (``None`` when the predictions carry none)."""

    ids: np.ndarray
    labels: tuple[str, ...]
    targets: np.ndarray
    probs: dict[str, np.ndarray]
    strata: np.ndarray | None

    def support(self) -> np.ndarray:
        """``(C,)`` test positives of each class."""
        return (self.targets == 1).sum(axis=0)


def _labels(frame: pd.DataFrame) -> list[str]:
    return [c.removeprefix(TRUE_PREFIX) for c in frame.columns if c.startswith(TRUE_PREFIX)]


def _examples(values) -> str:
    values = sorted(map(str, values))
    return ", ".join(values[:SHOWN]) + (", ..." if len(values) > SHOWN else "")


def align(frames: Mapping[str, pd.DataFrame]) -> PairedData:
    """Every run's predictions on the first run's rows, after checking all describe one test set.

    Args:
        frames: ``{run name: its predictions/test.csv}``, at least one.

    Raises:
        DifferentTestSets: classes, image ids, labels or sources differ between the first run and another.
    """
    (first, reference), *others = frames.items()
    labels = _labels(reference)
    if not labels:
        raise DifferentTestSets(f"{first}: its test predictions hold no {TRUE_PREFIX}<class> column to compare on")
    ids = reference[ID_COLUMN].astype(str).to_numpy()
    if len(set(ids)) != len(ids):
        raise DifferentTestSets(f"{first}: duplicated image ids in its test predictions")
    truth = reference.set_index(reference[ID_COLUMN].astype(str))
    for name, frame in others:
        mine = _labels(frame)
        if set(mine) != set(labels):
            raise DifferentTestSets(f"{first} and {name} predict different classes: only {first} has "
                                    f"[{_examples(set(labels) - set(mine))}], only {name} has "
                                    f"[{_examples(set(mine) - set(labels))}]")  # fmt: skip
        other = frame.set_index(frame[ID_COLUMN].astype(str))
        only_first, only_other = set(ids) - set(other.index), set(other.index) - set(ids)
        if only_first or only_other or len(other) != len(ids):
            raise DifferentTestSets(f"{first} and {name} were tested on different images: {len(only_first)} only in "
                                    f"{first} ({_examples(only_first)}), {len(only_other)} only in {name} "
                                    f"({_examples(only_other)})")  # fmt: skip
        columns = [TRUE_PREFIX + label for label in labels]
        here, there = truth[columns].to_numpy(dtype=float), other.loc[ids, columns].to_numpy(dtype=float)
        differ = np.argwhere(~((here == there) | (np.isnan(here) & np.isnan(there))))
        if len(differ):
            row, col = differ[0]
            raise DifferentTestSets(f"{first} and {name} have the same images but different labels in {len(differ)} "
                                    f"cell(s), e.g. image {ids[row]}, {labels[col]!r}: {here[row, col]:g} vs "
                                    f"{there[row, col]:g}")  # fmt: skip
        has = SOURCE_COLUMN in truth, SOURCE_COLUMN in other
        if has[0] != has[1]:
            raise DifferentTestSets(f"only {first if has[0] else name} of {first} and {name} records the source of "
                                    "each test image, so the resamples cannot be stratified alike")  # fmt: skip
        if all(has):
            moved = ids[truth.loc[ids, SOURCE_COLUMN].astype(str).to_numpy()
                        != other.loc[ids, SOURCE_COLUMN].astype(str).to_numpy()]  # fmt: skip
            if len(moved):
                raise DifferentTestSets(f"{first} and {name} give {len(moved)} test image(s) different sources, e.g. "
                                        f"{_examples(moved)}")  # fmt: skip
    targets = np.nan_to_num(truth[[TRUE_PREFIX + label for label in labels]].to_numpy(dtype=float), nan=-1.0)
    probs = {}
    for name, frame in frames.items():
        rows = frame.set_index(frame[ID_COLUMN].astype(str)).loc[ids, labels]
        probs[name] = rows.to_numpy(dtype=float)
    strata = truth[SOURCE_COLUMN].astype(str).to_numpy() if SOURCE_COLUMN in truth else None
    return PairedData(ids, tuple(labels), targets.astype(int), probs, strata)
