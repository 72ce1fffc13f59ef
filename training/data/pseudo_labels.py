"""The record a pseudo-labelled manifest carries beside it, and the data source that trains on one.

The manifest stays an ordinary one (docs/rules.md §6: 1, 0 or empty), so any command reads it; which cells are
pseudo-labels, from which run and at which thresholds is in ``<manifest>.pseudo.json`` (:func:`record_path`).
It lives in ``training/`` because both the writer (:mod:`apps.pseudo_label`) and the training run need it.
"""

from __future__ import annotations

import json
from pathlib import Path

from training.data.manifest import file_fingerprint
from training.data.sources import ManifestSource
from training.errors import UserError

FORMAT = 1
SUFFIX = ".pseudo.json"
#: The keys a record must hold for a training run to trust its counts.
REQUIRED = ("format", "manifest_fingerprint", "root", "source_run", "thresholds_mode", "thresholds", "cells")


class PseudoLabelError(UserError, ValueError):
    """A pseudo-label record that is missing, unreadable or does not belong to its manifest."""


def record_path(manifest: str | Path) -> Path:
    """``<manifest>.pseudo.json``: the record beside the manifest it describes (CSV has no place for a header)."""
    manifest = Path(manifest)
    return manifest.with_name(manifest.name + SUFFIX)


def read_record(manifest: str | Path) -> dict:
    """The record of ``manifest``, checked to be a record of this very file (a manifest edited after
    ``make pseudo-label`` no longer matches the cells it lists).

    Raises:
        PseudoLabelError: no record, not JSON, a key missing, or the manifest's content changed since.
    """
    path = record_path(manifest)
    if not path.is_file():
        raise PseudoLabelError(f"{path}: no pseudo-label record beside {manifest}; make pseudo-label writes it "
                               "(data=manifest trains on the file without one)")  # fmt: skip
    try:
        record = json.loads(path.read_text())
    except (ValueError, UnicodeDecodeError) as error:
        raise PseudoLabelError(f"{path}: not a JSON pseudo-label record ({error})") from None
    missing = [key for key in REQUIRED if not isinstance(record, dict) or key not in record]
    if missing:
        raise PseudoLabelError(f"{path}: not a pseudo-label record, missing {missing}")
    if record["manifest_fingerprint"] != file_fingerprint(manifest):
        raise PseudoLabelError(f"{path}: records manifest content {record['manifest_fingerprint']}, but {manifest} is "
                               f"{file_fingerprint(manifest)}: the manifest changed after make pseudo-label; run it "
                               "again, or train with data=manifest without the record")  # fmt: skip
    return record


def cell_counts(record: dict) -> dict[str, int]:
    """How many cells of the record are pseudo-labels, in total and positive (1) / negative (0)."""
    cells = record["cells"]
    positive = sum(len(cells[name].get("1", [])) for name in cells)
    negative = sum(len(cells[name].get("0", [])) for name in cells)
    return {"cells": positive + negative, "positive": positive, "negative": negative, "classes": len(cells)}


class PseudoLabelledSource(ManifestSource):
    """A manifest written by ``make pseudo-label``: trained on as any manifest, its record checked and counted.

    ``root`` defaults to the image folder the record names.
    """

    def __init__(self, manifest: str, root: str | None = None, name: str = "pseudo_labelled"):
        super().__init__(manifest, root, name)
        self.record: dict | None = None
        self._root_given = bool(root)

    def prepare(self) -> Path:
        self.record = read_record(self.manifest)
        if not self._root_given:
            self.root = Path(self.record["root"])
        return self.manifest

    @property
    def extra_columns(self) -> tuple[str, ...]:
        """The metadata columns ``make pseudo-label`` was told of, so the new manifest trains without declaring
        them again; a record's value that is not a list of names is refused (the record is read back, untrusted)."""
        declared = (self.record or {}).get("extra_columns", [])
        if not isinstance(declared, list) or not all(isinstance(name, str) for name in declared):
            raise PseudoLabelError(f"{record_path(self.manifest)}: 'extra_columns' must be a list of column names")
        return tuple(declared)

    @property
    def run_tags(self) -> dict[str, str]:
        """What the run records of its pseudo-labels: their counts, the run that made them and its thresholds."""
        if self.record is None:
            return {}
        counts = {f"cxrlt.pseudo_labels.{key}": str(value) for key, value in cell_counts(self.record).items()}
        return {**counts, "cxrlt.pseudo_labels.source_run": str(self.record["source_run"]),
                "cxrlt.pseudo_labels.thresholds": str(self.record["thresholds_mode"]),
                "cxrlt.pseudo_labels.margin": str(self.record.get("margin", 0.0))}  # fmt: skip
