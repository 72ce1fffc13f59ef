"""Any label table plus an image folder, described in YAML: the generic adapter and the base of CXR-LT 2026's."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from pathlib import Path

import pandas as pd

from training.data.adapters.base import UNASSIGNED, AdapterError, AdapterSource
from training.data.adapters.tables import (
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


class TableSource(AdapterSource):
    """A table with one row per image, an image column and 0/1 label columns.

    Args:
        root: dataset folder; tables and images are relative to it.
        table: one table for all rows, or ``{split: table}`` when the release ships one table per split.
        image_column: column holding the image file (relative to ``image_dir``).
        image_dir: folder of the images, relative to root.
        image_suffix: appended when the image column holds bare ids (``".png"``).
        id_column: image id column; default: the image column.
        patient_column: patient id column; without one every image counts as its own patient (logged, since
            splits can then leak patients).
        split_column: column with train/val/test (spellings in :data:`SPLIT_NAMES`); rows with an empty value,
            and all rows when there is no such column, are split by patient.
        view_column: view position column, optional.
        source_label: the centre recorded in the manifest's ``source`` column.
        label_columns: the label columns; default: every column not named above nor in ``extra_columns`` /
            ``ignore_columns``.
        label_map: table column -> finding name, for spellings no alias covers.
        ignore_columns: columns dropped without complaint.
        keep_columns: columns copied into the manifest as they are (age, sex, ...).
        vocabulary: finding names a label may resolve to.
        **kwargs: see :class:`AdapterSource`.
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
        self._labels: tuple[str, ...] = ()

    @property
    def labels(self) -> tuple[str, ...]:
        if not self._labels:
            raise RuntimeError("labels are known once build() has read the table")
        return self._labels

    def key(self) -> dict:
        return {**super().key(), **{k: str(v) for k, v in vars(self).items() if k not in ("root", "out_dir")}}

    def build(self) -> pd.DataFrame:
        tables = self.table if isinstance(self.table, dict) else {UNASSIGNED: self.table}
        unknown = set(tables) - {UNASSIGNED, "train", "val", "test"}
        raise_if([f"table key {k!r} is not train, val or test" for k in sorted(unknown)], "data.source.table")
        if "train" in tables and "val" not in tables:  # validation is carved out of train, by patient
            tables = {(UNASSIGNED if k == "train" else k): v for k, v in tables.items()}
        parts = [self._read_one(self.root / rel, split) for split, rel in tables.items()]
        table = pd.concat(parts, ignore_index=True)
        duplicated = table["image_id"][table["image_id"].duplicated()]
        raise_if([f"image id {i!r} appears in more than one table" for i in duplicated.unique()[:10]], "tables")
        return table

    def _read_one(self, path: Path, split: str) -> pd.DataFrame:
        raw = read_table(path)
        named = [self.image_column, self.id_column, self.patient_column, self.split_column, self.view_column]
        require_columns(raw, [c for c in named if c] + list(self.extra_columns), path)
        problems = id_problems(raw, self.id_column, path)
        if self.patient_column:
            problems += id_problems(raw, self.patient_column, path, unique=False)
        else:
            log.warning("%s: no patient column; each image is treated as its own patient", path)

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
        self._labels = self._labels or labels

        out = pd.DataFrame({
            "image_id": raw[self.id_column].str.strip(),
            "path": raw[self.image_column].str.strip().map(self._image_path),
            "split": self._splits(raw, path, split, problems),
            "patient_id": raw[self.patient_column].str.strip() if self.patient_column else raw[self.id_column],
            "source": self.source_label,
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

    def _splits(self, raw: pd.DataFrame, path: Path, split: str, problems: list[str]) -> pd.Series:
        if not self.split_column:
            return pd.Series(split, index=raw.index, dtype=object)
        text = raw[self.split_column].str.strip().str.lower()
        mapped = text.map(lambda v: SPLIT_NAMES.get(v, UNASSIGNED if v == "" else None))
        problems += listed("bad splits", [f"{path}, line {csv_line(i)}, column {self.split_column!r}: unknown split "
                                          f"{raw.at[i, self.split_column]!r} (use one of {sorted(set(SPLIT_NAMES))})"
                                          for i in mapped.index[mapped.isna()]])  # fmt: skip
        return mapped.fillna(UNASSIGNED)


class CXRLT2026Source(TableSource):
    """The CXR-LT 2026 release: PadChest images (16-bit PNG) and an ``ImageID``-keyed label table.

    Defaults follow the release (``ImageID`` and ``PatientID`` columns, class columns in the organisers'
    spelling, matched to the paper's names through :mod:`training.data.label_names`); every one can be changed in
    ``configs/data/cxrlt2026.yaml`` without code.
    """

    def __init__(self, root: str, name: str = "cxrlt2026", image_column: str = "ImageID", id_column: str = "ImageID",
                 patient_column: str = "PatientID", source_label: str = "padchest", **kwargs):  # fmt: skip
        super().__init__(root, name, image_column=image_column, id_column=id_column, patient_column=patient_column,
                         source_label=source_label, **kwargs)  # fmt: skip


__all__ = ["AdapterError", "CXRLT2026Source", "TableSource"]
