"""Kermany et al. (Cell 2018) pediatric pneumonia: ``{train,test}/{NORMAL,PNEUMONIA}/*.jpeg``."""

from __future__ import annotations

import re
from pathlib import Path

import pandas as pd

from training.data.adapters.base import UNASSIGNED, AdapterError, AdapterSource

CLASS_FOLDERS = {"NORMAL": 0, "PNEUMONIA": 1}
SPLIT_FOLDERS = {"train": UNASSIGNED, "test": "test"}  # the official val split (16 images) is not used
IMAGE_SUFFIXES = (".jpeg", ".jpg", ".png")

# File-name shapes in the release, the patient number first:
#   person123_bacteria_456.jpeg, person123_virus_456.jpeg, person1_virus_6_7.jpeg   -> person123
#   IM-0115-0001.jpeg, IM-0429-0001-0002.jpeg                                          -> IM-0115
#   NORMAL2-IM-0383-0001.jpeg, NORMAL2-IM-0383-0001-0002.jpeg                          -> NORMAL2-IM-0383
PATIENT_PATTERNS = (
    re.compile(r"^(?P<patient>person\d+)_(?P<subtype>bacteria|virus)_\d+(?:_\d+)*$", re.IGNORECASE),
    re.compile(r"^(?P<patient>(?:NORMAL\d+-)?IM-\d+)(?:-\d+)+$", re.IGNORECASE),
)


def parse_name(file_name: str) -> tuple[str, str | None]:
    """Patient key and pneumonia subtype (bacteria/virus, None when the name has none) of a release file name.

    Raises:
        AdapterError: the name matches none of the release's shapes (so no patient can be assigned).
    """
    stem = Path(file_name).stem
    for pattern in PATIENT_PATTERNS:
        match = pattern.match(stem)
        if match:
            return match["patient"], (match.groupdict().get("subtype") or None) and match["subtype"].lower()
    raise AdapterError(f"{file_name}: unrecognised Kermany file name; expected person<N>_<bacteria|virus>_<M> or "
                       "[NORMAL<k>-]IM-<N>-<M>")  # fmt: skip


class KermanySource(AdapterSource):
    """The release's folders as a manifest with one label, ``Pneumonia``, and the subtype as an extra column.

    The official test folder is the test split; the train folder is split by patient into train and validation
    (stratified by label). Train images of patients who also appear in the test folder are excluded and counted.
    """

    extra_columns = ("subtype", "official_split")

    def __init__(self, root: str, name: str = "kermany", **kwargs):
        super().__init__(root, name, **kwargs)

    @property
    def labels(self) -> tuple[str, ...]:
        return ("Pneumonia",)

    def build(self) -> pd.DataFrame:
        rows = []
        for split_dir, split in SPLIT_FOLDERS.items():
            for class_dir, positive in CLASS_FOLDERS.items():
                folder = self.root / split_dir / class_dir
                for path in sorted(p for p in folder.glob("*") if p.suffix.lower() in IMAGE_SUFFIXES):
                    patient, subtype = parse_name(path.name)
                    rel = path.relative_to(self.root).as_posix()
                    rows.append({
                        "image_id": rel.rsplit(".", 1)[0], "path": rel, "split": split, "patient_id": patient,
                        "source": self.name, "view": "", "subtype": subtype or ("normal" if not positive else ""),
                        "official_split": split_dir, "Pneumonia": float(positive),
                    })  # fmt: skip
        if not rows:
            expected = ", ".join(f"{s}/{c}/" for s in SPLIT_FOLDERS for c in CLASS_FOLDERS)
            raise AdapterError(f"{self.root}: no Kermany images found; expected the release layout {expected}")
        return pd.DataFrame(rows)
