"""A ROCOv2-shaped release built from real NIH radiographs, in ROCOv2's own concept vocabulary, for tests.

``write_rocov2_release(root, nih)`` reads ``../shared/data/nih1000`` (1,000 PNG at 64 px; ``labels.csv`` with
``image``, ``patient_id``, ``view`` and the 14 findings) and writes, under ``root`` (a tmp folder, never the repository;
the shared data are read-only):

- ``train/``, ``valid/``, ``test/`` with ``ROCOv2_2023_<split>_<NNNNNN>.jpg`` (the PNG re-encoded as JPEG, as
  ROCOv2 ships), split by patient 60/20/20;
- ``{train,valid,test}_concepts.csv`` (``ID,CUIs``): every image carries C1306645 (plain radiograph) and C0817096
  (chest), C1996865 (PA) or C1999039 (AP) from its view, then the CUIs of its findings
  (:data:`training.data.label_names.NIH_FINDING_CUIS`); gzipped with ``gzip_tables=True``;
- ``test_concepts_manual.csv``: the manually validated kind of concept only (modality, region, direction), for the
  secondary F1;
- ``cui_mapping.csv`` (``CUI,Canonical name``) for the CUIs used.
"""

from __future__ import annotations

import gzip
from pathlib import Path

import cv2
import numpy as np
import pandas as pd

from training.data.label_names import NIH_FINDING_CUIS, ROCOV2_CHEST, ROCOV2_PLAIN_RADIOGRAPH, ROCOV2_VIEW_CUIS

SPLIT_FOLDERS = ("train", "valid", "test")
NAMES = {
    ROCOV2_PLAIN_RADIOGRAPH: "Plain x-ray", ROCOV2_CHEST: "Chest", "C1996865": "Postero-Anterior",
    "C1999039": "Antero-Posterior", "C0004144": "Atelectasis", "C2733397": "Cardiomegaly",
    "C0521530": "Lung consolidation", "C0034063": "Pulmonary edema", "C0032227": "Pleural effusion",
    "C0013990": "Emphysema", "C0034069": "Pulmonary fibrosis", "C3489393": "Hiatal hernia",
    "C0332448": "Infiltration", "C0577559": "Mass of body structure", "C0028259": "Nodule",
    "C0264545": "Pleural thickening", "C0032285": "Pneumonia", "C0032326": "Pneumothorax",
}  # fmt: skip


def concepts_of(row: pd.Series) -> list[str]:
    """An NIH film's ROCOv2 concepts: modality, region, direction, then its findings (NIH column order)."""
    return [ROCOV2_PLAIN_RADIOGRAPH, ROCOV2_CHEST, ROCOV2_VIEW_CUIS[row["view"]]] + [
        cui for finding, cui in NIH_FINDING_CUIS.items() if str(row[finding]) == "1"
    ]


def split_of(patient: str) -> str:
    """60/20/20 by patient number, so a patient's films stay in one split (ROCOv2 itself cannot promise that)."""
    return SPLIT_FOLDERS[(0, 0, 0, 1, 2)[int(patient) % 5]]


def write_rocov2_release(root: Path, nih: Path, n: int = 300, gzip_tables: bool = False) -> dict[str, list[str]]:
    """Write the release layout for ``n`` films of ``nih/labels.csv``; returns the ids per split folder.

    The films are every k-th row (the table is ordered by finding, so its first rows are all "No Finding").
    """
    table = pd.read_csv(nih / "labels.csv", dtype=str, keep_default_na=False)
    table = table.iloc[:: max(len(table) // n, 1)].head(n)
    rows: dict[str, list[tuple[str, list[str]]]] = {folder: [] for folder in SPLIT_FOLDERS}
    for _, row in table.iterrows():
        folder = split_of(row["patient_id"])
        image_id = f"ROCOv2_2023_{folder}_{len(rows[folder]) + 1:06d}"
        target = root / folder / f"{image_id}.jpg"
        target.parent.mkdir(parents=True, exist_ok=True)
        pixels = cv2.imread(str(nih / row["image"]), cv2.IMREAD_GRAYSCALE)
        if pixels is None or not cv2.imwrite(str(target), pixels, [cv2.IMWRITE_JPEG_QUALITY, 95]):
            raise OSError(f"could not copy {nih / row['image']} to {target}")
        rows[folder].append((image_id, concepts_of(row)))
    manual = {ROCOV2_PLAIN_RADIOGRAPH, ROCOV2_CHEST, *ROCOV2_VIEW_CUIS.values()}
    for folder, entries in rows.items():
        _write(root / f"{folder}_concepts.csv", entries, gzip_tables)
        if folder == "test":
            _write(root / "test_concepts_manual.csv", [(i, [c for c in cuis if c in manual]) for i, cuis in entries],
                   gzip_tables)  # fmt: skip
    used = {cui for entries in rows.values() for _, cuis in entries for cui in cuis}
    mapping = pd.DataFrame({"CUI": sorted(used), "Canonical name": [NAMES[c] for c in sorted(used)]})
    mapping.to_csv(root / "cui_mapping.csv", index=False)
    return {folder: [image_id for image_id, _ in entries] for folder, entries in rows.items()}


def _write(path: Path, entries: list[tuple[str, list[str]]], gzip_tables: bool) -> None:
    text = "ID,CUIs\n" + "".join(f"{image_id},{';'.join(cuis)}\n" for image_id, cuis in entries)
    if gzip_tables:
        path.with_name(path.name + ".gz").write_bytes(gzip.compress(text.encode(), mtime=0))
    else:
        path.write_text(text)


def write_nih_standin(folder: Path, n: int = 120, size: int = 64, seed: int = 0) -> Path:
    """A folder shaped like ``nih1000`` (``labels.csv`` + ``images/``) with drawn, not real, films: the default suite
    builds its ROCOv2 release through the same code as the real-data tests without needing ``../shared/data``.

    Findings are drawn with NIH-like prevalences (effusion and infiltration common, hernia rare); an image with
    a finding is brighter, so a smoke run has something to learn.
    """
    rng = np.random.default_rng(seed)
    prevalence = {"Effusion": 0.2, "Infiltration": 0.2, "Atelectasis": 0.12, "Cardiomegaly": 0.1, "Edema": 0.05,
                  "Pneumothorax": 0.05, "Consolidation": 0.05, "Nodule": 0.05, "Mass": 0.04, "Emphysema": 0.04,
                  "Fibrosis": 0.04, "Pleural_Thickening": 0.03, "Pneumonia": 0.02, "Hernia": 0.01}  # fmt: skip
    (folder / "images").mkdir(parents=True, exist_ok=True)
    rows = []
    for i in range(n):
        found = {name: int(rng.random() < p) for name, p in prevalence.items()}
        pixels = rng.normal(90 + 40 * min(sum(found.values()), 2), 20, (size, size))
        cv2.imwrite(str(folder / "images" / f"{i:05d}.png"), np.clip(pixels, 0, 255).astype(np.uint8))
        rows.append({"image": f"images/{i:05d}.png", "patient_id": str(i + 1), "view": ("PA", "AP")[i % 3 == 0],
                     **found, "No Finding": int(not any(found.values()))})  # fmt: skip
    pd.DataFrame(rows).to_csv(folder / "labels.csv", index=False)
    return folder
