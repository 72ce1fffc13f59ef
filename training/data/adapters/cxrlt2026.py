"""The CXR-LT 2026 release as the organisers ship it, read unchanged into a manifest (docs/data.md, "The CXR-LT 2026
release"; every setting in ``configs/data/cxrlt2026.yaml``).

Contracts kept here: ``Removal.csv`` images are dropped before anything else (training on them disqualifies a
team); no image of an evaluation list is ever trained on, whatever the tables say. The release's ``PatientID``
went through a spreadsheet (``3.24E+38``), so one value covers many patients: with ``padchest_table`` the true id
is recovered, otherwise the lossy value is the group (over-grouping never leaks, it only coarsens the split) and
is written ``approx:<value>``, never as a number. Evaluation rows keep the organisers' split under an ``eval:``
patient prefix, so the split check does not read the organisers' choice as a leak.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from evaluation.organiser_names import TASK1_COLUMNS
from training.data.adapters.base import AdapterError, AdapterSource
from training.data.adapters.cxrlt2026_files import (
    ID_COLUMNS,
    REMOVAL,
    TEST_LISTS,
    TRAINING_TABLE,
    padchest_patients,
    read_release_table,
    removal_ids,
)
from training.data.adapters.nih_external import NIHExternal
from training.data.adapters.spreadsheets import id_problems, label_values, match_label_columns, raise_if
from training.data.findings import CXRLT_FINDINGS, TASK1_LABELS
from training.data.splits import stratified_patient_split

log = logging.getLogger(__name__)

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".dcm")
LOSSY, EVAL = "approx:", "eval:"
SHOWN = 10  # removed images listed by make data-check


def image_index(root: Path) -> dict[str, str]:
    """``{file name: path relative to root}`` of every image under ``root``.

    Raises:
        AdapterError: one file name in two folders, which would make ``ImageID`` ambiguous.
    """
    found: dict[str, str] = {}
    twice = []
    for folder, _, files in os.walk(root):
        for name in files:
            if name.lower().endswith(IMAGE_SUFFIXES):
                relative = (Path(folder) / name).relative_to(root).as_posix()
                if name in found:
                    twice.append(f"{name!r} is both {found[name]} and {relative}")
                found.setdefault(name, relative)
    raise_if(twice[:10], f"{root}: image files")
    return found


class CXRLT2026Source(AdapterSource):
    """The organisers' release folder as a manifest (see the module docstring).

    Args:
        padchest_table: PadChest's own label table (or its folder) to recover true patient ids; None: the lossy
            column is used.
        eval_labels: tables in the release's layout labelling evaluation images; they become the test split.
        external: ``{root, list, labels, ...}`` of Task 2's NIH external test
            (:class:`training.data.adapters.nih_external.NIHExternal`), or None.
    """

    def __init__(self, root: str, name: str = "cxrlt2026", padchest_table: str | None = None,
                 eval_labels: Sequence[str] = (), external: Mapping | None = None, source_label: str = "padchest",
                 **kwargs):  # fmt: skip
        super().__init__(root, name, **kwargs)
        self.padchest_table = Path(padchest_table).expanduser() if padchest_table else None
        self.eval_labels = tuple(str(p) for p in eval_labels or ())
        self.source_label = source_label
        self.external = NIHExternal(**{"source": "nih", **dict(external)}) if external else None
        self._labels: tuple[str, ...] = ()
        self.counts: dict[str, int | str] = {}
        self.evaluation_missing = 0
        self.removed: list[str] = []
        self._true_patients: pd.Series | None = None

    @property
    def labels(self) -> tuple[str, ...]:
        if not self._labels:
            raise RuntimeError("labels are known once build() has read the training table")
        return self._labels

    @property
    def extra_image_roots(self) -> tuple[Path, ...]:
        """The NIH folder, whose images the manifest names by absolute path."""
        return (Path(self.external.root).expanduser(),) if self.external is not None else ()

    def key(self) -> dict:
        return {**super().key(), "padchest_table": str(self.padchest_table), "eval_labels": self.eval_labels,
                "external": str(self.external), "source_label": self.source_label}  # fmt: skip

    @property
    def run_tags(self) -> dict[str, str]:
        """What the run must record about the release: removals, evaluation images kept out, patient identity."""
        return {f"cxrlt.release.{k}": str(v) for k, v in self.counts.items()}

    @property
    def check_sections(self) -> dict[str, str]:
        """``make data-check``'s section on the release."""
        lines = [f"{k.replace('_', ' ')}: {v}" for k, v in self.counts.items()]
        lines += [f"  removed (in {REMOVAL}): {image_id}" for image_id in self.removed[:SHOWN]]
        if len(self.removed) > SHOWN:
            lines.append(f"  ... {len(self.removed) - SHOWN} more")
        return {"CXR-LT 2026 release": "\n".join(lines)}

    # -- building ------------------------------------------------------------------------------------------------

    def build(self) -> pd.DataFrame:
        images = image_index(self.root)
        train = self._training_rows(images)
        removal = self.root / REMOVAL
        removed = removal_ids(removal) if removal.is_file() else frozenset()
        in_removal = train["image_id"].isin(removed)
        evaluation = self._evaluation_rows(images)
        in_lists = train["image_id"].isin(set(evaluation["image_id"]))
        self.counts = {
            "training_rows": len(train),
            "removal_listed": len(removed) if removal.is_file() else f"no {REMOVAL} in the release folder",
            "removed_from_training": int(in_removal.sum()),
            "evaluation_images_kept_out_of_training": int((in_lists & ~in_removal).sum()),
        }
        if not removal.is_file():
            log.warning("%s: no %s in %s: the images it lists must never be trained on; put the organisers' file "
                        "there", self.name, REMOVAL, self.root)  # fmt: skip
        self.removed = sorted(train.loc[in_removal, "image_id"])
        train = train[~in_removal & ~in_lists]
        self.counts.update(self._patient_counts(train, evaluation))
        parts = [train, evaluation]
        if self.external is not None:
            nih = self.external.build(CXRLT_FINDINGS)
            clash = sorted(set(nih["image_id"]) & set(train["image_id"]).union(evaluation["image_id"]))
            raise_if([f"NIH external image id {i!r} is also in the release" for i in clash[:10]],
                     "data.source.external")  # fmt: skip
            parts.append(nih)
        table = pd.concat(parts, ignore_index=True)
        self._labels = tuple(c for c in CXRLT_FINDINGS if c in table.columns)
        log.info("%s: %s", self.name, "; ".join(f"{k.replace('_', ' ')} {v}" for k, v in self.counts.items()))
        return table

    def _training_rows(self, images: dict[str, str]) -> pd.DataFrame:
        path = self.root / TRAINING_TABLE
        if not path.is_file():
            raise AdapterError(f"{self.root}: no {TRAINING_TABLE} (the organisers' training table, named as "
                               "released); data.root must be the release folder")  # fmt: skip
        raw = read_release_table(path)
        rows = self._labelled_rows(raw, path, images, require=TASK1_LABELS)
        rows["patient_id"] = self._patients(raw).to_numpy()
        if self.padchest_table is None:
            log.warning("%s: patient ids are the release's rounded PatientID (%d values for %d images); give "
                        "data.padchest_table=<PadChest's label table> to split by true patient", self.name,
                        raw["PatientID"].nunique(), len(raw))  # fmt: skip
        elif (unmatched := int(rows["patient_id"].str.startswith(LOSSY).sum())) > 0:
            log.warning("%s: %d of %d training images are not in %s: their rounded PatientID is kept", self.name,
                        unmatched, len(raw), self.padchest_table)  # fmt: skip
        rows["split"] = ""
        return rows

    def _patients(self, raw: pd.DataFrame) -> pd.Series:
        """Each row's patient: PadChest's own id when its table is given and names the image, else the release's
        rounded value, marked ``approx:`` (a manifest id is text, never a number in scientific notation)."""
        lossy = LOSSY + raw["PatientID"]
        if self.padchest_table is None:
            return lossy
        if self._true_patients is None:
            self._true_patients = padchest_patients(self.padchest_table)
        return raw["ImageID"].map(self._true_patients).fillna(lossy)

    def _labelled_rows(self, raw: pd.DataFrame, path: Path, images: dict[str, str],
                       require: Sequence[str] = ()) -> pd.DataFrame:  # fmt: skip
        """Manifest rows of a table in the release's layout: ids, image paths and its class columns."""
        problems = id_problems(raw, "ImageID", path)
        mapping = match_label_columns([c for c in raw.columns if c not in ID_COLUMNS], CXRLT_FINDINGS, path)
        missing = [TASK1_COLUMNS[name] for name in require if name not in mapping.values()]
        problems += [f"{path}, line 1: no column {column!r} (the organisers' name of a Task 1 class)"
                     for column in missing]  # fmt: skip
        rows = pd.DataFrame({
            "image_id": raw["ImageID"], "path": raw["ImageID"].map(lambda i: images.get(i, i)),
            "source": self.source_label, "view": "",
        })  # fmt: skip
        for column, finding in mapping.items():
            rows[finding], bad = label_values(raw, column, path)
            problems += bad
        raise_if(problems, str(path))
        return rows

    def _evaluation_rows(self, images: dict[str, str]) -> pd.DataFrame:
        """Test rows of the evaluation lists whose image is in the folder, labelled by ``eval_labels``."""
        listed: dict[str, str] = {}  # ImageID -> PatientID as the list gives it
        labelled = []
        tables = [self.root / name for name in TEST_LISTS.values() if (self.root / name).is_file()]
        for path in tables + [Path(p) if Path(p).is_absolute() else self.root / p for p in self.eval_labels]:
            raw = read_release_table(path)
            listed.update(zip(raw["ImageID"], self._patients(raw), strict=True))
            if str(path) not in map(str, tables):
                labelled.append(self._labelled_rows(raw, path, images).drop(columns=["path", "source", "view"]))
        rows = pd.DataFrame({"image_id": list(listed), "patient_id": [EVAL + p for p in listed.values()]}, dtype=str)
        if labelled:  # a class labelled in several tables: the first table that labels the image wins
            labels = pd.concat(labelled).groupby("image_id", sort=False).first().reset_index()
            rows = rows.merge(labels, on="image_id", how="left")
        on_disk = rows["image_id"].isin(images)
        self.evaluation_missing = int((~on_disk).sum())
        if self.evaluation_missing:
            log.warning("%s: %d evaluation image(s) are not under %s: not in the manifest (make submit needs them)",
                        self.name, self.evaluation_missing, self.root)  # fmt: skip
        rows = rows[on_disk].copy()
        rows["path"] = rows["image_id"].map(images)
        rows["split"], rows["source"], rows["view"] = "test", self.source_label, ""
        return rows

    def _patient_counts(self, train: pd.DataFrame, evaluation: pd.DataFrame) -> dict[str, int | str]:
        """How the patients were identified, and how many evaluation patients the training rows share."""
        rounded = train["patient_id"].str.startswith(LOSSY)
        identity = ("the release's rounded PatientID (lossy)" if self.padchest_table is None else
                    f"PadChest's own PatientID ({int((~rounded).sum())} of {len(train)} images recovered)")  # fmt: skip
        shared = set(evaluation["patient_id"].str.removeprefix(EVAL)) & set(train["patient_id"])
        return {"patient_ids": identity, "distinct_patients": int(train["patient_id"].nunique()),
                "rounded_patient_values": int(train.loc[rounded, "patient_id"].nunique()),
                "evaluation_patients_with_training_images": len(shared)}  # fmt: skip

    def assign_splits(self, table: pd.DataFrame) -> pd.DataFrame:
        """Train/val(/test) for the training rows by patient, stratified on their labels; the evaluation rows stay
        test. No internal test is drawn when evaluation labels are given (the test split is theirs)."""
        table = table.reset_index(drop=True)
        open_rows = (table["split"] == "").to_numpy()
        test = 0.0 if self.eval_labels else self.test_fraction
        fractions = {"train": 1.0 - self.val_fraction - test, "val": self.val_fraction, "test": test}
        fractions = {k: v for k, v in fractions.items() if v > 0}
        values = table.loc[open_rows, list(TASK1_LABELS)].to_numpy(dtype=np.float64)
        table.loc[open_rows, "split"] = stratified_patient_split(table.loc[open_rows, "patient_id"].to_numpy(),
                                                                 values, fractions, seed=self.seed)  # fmt: skip
        return table
