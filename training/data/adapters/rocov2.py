"""ROCOv2 (Rückert et al., Sci Data 2024), the ImageCLEFmedical 2024 Caption data, as released.

Layout and settings: docs/concepts.md and ``configs/data/rocov2.yaml``. One 0/1 column per CUI seen at least
``min_count`` times in training, so the label list comes from the data (a task with ``labels: null`` takes it).
Every image's full concept set, rare CUIs included, stays in the ``concepts`` column: ImageCLEF's per-image F1
counts the concepts a model cannot predict as missed, and thresholds are chosen against that.

ROCOv2 has no patient ids: every image is its own patient, so patient-disjointness cannot be checked (figures from
one article can sit in two splits), which the release's own split shares.
"""

from __future__ import annotations

import csv
import gzip
import io
import logging
import re
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import numpy as np
import pandas as pd

from training.data.adapters.base import AdapterError, AdapterSource
from training.data.adapters.spreadsheets import raise_if
from training.data.manifest import SCIENTIFIC, listed, mangled_id_problem

log = logging.getLogger(__name__)

#: A UMLS concept unique identifier: C and seven digits; read case-insensitively and upper-cased, as ImageCLEF's
#: evaluator compares them (apps/benchmarks/imageclef_concepts/scoring.py).
CUI = re.compile(r"^C\d{7}$", re.IGNORECASE)
ID_COLUMN, CUI_COLUMN = "ID", "CUIs"
SEPARATOR = ";"
#: Manifest split -> the release's image folder and concept table.
RELEASE_SPLITS: dict[str, dict[str, str]] = {
    "train": {"images": "train", "concepts": "train_concepts.csv"},
    "val": {"images": "valid", "concepts": "valid_concepts.csv"},
    "test": {"images": "test", "concepts": "test_concepts.csv"},
}
CONCEPTS_COLUMN = "concepts"  # every CUI of the image, ;-separated, kept or not


@dataclass(frozen=True)
class ConceptTable:
    """One ``ID,CUIs`` table as read: ids and concept sets in file order, with each row's line in the file."""

    path: Path
    ids: list[str]
    concepts: list[tuple[str, ...]]
    lines: list[int]


def find_table(root: Path, name: str) -> Path:
    """``root / name``, or its gzipped copy ``name.gz`` when only that exists (the release ships either)."""
    path = root / name
    if path.is_file() or not (gz := path.with_name(path.name + ".gz")).is_file():
        return path
    return gz


def _text(path: Path) -> str:
    """A table's text, gunzipped when it is gzipped (by its magic bytes, whatever its name)."""
    data = path.read_bytes()
    if data[:2] == b"\x1f\x8b":
        data = gzip.decompress(data)
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as error:
        raise AdapterError(f"{path}: not a UTF-8 text table: {error}") from None


