"""Any label table plus an image folder, described in YAML: the generic adapter (``data=csv``)."""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping, Sequence
from pathlib import Path

import pandas as pd

from training.data.adapters.base import UNASSIGNED, AdapterError, AdapterSource
from training.data.adapters.spreadsheets import (
    id_problems,
    label_values,
    match_label_columns,
    raise_if,
    read_table,
    require_columns,
)
from training.data.findings import KNOWN_FINDINGS
from training.data.manifest import csv_line, listed

log = logging.getLogger(__name__)

SPLIT_NAMES = {  # spellings of split values seen in releases -> manifest split
    "train": "train", "training": "train", "val": "val", "valid": "val", "validation": "val", "dev": "val",
    "development": "val", "test": "test", "testing": "test",
}  # fmt: skip
_TOLD_NO_PATIENTS: set[tuple[str, str]] = set()  # (source name, root) already told it has no patient column


def split_key(value: str) -> str:
    """A release's split spelling as a key: ``'Internal-Test '`` and ``internal_test`` are one split."""
    return re.sub(r"[\s\-]+", "_", str(value).strip().lower())


class TableSource(AdapterSource):
    """A table with one row per image, an image column and 0/1 label columns.

    Args:
        table: one table for all rows, or ``{split: table}`` when the release ships one table per split.
        patient_column: without one every image counts as its own patient (logged, since splits can then leak).
        split_column: the release's split of each row; rows without one are split by patient.
        split_names: the release's split spelling -> manifest split, compared case-, space- and hyphen-insensitively.
        label_columns: default: every column not named above nor in ``extra_columns`` / ``ignore_columns``.
        label_map: table column -> finding name, for spellings no alias covers.
    """

    def __init__(
        self,
        root: str,
        name: str = "csv",
        table: str | Mapping[str, str] = "labels.csv",
        image_column: str = "image",
        image_dir: str = "",
        image_suffix: str = "",
        id_column: str | None = None,
        patient_column: str | None = None,
        split_column: str | None = None,
        view_column: str | None = None,
        source_label: str | None = None,
        label_columns: Sequence[str] | None = None,
        label_map: Mapping[str, str] | None = None,
        ignore_columns: Sequence[str] = (),
        keep_columns: Sequence[str] = (),
        vocabulary: Sequence[str] = KNOWN_FINDINGS,
        split_names: Mapping[str, str] | None = None,
        **kwargs,
    ):
        super().__init__(root, name, **kwargs)
        self.table = dict(table) if isinstance(table, Mapping) else table
        self.image_column, self.image_dir, self.image_suffix = image_column, image_dir, image_suffix
        self.id_column, self.patient_column = id_column or image_column, patient_column
        self.split_column, self.view_column, self.source_label = split_column, view_column, source_label or name
        self.label_columns = list(label_columns) if label_columns is not None else None
        self.label_map, self.ignore_columns = dict(label_map or {}), tuple(ignore_columns)
        self.extra_columns = tuple(keep_columns)
        self.vocabulary = tuple(vocabulary)
        self.split_names = {split_key(k): v for k, v in dict(split_names or SPLIT_NAMES).items()}
        bad = sorted(f"{k!r}: {v!r}" for k, v in self.split_names.items() if v not in ("train", "val", "test"))
        raise_if(
            [f"split name {b} maps to no manifest split (train, val or test)" for b in bad], "data.source.split_names"
        )
        self._labels: tuple[str, ...] = ()

    @property
    def patient_ids(self) -> bool:
        """Patient-disjointness is checkable only when a patient column is configured (and so read)."""
        return bool(self.patient_column)

    @property
    def labels(self) -> tuple[str, ...]:
        if not self._labels:
            raise RuntimeError("labels are known once build() has read the table")
        return self._labels

    def key(self) -> dict:
        return {**super().key(), **{k: str(v) for k, v in vars(self).items() if k not in ("root", "out_dir")}}

    def build(self) -> pd.DataFrame:
        tables = self.table if isinstance(self.table, dict) else {UNASSIGNED: self.table}
        unknown = [k for k in tables if k != UNASSIGNED and split_key(k) not in self.split_names]
        raise_if([f"table key {k!r} is none of the split names {sorted(self.split_names)}" for k in unknown],
                 "data.source.table")  # fmt: skip
        carve = not self.split_column and "train" in (splits := {self.split_names.get(split_key(k)) for k in tables}) \
            and "val" not in splits  # fmt: skip
        if carve:  # validation is carved out of train, by patient
            log.info("%s: no validation table; validation is drawn from the training rows", self.name)
        if not self.patient_column and (told := (self.name, str(self.root))) not in _TOLD_NO_PATIENTS:
            _TOLD_NO_PATIENTS.add(told)  # once per process: a run builds the manifest more than once
            log.warning("%s: no patient column; each image is treated as its own patient (patient-disjointness of "
                        "the splits is not checkable)", self.name)  # fmt: skip
        parts = [self._read_one(self.root / rel, key, carve) for key, rel in tables.items()]
        table = pd.concat(parts, ignore_index=True)
        duplicated = table["image_id"][table["image_id"].duplicated()]
        raise_if([f"image id {i!r} appears in more than one table" for i in duplicated.unique()[:10]], "tables")
        return table

    def _read_one(self, path: Path, key: str, carve: bool = False) -> pd.DataFrame:
        raw = read_table(path)
        named = [self.image_column, self.id_column, self.patient_column, self.split_column, self.view_column]
        require_columns(raw, [c for c in named if c] + list(self.extra_columns), path)
        problems = id_problems(raw, self.id_column, path)
        if self.patient_column:
            problems += id_problems(raw, self.patient_column, path, unique=False)

        candidates = self.label_columns
        if candidates is None:
            skip = set(named) | set(self.extra_columns) | set(self.ignore_columns)
            candidates = [c for c in raw.columns if c not in skip]
        mapping = match_label_columns(candidates, self.vocabulary, path, self.label_map, self.ignore_columns)
        labels = tuple(mapping.values())
        if self._labels and set(labels) != set(self._labels):
            problems.append(
                f"{path}: label columns {sorted(labels)} differ from the other tables' {sorted(self._labels)}"
            )
        self._labels = tuple(dict.fromkeys(self._labels + labels))

        release = self._release_splits(raw, path, key, problems)
        split = release.map(self.split_names).fillna(UNASSIGNED)
        out = pd.DataFrame({
            "image_id": raw[self.id_column].str.strip(),
            "path": raw[self.image_column].str.strip().map(self._image_path),
            "split": split.where(~(carve & (split == "train")), UNASSIGNED),
            "patient_id": raw[self.patient_column].str.strip() if self.patient_column else raw[self.id_column],
            "source": self.sources(release),
            "view": raw[self.view_column].str.strip() if self.view_column else "",
        })  # fmt: skip
        for column in self.extra_columns:
            out[column] = raw[column]
        for column, finding in mapping.items():
            out[finding], bad = label_values(raw, column, path)
            problems += bad
        raise_if(problems, str(path))
        return out

    def _image_path(self, value: str) -> str:
        name = value if Path(value).suffix or not self.image_suffix else value + self.image_suffix
        return (Path(self.image_dir) / name).as_posix() if self.image_dir else name

    def _release_splits(self, raw: pd.DataFrame, path: Path, key: str, problems: list[str]) -> pd.Series:
        """Each row's split in the release's spelling (as a :func:`split_key`; ``""`` = none), from the split
        column, else from the table's key; an unknown value is reported with its line."""
        if not self.split_column:
            return pd.Series(split_key(key), index=raw.index, dtype=object)
        text = raw[self.split_column].map(split_key)
        bad = text.index[(text != "") & ~text.isin(list(self.split_names))]
        problems += listed("bad splits", [f"{path}, line {csv_line(i)}, column {self.split_column!r}: unknown split "
                                          f"{raw.at[i, self.split_column]!r} (use one of {sorted(self.split_names)}, "
                                          f"or add it to data.source.split_names)" for i in bad])  # fmt: skip
        return text

    def sources(self, release: pd.Series) -> pd.Series | str:
        """The ``source`` of rows with these release splits: one centre for a generic table."""
        return self.source_label


__all__ = ["AdapterError", "TableSource"]
