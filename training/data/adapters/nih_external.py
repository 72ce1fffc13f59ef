"""CXR-LT 2026 Task 2's external test: NIH ChestX-ray images, as test rows of source ``nih`` in the CXR-LT manifest.

The organisers' list of those images (``list``) defines the set; NIH's own table adds patient ids and fills the
seen classes the list leaves out. Without the list there is a **stand-in**: every image of NIH's table, labelled
for the CXR-LT classes NIH labels too (:data:`STAND_IN`). NIH labels none of Task 2's six unseen findings, so the
stand-in leaves them not labelled: it exercises the external pipeline and the seen classes but gives no
unseen-class external figures, which is said when it is built. Data: docs/data.md, "The CXR-LT 2026 release".
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from training.data.adapters.base import AdapterError
from training.data.adapters.spreadsheets import id_problems, label_values, match_label_columns, raise_if, read_table
from training.data.findings import KNOWN_FINDINGS

log = logging.getLogger(__name__)

#: NIH ``Finding Labels`` name -> the CXR-LT class it labels. Left out on purpose: Infiltration, Pneumonia,
#: Consolidation, Edema and Fibrosis (no CXR-LT 2026 class with that definition) and ``No Finding`` (it only rules
#: out NIH's 14 findings, which is not PadChest's ``Normal``).
STAND_IN: dict[str, str] = {
    "Atelectasis": "Atelectasis", "Cardiomegaly": "Cardiomegaly", "Effusion": "Pleural Effusion",
    "Emphysema": "Emphysema", "Hernia": "Hernia", "Mass": "Mass", "Nodule": "Nodule",
    "Pleural_Thickening": "Pleural Thickening", "Pneumothorax": "Pneumothorax",
}  # fmt: skip
NIH_ID, NIH_PATIENT, NIH_FINDINGS = "Image Index", "Patient ID", "Finding Labels"


def image_key(image_id: str) -> str:
    """An NIH image id with or without its ``.png``: NIH's table writes ``00000001_000.png``, lists often drop it."""
    return image_id[:-4] if image_id.lower().endswith(".png") else image_id