def read_concept_table(path: Path) -> ConceptTable:
    """An ``ID,CUIs`` concept table (ground truth or manual concepts), checked cell by cell.

    An empty ``CUIs`` cell is an image without concepts; a repeated CUI counts once; CUIs are upper-cased.

    Raises:
        AdapterError: listing every bad cell with file, line and value (malformed CUI, empty id or one a spreadsheet
            turned into scientific notation, duplicated id, extra cells), or a missing/empty/headerless file.
    """
    if not path.is_file():
        raise AdapterError(f"concept table not found: {path}")
    rows = list(csv.reader(io.StringIO(_text(path))))
    if not rows:
        raise AdapterError(f"{path}: empty file, not even a header line; expected {ID_COLUMN},{CUI_COLUMN}")
    header = [cell.strip() for cell in rows[0]]
    if header[:2] != [ID_COLUMN, CUI_COLUMN]:
        raise AdapterError(f"{path}, line 1: header {rows[0]} is not {ID_COLUMN},{CUI_COLUMN}")
    ids, concepts, lines = [], [], []
    bad_cuis, bad_ids, bad_rows = [], [], []
    first_line: dict[str, int] = {}
    duplicated: dict[str, list[int]] = {}
    for line, row in enumerate(rows[1:], start=2):
        if not any(cell.strip() for cell in row):
            continue  # a blank line
        if len(row) > 2:
            bad_rows.append(f"{path}, line {line}: {len(row)} cells, expected {ID_COLUMN},{CUI_COLUMN}")
            continue
        image_id, cell = row[0].strip(), (row[1] if len(row) > 1 else "")
        if not image_id:
            bad_ids.append(f"{path}, line {line}, column {ID_COLUMN!r}: empty")
        elif SCIENTIFIC.match(image_id):
            bad_ids.append(mangled_id_problem(f"{path}, line {line}, column {ID_COLUMN!r}", image_id))
        elif image_id in first_line:
            duplicated.setdefault(image_id, [first_line[image_id]]).append(line)
        else:
            first_line[image_id] = line
        cuis = [c.strip() for c in cell.split(SEPARATOR)] if cell.strip() else []
        bad_cuis += [f"{path}, line {line}, column {CUI_COLUMN!r}: {c!r} is not a CUI (C and seven digits)"
                     for c in cuis if not CUI.match(c)]  # fmt: skip
        ids.append(image_id)
        concepts.append(tuple(dict.fromkeys(c.upper() for c in cuis)))
        lines.append(line)
    problems = listed("malformed rows", bad_rows) + listed("bad ids", bad_ids)
    problems += listed("duplicated ids", [f"{path}, column {ID_COLUMN!r}: {i!r} duplicated on lines {at}"
                                          for i, at in duplicated.items()])  # fmt: skip
    problems += listed("malformed CUIs", bad_cuis)
    raise_if(problems, str(path))
    if not ids:
        raise AdapterError(f"{path}: a header without rows; the concept table lists no image")
    return ConceptTable(path, ids, concepts, lines)


def read_concept_names(path: Path) -> dict[str, str]:
    """``cui_mapping.csv`` (``CUI,Canonical name``, the release's spelling) as ``{CUI: name}``.

    Raises:
        AdapterError: a malformed CUI or a CUI named twice, with its line.
    """
    rows = list(csv.reader(io.StringIO(_text(path))))
    names: dict[str, str] = {}
    problems = []
    for line, row in enumerate(rows[1:], start=2):
        if not row or not row[0].strip():
            continue
        cui, name = row[0].strip().upper(), ",".join(row[1:]).strip()
        if not CUI.match(cui):
            problems.append(f"{path}, line {line}, column 'CUI': {cui!r} is not a CUI (C and seven digits)")
        elif cui in names:
            problems.append(f"{path}, line {line}, column 'CUI': {cui!r} named twice")
        else:
            names[cui] = name
    raise_if(listed("bad concept names", problems), str(path))
    return names


