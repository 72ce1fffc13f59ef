"""The challenge submission file: building it in the organisers' format and validating it before it is written.

Format (docs/rules.md §1): ``ImageID`` then one probability column per class. Without the organisers' template the
class columns follow :data:`training.data.label_names.ORGANISER_SPELLING` in the model's label order; with the
template, its header is copied exactly (names, order, id column) and each of its class columns is matched to a
model label by the contract every reader of predictions shares (:mod:`evaluation.prediction_columns`), so a
spelling difference can never leave a column of zeros or shift probabilities into the wrong class, and ``make
score`` reads the file exactly as it was written. Rows follow the template's order.

The validator collects every problem (not just the first) and names where each one is: the column for a header
mismatch, the id for a missing, extra or duplicated id, and the CSV line, id and column for a bad probability.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
from omegaconf import OmegaConf

from evaluation.prediction_columns import SUBMISSION_ID_COLUMN, PredictionsError, id_column, label_columns
from training.config_files import config_file
from training.data.label_names import ORGANISER_SPELLING

MAX_LISTED = 10  # problems listed per kind before summarising
TASK_CONFIGS = config_file("task")
#: What a task submits and ``make score`` reads (``submission_format`` in ``configs/task/<task>.yaml``):
#: ``probabilities``, the CXR-LT CSV of this module (the default); ``concepts``, ImageCLEF's run file of predicted
#: concept sets (:mod:`apps.benchmarks.imageclef_concepts.scoring`).
SUBMISSION_FORMATS = ("probabilities", "concepts")


class SubmissionError(ValueError):
    """A submission that must not be sent; the message lists each problem and where it is."""


def task_setting(task: str, key: str, default):
    """``key`` of ``configs/task/<task>.yaml``, or ``default`` when the task has no config or no such key."""
    path = TASK_CONFIGS / f"{task}.yaml"
    if not path.is_file():
        return default
    value = OmegaConf.load(path).get(key)
    return default if value is None else value


def submission_format(task: str) -> str:
    """The task's :data:`SUBMISSION_FORMATS` entry (``probabilities`` unless its config says otherwise)."""
    kind = str(task_setting(task, "submission_format", "probabilities"))
    if kind not in SUBMISSION_FORMATS:
        raise SubmissionError(
            f"configs/task/{task}.yaml: submission_format {kind!r} is not one of {SUBMISSION_FORMATS}"
        )
    return kind


@dataclass(frozen=True)
class Template:
    """What a submission must look like: the exact header (id column first) and the ids in order."""

    header: list[str]
    ids: list[str]

    @property
    def id_column(self) -> str:
        return self.header[0]

    @property
    def class_columns(self) -> list[str]:
        return self.header[1:]

    @classmethod
    def read(cls, path: str | Path) -> Template:
        """The organisers' template CSV: the first column holds the ids; other columns name the classes.

        Raises:
            SubmissionError: the file is missing or not a CSV, or its first column is not an image id column.
        """
        path = Path(path)
        if not path.is_file():
            raise SubmissionError(f"template not found: {path} (the organisers' CSV: {SUBMISSION_ID_COLUMN} and one "
                                  "column per class; leave TEMPLATE out to submit the test split)")  # fmt: skip
        try:
            frame = pd.read_csv(path, dtype=str, keep_default_na=False)
        except (pd.errors.EmptyDataError, pd.errors.ParserError, UnicodeDecodeError) as error:
            raise SubmissionError(f"{path}: not a readable template CSV: {error}") from None
        if frame.shape[1] < 2:
            raise SubmissionError(f"{path}: a template needs an id column and at least one class column")
        if id_column(frame.columns[:1]) is None:
            raise SubmissionError(f"{path}: the first column {frame.columns[0]!r} is not an image id column "
                                  f"({SUBMISSION_ID_COLUMN!r})")  # fmt: skip
        return cls(list(frame.columns), frame.iloc[:, 0].tolist())

    @classmethod
    def default(cls, labels: Sequence[str], ids: Sequence[str]) -> Template:
        """``ImageID`` plus the labels in the organisers' spelling (a label they do not list keeps its own)."""
        header = [SUBMISSION_ID_COLUMN] + [ORGANISER_SPELLING.get(name, name) for name in labels]
        return cls(header, [str(i) for i in ids])


def class_index(template: Template, labels: Sequence[str]) -> list[int]:
    """For each class column of the template, the index of the model label it names.

    Raises:
        SubmissionError: a column naming no label of the model (listed by name), or two naming the same one.
    """
    try:
        found, _ = label_columns(template.class_columns, labels)
    except PredictionsError as error:
        raise SubmissionError(f"template: {error}") from None
    label_of = {column: label for label, column in found.items()}
    unknown = [column for column in template.class_columns if column not in label_of]
    if unknown:
        raise SubmissionError(f"template column(s) {unknown} name no class of the model (labels: {list(labels)})")
    return [list(labels).index(label_of[column]) for column in template.class_columns]


