"""NIH ChestX-ray14 (Wang et al. 2017) as released: ``Data_Entry_2017*.csv`` plus PNG folders."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from training.data.adapters.base import UNASSIGNED, AdapterError, AdapterSource
from training.data.adapters.spreadsheets import id_problems, raise_if, read_table, require_columns
from training.data.findings import NIH14_LABELS
from training.data.manifest import csv_line, listed

COLUMNS = {  # release column -> manifest column
    "Image Index": "image_id", "Patient ID": "patient_id", "View Position": "view",
    "Follow-up #": "follow_up", "Patient Age": "age", "Patient Gender": "sex", "Finding Labels": "finding_labels",
}  # fmt: skip


class NIH14Source(AdapterSource):
    """The release's label table as a manifest with the 14 findings plus ``No Finding``.

    A name outside the 14 is an error naming its line. When the release's ``test_list.txt`` is present it defines
    the test split and the rest is split by patient; otherwise all three splits are drawn by stratified patient
    split. ``table`` defaults to the first ``Data_Entry_2017*.csv`` found.
    """

    extra_columns = ("follow_up", "age", "sex", "finding_labels")

    def __init__(self, root: str, name: str = "nih14", table: str | None = None, test_list: str = "test_list.txt",
                 **kwargs):  # fmt: skip
        super().__init__(root, name, **kwargs)
        self.table, self.test_list = table, test_list

    @property
    def labels(self) -> tuple[str, ...]:
        return NIH14_LABELS

    def key(self) -> dict:
        return {**super().key(), "table": self.table, "test_list": self.test_list}

    def table_path(self) -> Path:
        if self.table:
            return self.root / self.table
        found = sorted(self.root.glob("Data_Entry_2017*.csv*"))
        if not found:
            raise AdapterError(f"{self.root}: no Data_Entry_2017*.csv label table (set data.source.table)")
        return found[0]

    def build(self) -> pd.DataFrame:
        path = self.table_path()
        raw = read_table(path)
        require_columns(raw, COLUMNS, path)
        table = raw[list(COLUMNS)].rename(columns=COLUMNS)
        for column in table:
            table[column] = table[column].str.strip()
        problems = id_problems(table, "image_id", path) + id_problems(table, "patient_id", path, unique=False)

        findings = table["finding_labels"].str.split("|")
        known = set(NIH14_LABELS)
        bad = [(i, name) for i, names in findings.items() for name in names if name.strip() not in known]
        problems += listed("unknown findings", [f"{path}, line {csv_line(i)}, column 'Finding Labels': unknown "
                                                f"finding {name!r}" for i, name in bad])  # fmt: skip
        raise_if(problems, f"{path}")

        positives = findings.map(lambda names: {n.strip() for n in names})
        for label in NIH14_LABELS:
            table[label] = positives.map(lambda names, label=label: float(label in names))
        table["path"] = self._paths(table["image_id"])
        table["source"] = "nih"
        table["split"] = self._official_test(table["image_id"])
        return table

    def _paths(self, image_ids: pd.Series) -> pd.Series:
        """Relative path of each image wherever it sits under the root (``images/<id>`` when not found, so the
        manifest check names the missing file)."""
        wanted = set(image_ids)
        found = {p.name: p.relative_to(self.root).as_posix() for p in self.root.rglob("*") if p.name in wanted}
        return image_ids.map(lambda i: found.get(i, f"images/{i}"))

    def _official_test(self, image_ids: pd.Series) -> np.ndarray:
        listing = self.root / self.test_list
        if not listing.is_file():
            return np.full(len(image_ids), UNASSIGNED, dtype=object)
        test = {row.strip() for row in listing.read_text().splitlines() if row.strip()}
        return np.where(image_ids.isin(test), "test", UNASSIGNED).astype(object)