class ROCOv2Source(AdapterSource):
    """The release as a manifest with one label per CUI seen at least ``min_count`` times in training.

    Args:
        splits: manifest split -> ``{images: <folder>, concepts: <table>}`` relative to root (default
            :data:`RELEASE_SPLITS`); a table name also finds its ``.gz`` copy.
        concept_names: the CUI -> name table, relative to root; used when present (names in reports).
        **kwargs: see :class:`AdapterSource` (its split fractions are unused: the release has all three splits).
    """

    extra_columns = (CONCEPTS_COLUMN,)
    patient_ids = False  # every image is its own patient: splits cannot be checked for shared patients

    def __init__(self, root: str, name: str = "rocov2", min_count: int = 1,
                 splits: Mapping[str, Mapping[str, str]] | None = None, image_suffix: str = ".jpg",
                 concept_names: str | None = "cui_mapping.csv", **kwargs):  # fmt: skip
        super().__init__(root, name, **kwargs)
        if isinstance(min_count, bool) or not isinstance(min_count, int) or min_count < 1:
            raise AdapterError(f"{name}: min_count must be a whole number >= 1, got {min_count!r}")
        self.min_count = min_count
        self.splits = {split: dict(value) for split, value in (splits or RELEASE_SPLITS).items()}
        if set(self.splits) != set(RELEASE_SPLITS):
            raise AdapterError(f"{name}: data.source.splits must map exactly train, val and test (got "
                               f"{sorted(self.splits)})")  # fmt: skip
        self.image_suffix = image_suffix
        self.concept_names = concept_names

    def key(self) -> dict:
        return {**super().key(), "min_count": self.min_count, "splits": self.splits, "suffix": self.image_suffix}

    @cached_property
    def tables(self) -> dict[str, ConceptTable]:
        """The three concept tables, read once; an id in two tables is an error naming both."""
        if not self.root.is_dir():
            raise AdapterError(f"data root not found or not a folder: {self.root}")
        tables = {split: read_concept_table(find_table(self.root, spec["concepts"]))
                  for split, spec in self.splits.items()}  # fmt: skip
        seen: dict[str, tuple[Path, int]] = {}
        clashes = []
        for table in tables.values():
            for image_id, line in zip(table.ids, table.lines, strict=True):
                if image_id in seen:
                    other, other_line = seen[image_id]
                    clashes.append(f"{table.path}, line {line}, column {ID_COLUMN!r}: {image_id!r} is also on "
                                   f"line {other_line} of {other}")  # fmt: skip
                else:
                    seen[image_id] = (table.path, line)
        raise_if(listed("ids in two tables", clashes), "concept tables")
        return tables

    @cached_property
    def train_counts(self) -> Counter:
        """Training images per CUI."""
        return Counter(cui for cuis in self.tables["train"].concepts for cui in cuis)

    @cached_property
    def labels(self) -> tuple[str, ...]:
        """The CUIs seen at least ``min_count`` times in training, most frequent first (ties by CUI)."""
        kept = sorted((cui for cui, n in self.train_counts.items() if n >= self.min_count),
                      key=lambda cui: (-self.train_counts[cui], cui))  # fmt: skip
        if not kept:
            most = max(self.train_counts.values(), default=0)
            raise AdapterError(f"{self.tables['train'].path}: no CUI is carried by {self.min_count} or more training "
                               f"images (the most frequent by {most}); lower task.min_count")  # fmt: skip
        dropped = len(self.train_counts) - len(kept)
        log.info("%s: %d CUIs carried by >= %d training images are labels (%d rarer ones stay in the %r column only)",
                 self.name, len(kept), self.min_count, dropped, CONCEPTS_COLUMN)  # fmt: skip
        return tuple(kept)

    @cached_property
    def label_titles(self) -> dict[str, str]:
        """``{CUI: name}`` from the concept-name table when the release has one, else empty (reports show CUIs)."""
        if not self.concept_names:
            return {}
        path = find_table(self.root, self.concept_names)
        return read_concept_names(path) if path.is_file() else {}

    def build(self) -> pd.DataFrame:
        labels = self.labels
        column = {cui: c for c, cui in enumerate(labels)}
        frames, missing = [], []
        for split, table in self.tables.items():
            folder = self.splits[split]["images"]
            paths = [f"{folder}/{image_id}{self.image_suffix}" for image_id in table.ids]
            missing += [f"{table.path}, line {line}, column {ID_COLUMN!r}: {image_id!r} has no image "
                        f"{self.root / path}" for image_id, line, path in zip(table.ids, table.lines, paths,
                                                                               strict=True)
                        if not (self.root / path).is_file()]  # fmt: skip
            values = np.zeros((len(table.ids), len(labels)), dtype=np.float32)  # (N, C) 1/0
            for row, cuis in enumerate(table.concepts):
                values[row, [column[c] for c in cuis if c in column]] = 1.0
            meta = pd.DataFrame({
                "image_id": table.ids, "path": paths, "split": split, "patient_id": table.ids,
                "source": self.name, "view": "", CONCEPTS_COLUMN: [SEPARATOR.join(c) for c in table.concepts],
            })  # fmt: skip
            frames.append(pd.concat([meta, pd.DataFrame(values, columns=list(labels))], axis=1))
        raise_if(listed("missing images", missing), f"{self.root}")
        return pd.concat(frames, ignore_index=True)
