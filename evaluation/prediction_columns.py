"""The one id/label contract of every file of predictions: run predictions, submissions, templates, ``make score``.

Files are written in the platform's spelling (:data:`ID_COLUMN`, the task config's labels, :data:`TRUE_PREFIX`
columns in run predictions) or the organisers' (:data:`SUBMISSION_ID_COLUMN`, their class columns:
:mod:`evaluation.organiser_names`; docs/rules.md §1), and read in either. A reader never asks which: the id
column is the one whose :func:`key` is an id's, and a class column names a label when their keys are equal
(case, spaces, underscores and hyphens ignored, the organisers' spellings read as the paper's names). So a
submission written by ``make submit`` is scored by ``make score`` as written.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

import pandas as pd

from evaluation.organiser_names import ORGANISER_SPELLING

#: The id column of manifests and run predictions.
ID_COLUMN = "image_id"
#: The id column of a submission (docs/rules.md §1).
SUBMISSION_ID_COLUMN = "ImageID"
#: Run predictions hold a label's ground truth in ``true/<label>``.
TRUE_PREFIX = "true/"
#: Column keys that name the image id, in any spelling.
ID_KEYS = frozenset({"imageid", "dicomid"})  # dicom_id: the challenge page's name for ImageID


class PredictionsError(ValueError):
    """Predictions that cannot be scored; the message names the file, row and column."""


def _plain(name: object) -> str:
    return re.sub(r"[\s_\-]+", "", str(name)).lower()


#: The organisers' spellings that differ from the paper's by more than case and spacing, as keys.
_ORGANISER_KEYS = {_plain(column): _plain(paper) for paper, column in ORGANISER_SPELLING.items()}


def key(name: object) -> str:
    """Case-, space-, underscore- and hyphen-insensitive key, the organisers' spelling read as the paper's:
    ``'Pleural_Effusion ' -> 'pleuraleffusion'``, ``'pneumoperitoneo' -> 'pneumoperitoneum'``."""
    plain = _plain(name)
    return _ORGANISER_KEYS.get(plain, plain)


def id_column(columns: Iterable[object]) -> str | None:
    """The column that holds the image ids (:data:`ID_COLUMN` first, then any spelling of it), or None."""
    columns = [str(c) for c in columns]
    if ID_COLUMN in columns:
        return ID_COLUMN
    return next((c for c in columns if key(c) in ID_KEYS), None)


def label_columns(columns: Iterable[object], labels: Sequence[str]) -> tuple[dict[str, str], list[str]]:
    """``({label: the column naming it}, [labels no column names])``.

    An exact match wins; otherwise the one column with the label's :func:`key`.

    Raises:
        PredictionsError: two columns name the same label (both named), so neither can be chosen silently.
    """
    columns = [str(c) for c in columns]
    by_key: dict[str, list[str]] = {}
    for column in columns:
        by_key.setdefault(key(column), []).append(column)
    found, missing = {}, []
    for label in labels:
        candidates = [label] if label in columns else by_key.get(key(label), [])
        if len(candidates) > 1:
            raise PredictionsError(f"columns {candidates} all name the class {label!r}; keep one")
        if candidates:
            found[label] = candidates[0]
        else:
            missing.append(label)
    return found, missing


def to_platform(frame: pd.DataFrame, labels: Sequence[str], source: str = "predictions") -> pd.DataFrame:
    """``frame`` as :data:`ID_COLUMN` plus one column per label in ``labels``' spelling and order.

    Raises:
        PredictionsError: no id column, or class columns missing or ambiguous; the message names what the file
            holds, so a wrong export is fixed in one round.
    """
    ids = id_column(frame.columns)
    if ids is None:
        shown = list(frame.columns)[:8]
        raise PredictionsError(f"{source}: no image id column ({ID_COLUMN!r} or {SUBMISSION_ID_COLUMN!r}); columns: "
                               f"{shown}{'...' if frame.shape[1] > len(shown) else ''}")  # fmt: skip
    try:
        found, missing = label_columns(frame.columns, labels)
    except PredictionsError as error:
        raise PredictionsError(f"{source}: {error}") from None
    if missing:  # the columns the file has instead are usually the misspelt ones: name them too
        unknown = [str(c) for c in frame.columns if c != ids and str(c) not in found.values()]
        raise PredictionsError(f"{source}: missing class column(s) {missing} (any spelling: case, spaces, "
                               f"underscores and hyphens are ignored); columns not recognised: {unknown or 'none'}")  # fmt: skip
    out = frame[[ids, *found.values()]].copy()
    out.columns = [ID_COLUMN, *found]
    return out
