"""Concept sets as arrays and tables: the truth matrix thresholds are chosen on, and the per-concept report.

Shared by ``make submit`` (validation truth for :mod:`evaluation.concept_thresholds`) and ``make score`` (the
per-concept table of a scored run file) for concept-detection tasks (ImageCLEFmedical Caption on ROCOv2).
"""

from __future__ import annotations

import csv
import gzip
import io
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import numpy as np
import pandas as pd

SEPARATOR = ";"


def split_concepts(cell: str) -> frozenset[str]:
    """A ``;``-separated concept cell (a manifest's ``concepts`` column) as a set; empty cell, empty set."""
    return frozenset(c.strip().upper() for c in str(cell).split(SEPARATOR) if c.strip())


def truth_matrix(concepts: Sequence[Iterable[str]], labels: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """``(truth (N, C) int8, missed (N,))``: which label columns each image's true set holds, and how many of its
    true concepts are outside the columns (counted by the per-image F1 as concepts the model cannot find)."""
    column = {str(name).upper(): c for c, name in enumerate(labels)}
    truth = np.zeros((len(concepts), len(labels)), dtype=np.int8)
    missed = np.zeros(len(concepts), dtype=np.int64)
    for row, found in enumerate(concepts):
        found = {str(c).strip().upper() for c in found}
        inside = [column[c] for c in found if c in column]
        truth[row, inside] = 1
        missed[row] = len(found) - len(inside)
    return truth, missed


def per_concept_table(truth: Mapping[str, Iterable[str]], run: Mapping[str, Iterable[str]],
                      names: Mapping[str, str] | None = None) -> pd.DataFrame:  # fmt: skip
    """One row per concept that is true or predicted somewhere: support, predictions, precision, recall, F1.

    Sorted by support (most frequent first), then CUI; ``name`` is the concept's name where ``names`` has it.
    Precision and recall are 0 where undefined (no prediction, no positive), as in the rest of the platform.
    """
    support, predicted, hits = {}, {}, {}
    for image_id, true in truth.items():
        true = {str(c).upper() for c in true}
        guess = {str(c).upper() for c in run.get(image_id, ())}
        for c in true:
            support[c] = support.get(c, 0) + 1
        for c in guess:
            predicted[c] = predicted.get(c, 0) + 1
        for c in true & guess:
            hits[c] = hits.get(c, 0) + 1
    cuis = sorted(set(support) | set(predicted), key=lambda c: (-support.get(c, 0), c))
    frame = pd.DataFrame({
        "concept": cuis, "name": [(names or {}).get(c, "") for c in cuis],
        "support": [support.get(c, 0) for c in cuis], "predicted": [predicted.get(c, 0) for c in cuis],
        "tp": [hits.get(c, 0) for c in cuis],
    })  # fmt: skip
    tp, n_pred, n_true = (frame[k].to_numpy(dtype=float) for k in ("tp", "predicted", "support"))
    frame["precision"] = np.divide(tp, n_pred, out=np.zeros_like(tp), where=n_pred > 0)
    frame["recall"] = np.divide(tp, n_true, out=np.zeros_like(tp), where=n_true > 0)
    frame["f1"] = np.divide(2 * tp, n_pred + n_true, out=np.zeros_like(tp), where=(n_pred + n_true) > 0)
    return frame


def read_ids(path: str | Path) -> list[str]:
    """The image ids in the first column of a CSV, plain or gzipped (a concept table or a bare id list); a first
    row whose first cell contains ``ID`` is a header, the rule of ImageCLEF's evaluator."""
    data = Path(path).read_bytes()
    text = (gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data).decode("utf-8-sig")
    rows = [row for row in csv.reader(io.StringIO(text)) if row and row[0]]
    if rows and "ID" in rows[0][0]:
        rows = rows[1:]
    return [row[0].strip() for row in rows]
