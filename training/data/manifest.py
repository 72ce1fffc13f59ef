"""Loading and validating the manifest: the one table every dataset is turned into (docs/rules.md §6).

Validation runs before any model is built, so a broken dataset fails in seconds with every problem listed by
row and column, instead of training silently on half the data.
"""

from __future__ import annotations

import difflib
import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

META_COLUMNS = ("image_id", "path", "split", "patient_id", "source", "view")
REQUIRED_COLUMNS = ("image_id", "path", "split", "patient_id")
SPLITS = ("train", "val", "test")
MAX_LISTED = 10  # problems listed per kind before summarising


class ManifestError(ValueError):
    """A manifest that cannot be trained on; the message lists each problem with its file, row and column."""


@dataclass(frozen=True)
class Manifest:
    """A validated manifest.

    Attributes:
        table: one row per image, metadata columns as strings, label columns as float (1, 0, NaN = not labelled).
        root: folder the ``path`` column is relative to.
        labels: the label columns selected for the task, in task order.
        fingerprint: short content hash of the manifest file, recorded with every run so results can be traced
            back to the exact data they came from.
        source_file: the CSV the table was read from.
    """

    table: pd.DataFrame
    root: Path
    labels: tuple[str, ...]
    fingerprint: str
    source_file: Path

    def split(self, name: str) -> pd.DataFrame:
        """Rows of one split, index reset."""
        return self.table[self.table["split"] == name].reset_index(drop=True)

    def positions(self, name: str) -> np.ndarray:
        """Row positions (0-based, file order) of a split's images: their keys in the preprocessing cache."""
        return np.flatnonzero((self.table["split"] == name).to_numpy())

    def targets(self, name: str) -> np.ndarray:
        """``(N, C)`` float32 targets of a split with -1 where a label is missing (the metrics' ``ignore_index``)."""
        values = self.split(name)[list(self.labels)].to_numpy(dtype=np.float32)
        return np.where(np.isnan(values), -1.0, values).astype(np.float32)

    def class_counts(self, name: str = "train") -> np.ndarray:
        """Positive count per task label on a split, ``(C,)`` int64."""
        return (self.targets(name) == 1).sum(axis=0).astype(np.int64)


def file_fingerprint(path: Path) -> str:
    """First 12 hex digits of the SHA-256 of a file."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()[:12]


def load_manifest(
    csv_path: str | Path,
    labels: Sequence[str],
    known_findings: Sequence[str],
    root: str | Path | None = None,
    extra_columns: Sequence[str] = (),
    check_files: bool = True,
) -> Manifest:
    """Read a manifest CSV and validate it against the task's labels.

    Args:
        csv_path: the manifest file.
        labels: the task's label columns; each must be present.
        known_findings: every finding name the platform knows; any other non-metadata column is reported as an
            unknown label column (usually a typo or a spelling from another release), with the closest known name.
        root: folder image paths are relative to; defaults to the manifest's folder.
        extra_columns: additional non-label columns the dataset carries (age, sex, ...), declared so they are not
            mistaken for labels.
        check_files: verify every image file exists (cheap: one ``stat`` per row).

    Raises:
        ManifestError: listing every problem found, each naming the file, CSV line and column.
    """
    csv_path = Path(csv_path)
    if not csv_path.is_file():
        raise ManifestError(f"manifest not found: {csv_path}")
    root = Path(root) if root is not None else csv_path.parent
    table = pd.read_csv(csv_path, dtype=str, keep_default_na=False)
    problems = _validate(table, csv_path, root, labels, known_findings, extra_columns, check_files)
    if problems:
        raise ManifestError(f"{csv_path}: {len(problems)} problem(s), nothing was trained:\n  " + "\n  ".join(problems))
    for column in labels:
        table[column] = pd.to_numeric(table[column].replace("", np.nan)).astype(float)
    return Manifest(table, root, tuple(labels), file_fingerprint(csv_path), csv_path)


def csv_line(index: int) -> int:
    """CSV line number of a 0-based data row (line 1 is the header)."""
    return index + 2


def listed(kind: str, items: list[str]) -> list[str]:
    """The first :data:`MAX_LISTED` problems of one kind, then a count of the rest (errors stay readable)."""
    shown = items[:MAX_LISTED]
    if len(items) > MAX_LISTED:
        shown.append(f"... and {len(items) - MAX_LISTED} more {kind}")
    return shown


def _validate(table, csv_path, root, labels, known_findings, extra_columns, check_files) -> list[str]:
    problems: list[str] = []
    missing_meta = [c for c in REQUIRED_COLUMNS if c not in table.columns]
    if missing_meta:
        return [f"missing required column(s) {missing_meta}; a manifest needs {list(REQUIRED_COLUMNS)}"]

    known = set(known_findings) | set(labels)
    for column in table.columns:
        if column in META_COLUMNS or column in extra_columns or column in known:
            continue
        close = difflib.get_close_matches(column, sorted(known), n=1, cutoff=0.75)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        problems.append(
            f"column {column!r}: unknown label column{hint}; declare non-label columns in data.extra_columns"
        )
    for label in labels:
        if label not in table.columns:
            problems.append(f"column {label!r}: required by the task but absent from the manifest")

    empty_ids = table.index[table["image_id"].str.strip() == ""].tolist()
    problems += listed("empty ids", [f"line {csv_line(i)}, column 'image_id': empty" for i in empty_ids])
    duplicated = table[table["image_id"].duplicated(keep=False) & (table["image_id"] != "")]
    dup_msgs = [
        f"column 'image_id': {image_id!r} duplicated on lines {[csv_line(i) for i in rows.index]}"
        for image_id, rows in duplicated.groupby("image_id", sort=False)
    ]
    problems += listed("duplicated ids", dup_msgs)

    bad_split = table.index[~table["split"].isin(SPLITS)].tolist()
    problems += listed(
        "bad splits",
        [f"line {csv_line(i)}, column 'split': {table.at[i, 'split']!r} is not one of {SPLITS}" for i in bad_split],
    )
    shared = table.groupby("patient_id")["split"].nunique()
    leaking = shared[shared > 1].index.tolist()
    problems += listed(
        "patients in several splits",
        [
            f"column 'patient_id': patient {p!r} appears in several splits (splits must be patient-disjoint)"
            for p in leaking
        ],
    )

    for label in (c for c in labels if c in table.columns):
        bad = table.index[~table[label].isin(("0", "1", "0.0", "1.0", ""))].tolist()
        problems += listed(
            f"bad values in {label!r}",
            [f"line {csv_line(i)}, column {label!r}: {table.at[i, label]!r} is not 0, 1 or empty" for i in bad],
        )

    if check_files:
        missing = [i for i, rel in enumerate(table["path"]) if not (root / rel).is_file()]
        problems += listed(
            "missing images",
            [f"line {csv_line(i)}, column 'path': image file not found: {root / table.at[i, 'path']}" for i in missing],
        )
    return problems