def build_submission(template: Template, ids: Sequence[str], probs: np.ndarray, labels: Sequence[str]) -> pd.DataFrame:
    """The submission frame: the template's header and row order, probabilities moved into its columns.

    Args:
        template: header and id order to produce.
        ids: ``(N,)`` ids of the rows of ``probs``.
        probs: ``(N, C)`` probabilities in ``labels`` order.
        labels: the model's labels.
    """
    position = {str(i): row for row, i in enumerate(ids)}
    missing = [i for i in template.ids if i not in position]
    if missing:
        raise SubmissionError(f"no prediction for {len(missing)} template id(s), e.g. {missing[:MAX_LISTED]}")
    rows = [position[i] for i in template.ids]
    values = np.asarray(probs, dtype=np.float64)[np.ix_(rows, class_index(template, labels))]  # (N_t, C_t)
    frame = pd.DataFrame(values, columns=template.class_columns)
    frame.insert(0, template.id_column, list(template.ids))
    return frame


def _listed(items: Sequence) -> str:
    more = f" and {len(items) - MAX_LISTED} more" if len(items) > MAX_LISTED else ""
    return ", ".join(repr(i) for i in items[:MAX_LISTED]) + more


def problems(frame: pd.DataFrame, template: Template, check_order: bool = True) -> list[str]:
    """Every reason ``frame`` is not a valid submission for ``template`` (empty when it is valid)."""
    found: list[str] = []
    header = [str(c) for c in frame.columns]
    if header != template.header:
        for position, (got, expected) in enumerate(zip(header, template.header, strict=False)):
            if got != expected:
                found.append(f"column {position + 1} is {got!r}, expected {expected!r}")
        found += [f"column {expected!r} is missing" for expected in template.header[len(header) :]]
        found += [f"unexpected column {extra!r}" for extra in header[len(template.header) :]]
    if not header:
        return found or ["the file has no columns"]
    ids = frame.iloc[:, 0].astype(str)
    counts = ids.value_counts()
    duplicated = counts[counts > 1]
    for value, n in duplicated.items():
        lines = [int(i) + 2 for i in np.flatnonzero(ids.to_numpy() == value)]
        found.append(f"id {value!r} appears {n} times (lines {lines})")
    expected = set(template.ids)
    missing = [i for i in template.ids if i not in set(ids)]
    extra = [i for i in dict.fromkeys(ids) if i not in expected]
    if missing:
        found.append(f"{len(missing)} id(s) missing: {_listed(missing)}")
    if extra:
        found.append(f"{len(extra)} id(s) not in the template: {_listed(extra)}")
    if check_order and not (missing or extra or len(duplicated)) and ids.tolist() != list(template.ids):
        line = next(r for r, (a, b) in enumerate(zip(ids, template.ids, strict=True)) if a != b)
        found.append(f"rows are not in the template's order: line {line + 2} has id {ids.iloc[line]!r}, "
                     f"expected {template.ids[line]!r}")  # fmt: skip
    found += _value_problems(frame, ids, [c for c in template.class_columns if c in frame.columns])
    return found


def _value_problems(frame: pd.DataFrame, ids: pd.Series, columns: list[str]) -> list[str]:
    """Cells that are not finite probabilities in [0, 1], named by CSV line, id and column."""
    if not columns:
        return []
    raw = frame[columns]
    values = raw.apply(pd.to_numeric, errors="coerce").to_numpy(dtype=np.float64)  # (N, C)
    bad = np.argwhere(~np.isfinite(values) | (values < 0) | (values > 1))
    found = []
    for row, col in bad[:MAX_LISTED]:
        cell = raw.iat[row, col]
        found.append(f"line {row + 2} (id {ids.iloc[row]!r}), column {columns[col]!r}: {cell!r} is not a "
                     f"probability in [0, 1]")  # fmt: skip
    if len(bad) > MAX_LISTED:
        found.append(f"... {len(bad) - MAX_LISTED} more bad cell(s)")
    return found


def validate(frame: pd.DataFrame, template: Template, check_order: bool = True) -> None:
    """Raise :class:`SubmissionError` listing every problem; return quietly for a valid submission."""
    found = problems(frame, template, check_order)
    if found:
        raise SubmissionError("invalid submission:\n  " + "\n  ".join(found))


def validate_file(path: str | Path, template: Template, check_order: bool = True) -> pd.DataFrame:
    """Read a submission CSV exactly as written (ids as text, nothing parsed away) and validate it."""
    frame = pd.read_csv(path, dtype=str, keep_default_na=False)
    try:
        validate(frame, template, check_order)
    except SubmissionError as error:
        raise SubmissionError(f"{path}: {error}") from None
    return frame
