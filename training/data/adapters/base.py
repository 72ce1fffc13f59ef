"""What every adapter shares: writing the manifest, assigning missing splits, keeping patients disjoint."""

from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path

import numpy as np
import pandas as pd

from training.data.manifest import META_COLUMNS
from training.data.splits import stratified_patient_split
from training.errors import UserError

log = logging.getLogger(__name__)

UNASSIGNED = ""  # split value of rows the adapter leaves to the stratified splitter


class AdapterError(UserError, ValueError):
    """A native dataset that cannot be turned into a manifest; the message names the file, row and field."""


class AdapterSource:
    """Base class: subclasses implement :meth:`build`, the rest (splits, writing, caching the CSV) is shared.

    The manifest is written under ``out_dir`` (the project's ``data/manifests``), never next to the images: data
    roots are often read-only mounts. Its file name is keyed by the adapter, its arguments and the resolved root,
    and it is rewritten only when its content changes, so the dataset fingerprint is stable across runs.
    ``val_fraction`` / ``test_fraction`` apply only when the release has no such split.
    """

    #: Non-label, non-metadata columns this adapter writes (declared to the manifest validator).
    extra_columns: tuple[str, ...] = ()

    def __init__(
        self,
        root: str,
        name: str,
        out_dir: str = "data/manifests",
        val_fraction: float = 0.1,
        test_fraction: float = 0.2,
        seed: int = 0,
    ):
        if root in (None, "", "???"):
            raise AdapterError(f"data source {name!r} needs its folder: set data.root=<path> (or DATA_ROOT=<path>)")
        self.root = Path(root).expanduser()
        self.name = name
        self.out_dir = Path(out_dir)
        self.val_fraction = val_fraction
        self.test_fraction = test_fraction
        self.seed = seed

    @property
    def patient_ids(self) -> bool:
        """Whether this manifest's ``patient_id`` holds real patient ids. Without them (ROCOv2; a CXR-LT table with
        no patient column) every image is its own patient and patient-disjointness of the splits cannot be
        checked (``make data-check`` says so). Subclasses answer for their release or their configuration."""
        return True

    @property
    def labels(self) -> tuple[str, ...]:
        """Label columns the adapter writes, in order."""
        raise NotImplementedError

    def build(self) -> pd.DataFrame:
        """The manifest rows: metadata columns, ``split`` (``""`` where the release has none) and label columns."""
        raise NotImplementedError

    def prepare(self) -> Path:
        """Build the manifest, fill in missing splits patient-disjointly, write it, and return its path."""
        if not self.root.is_dir():
            raise AdapterError(f"data root not found or not a folder: {self.root}")
        table = self.assign_splits(self.build())
        columns = [c for c in META_COLUMNS if c in table.columns] + list(self.extra_columns) + list(self.labels)
        return self._write(table[columns].copy())

    def assign_splits(self, table: pd.DataFrame) -> pd.DataFrame:
        """Give unassigned rows train/val(/test) by iterative stratification over patients.

        Rows whose patient already appears in an official split (for example the official test list) are
        dropped from the unassigned pool and reported: keeping them would put one patient on both sides.
        """
        table = table.reset_index(drop=True)
        open_rows = table["split"] == UNASSIGNED
        if not open_rows.any():
            return table
        fixed = set(table.loc[~open_rows, "patient_id"])
        clash = open_rows & table["patient_id"].isin(fixed)
        if clash.any():
            log.warning(
                "%s: excluded %d image(s) of %d patient(s) that also appear in an official split "
                "(splits must be patient-disjoint)",
                self.name, int(clash.sum()), table.loc[clash, "patient_id"].nunique(),
            )  # fmt: skip
            table = table[~clash].reset_index(drop=True)
            open_rows = table["split"] == UNASSIGNED
        have = set(table.loc[~open_rows, "split"])
        fractions = {"train": 1.0, "val": self.val_fraction, "test": 0.0 if "test" in have else self.test_fraction}
        fractions["train"] = 1.0 - fractions["val"] - fractions["test"]
        fractions = {k: v for k, v in fractions.items() if v > 0 and k not in have}
        values = table.loc[open_rows, list(self.labels)].apply(pd.to_numeric, errors="coerce").to_numpy()
        table.loc[open_rows, "split"] = stratified_patient_split(
            table.loc[open_rows, "patient_id"].to_numpy(), values, {k: v / sum(fractions.values()) for k, v in
                                                                      fractions.items()}, seed=self.seed
        )  # fmt: skip
        return table

    def _write(self, table: pd.DataFrame) -> Path:
        key = json.dumps(
            {"adapter": type(self).__name__, "root": str(self.root.resolve()), **self.key()}, sort_keys=True
        )
        path = self.out_dir / f"{self.name}-{hashlib.sha256(key.encode()).hexdigest()[:10]}.csv"
        text = manifest_text(table, list(self.labels))
        if path.is_file() and path.read_text() == text:
            return path
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(text)
        os.replace(tmp, path)  # atomic: a reader never sees half a manifest
        log.info("%s: wrote manifest %s (%d images)", self.name, path, len(table))
        return path

    def key(self) -> dict:
        """Arguments that change the manifest (split fractions and seed; subclasses add theirs)."""
        return {"val": self.val_fraction, "test": self.test_fraction, "seed": self.seed}


def manifest_text(table: pd.DataFrame, labels: list[str]) -> str:
    """The manifest CSV of ``table``, whose last columns are ``labels`` (1 / 0 / NaN), written as 1 / 0 / empty.

    A 0/1-only label block is written as bytes in one array operation: the only way hundreds of label columns
    (ROCOv2's concepts) write in seconds, without a Python string per cell. Otherwise pandas writes it; both give
    the same text.
    """
    values = table[labels].to_numpy(dtype=np.float64)  # (N, C)
    meta = table.drop(columns=labels)
    newline_in_meta = meta.astype(str).apply(lambda column: column.str.contains("[\r\n]")).to_numpy().any()
    if list(table.columns[len(meta.columns) :]) != labels or not len(table) or not labels or newline_in_meta \
            or not np.isin(values, (0.0, 1.0)).all():  # fmt: skip
        cells = pd.DataFrame(np.trunc(values), index=table.index, columns=labels).astype("Int64")
        return pd.concat([meta, cells], axis=1).to_csv(index=False, lineterminator="\n")
    head, *rows = meta.to_csv(index=False, lineterminator="\n").split("\n")[:-1]
    header = pd.DataFrame(columns=labels).to_csv(index=False, lineterminator="\n").rstrip("\n")
    width = 2 * len(labels)
    block = np.full((len(table), width), ord(","), dtype=np.uint8)  # (N, 2C): digit, comma, digit, ..., newline
    block[:, 0::2] = values.astype(np.uint8) + ord("0")
    block[:, -1] = ord("\n")
    digits = block.tobytes().decode("ascii")
    return "".join([f"{head},{header}\n", *(f"{row},{digits[i * width : (i + 1) * width]}" for i, row in
                                              enumerate(rows))])  # fmt: skip