@dataclass(frozen=True)
class NIHExternal:
    """Where the external test's images and labels are (``data.source.external`` in configs/data/cxrlt2026.yaml).

    Args:
        list: the organisers' external test table, relative to ``root`` or absolute; None: the stand-in.
        labels: NIH's own table (``Data_Entry_2017*.csv``), relative to ``root`` or absolute; None: not used.
        label_map: list column -> finding name, for spellings no alias covers.
    """

    root: str
    list: str | None = None
    labels: str | None = None
    id_column: str = "ImageID"
    label_map: Mapping[str, str] = field(default_factory=dict)
    ignore_columns: Sequence[str] = ()
    source: str = "nih"

    def _path(self, name: str) -> Path:
        path = Path(name).expanduser()
        return path if path.is_absolute() else Path(self.root).expanduser() / path

    def build(self, vocabulary: Sequence[str] = KNOWN_FINDINGS) -> pd.DataFrame:
        """Manifest rows (split ``test``, absolute image paths) with one column per label found.

        Raises:
            AdapterError: the folder or a named table is missing, or a table has a bad id, class name or value
                (each named by file, line and column); or neither a list nor NIH's table is given.
        """
        root = Path(self.root).expanduser()
        if not root.is_dir():
            raise AdapterError(f"data.source.external.root: NIH folder not found: {root}")
        nih = self._nih_table() if self.labels else None
        if self.list:
            rows, labels = self._organisers_list(vocabulary)
        elif nih is not None:
            log.warning("NIH external test: no organisers' list (data.source.external.list), so the stand-in from "
                        "NIH's own labels: %d images, seen classes %s only; the six unseen classes are not labelled "
                        "(no external unseen-class figures)", len(nih), sorted(set(STAND_IN.values())))  # fmt: skip
            rows, labels = nih[["image_id"]].copy(), []
        else:
            raise AdapterError("data.source.external: give the organisers' list (list: <csv>) or NIH's table "
                               "(labels: Data_Entry_2017_v2020.csv) for the stand-in")  # fmt: skip
        if nih is not None:
            rows = self._fill_from_nih(rows, labels, nih, vocabulary)
        else:
            rows["patient_id"] = rows["image_id"]  # no NIH table: no patient ids, each image its own patient
        rows["path"] = self._paths(rows["image_id"], root)
        rows["split"], rows["source"], rows["view"] = "test", self.source, ""
        return rows.reset_index(drop=True)

    def _organisers_list(self, vocabulary: Sequence[str]) -> tuple[pd.DataFrame, list[str]]:
        path = self._path(self.list)
        raw = read_table(path)
        if self.id_column not in raw.columns:
            raise AdapterError(f"{path}: missing the image id column {self.id_column!r} (data.source.external."
                               f"id_column); the table has {list(raw.columns)}")  # fmt: skip
        problems = id_problems(raw, self.id_column, path)
        candidates = [c for c in raw.columns if c != self.id_column]
        mapping = match_label_columns(candidates, vocabulary, path, self.label_map, self.ignore_columns)
        rows = pd.DataFrame({"image_id": raw[self.id_column].str.strip()})
        for column, finding in mapping.items():
            rows[finding], bad = label_values(raw, column, path)
            problems += bad
        raise_if(problems, str(path))
        return rows, list(mapping.values())

    def _nih_table(self) -> pd.DataFrame:
        path = self._path(self.labels)
        raw = read_table(path)
        missing = [c for c in (NIH_ID, NIH_PATIENT, NIH_FINDINGS) if c not in raw.columns]
        if missing:
            raise AdapterError(f"{path}: missing column(s) {missing} of NIH's Data_Entry table")
        raise_if(id_problems(raw, NIH_ID, path), str(path))
        names = raw[NIH_FINDINGS].str.split("|").map(lambda found: {n.strip() for n in found})
        table = pd.DataFrame({"image_id": raw[NIH_ID].str.strip(), "patient_id": raw[NIH_PATIENT].str.strip()})
        for nih_name, finding in STAND_IN.items():
            table[finding] = names.map(lambda found, n=nih_name: float(n in found))
        return table

    def _fill_from_nih(self, rows: pd.DataFrame, given: list[str], nih: pd.DataFrame,
                       vocabulary: Sequence[str]) -> pd.DataFrame:  # fmt: skip
        """Patient ids, and the stand-in labels of the classes the list does not give, from NIH's table."""
        indexed = nih.set_index(nih["image_id"].map(image_key))
        keys = rows["image_id"].map(image_key)
        unknown = keys[~keys.isin(indexed.index)]
        if len(unknown):
            log.warning("NIH external test: %d listed image(s) not in %s (e.g. %s): no patient id or NIH labels",
                        len(unknown), self.labels, list(unknown[:3]))  # fmt: skip
        found = indexed.reindex(keys)
        rows["patient_id"] = np.where(found["patient_id"].notna(), found["patient_id"], rows["image_id"])
        for finding in STAND_IN.values():
            if finding not in given and finding in vocabulary:
                rows[finding] = found[finding].to_numpy()
        return rows

    @staticmethod
    def _paths(image_ids: pd.Series, root: Path) -> pd.Series:
        """Absolute path of each image wherever it sits under the NIH folder (``images/<id>.png`` when not found, so
        the manifest check names the missing file). Absolute because the NIH folder is not under the release's."""
        wanted = {image_key(i) for i in image_ids}
        found = {image_key(p.name): p.resolve() for p in root.rglob("*.png") if image_key(p.name) in wanted}
        return image_ids.map(lambda i: str(found.get(image_key(i), root.resolve() / "images" / f"{image_key(i)}.png")))
