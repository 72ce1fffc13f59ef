"""Small REVEAL-CXR stand-ins for the tests: a multi-reader folder in the NIH expert relabelling's shape, its DICOM
copy, and a release-shaped folder (label table + one DICOM folder per study)."""

from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np
import pandas as pd

from tests.dicom_files import write_display_dicom

FINDINGS = ("airspace_opacity", "nodule_mass", "pneumothorax", "fracture")
READERS = ("4295232296", "4323195249", "4326829894", "0042")  # ids are text: one has a leading zero


def truth(i: int) -> dict[str, int]:
    return {"airspace_opacity": int(i % 2 == 0), "nodule_mass": int(i % 3 == 0), "pneumothorax": int(i % 5 == 0),
            "fracture": int(i % 7 == 0)}  # fmt: skip


def write_reader_folder(root: Path, n: int = 24, size: int = 40, seed: int = 0) -> pd.DataFrame:
    """``n`` PNG images, three of the four readers per image (rotating), ``reads.csv`` and ``adjudicated.csv``.

    Reader ``0042`` misreads airspace opacity on images 1, 5, 9, ... (it reads them all), and the
    reader ``4326829894`` leaves nodule/mass blank (hedged) on image 1. Opacity brightens the left half, a
    nodule/mass the right half, so a model has something to find. Returns the reads table.
    """
    rng = np.random.default_rng(seed)
    rows, adjudicated = [], []
    (root / "images").mkdir(parents=True, exist_ok=True)
    for i in range(n):
        t = truth(i)
        image = rng.normal(90, 12, (size, size))
        image[:, : size // 2] += 50 * t["airspace_opacity"]
        image[:, size // 2 :] += 50 * t["nodule_mass"]
        rel = f"images/{i:08d}_000.png"
        cv2.imwrite(str(root / rel), np.clip(image, 0, 255).astype(np.uint8))
        for r in range(3):
            reader = READERS[(i + r) % len(READERS)]
            read = dict(t)
            if reader == "0042" and i % 4 == 1:
                read["airspace_opacity"] = 1 - read["airspace_opacity"]
            hedged = ""
            if reader == "4326829894" and i == 1:
                read["nodule_mass"], hedged = "", "nodule_mass"
            rows.append({"image": rel, "patient_id": f"{i // 2:05d}", "reader_id": reader, **read, "hedged": hedged})
        adjudicated.append({"image": rel, "patient_id": f"{i // 2:05d}", "view": ("PA", "AP")[i % 2], **t,
                            "subset": ("released", "holdout")[i % 2]})  # fmt: skip
    reads = pd.DataFrame(rows)
    reads.to_csv(root / "reads.csv", index=False)
    pd.DataFrame(adjudicated).to_csv(root / "adjudicated.csv", index=False)
    return reads


def acquisition_tags(i: int) -> dict:
    return {"Manufacturer": ("Acme", "Zenith")[i % 2], "ManufacturerModelName": "DR-1", "ViewPosition": ("PA", "AP")[i % 2],
            "KVP": 100 + 5 * (i % 4), "Exposure": 2 + i % 3, "PixelSpacing": [0.139, 0.139]}  # fmt: skip


def dicom_copy(source: Path, target: Path) -> None:
    """The reader folder with every image as DICOM (alternately MONOCHROME2 and MONOCHROME1, with acquisition tags):
    the same study ids, the tables pointing at ``.dcm`` files."""
    from training.data.images import decode

    target.mkdir(parents=True, exist_ok=True)
    for name in ("reads.csv", "adjudicated.csv"):
        table = pd.read_csv(source / name, dtype=str, keep_default_na=False)
        table["image"] = table["image"].str.replace(".png", ".dcm", regex=False)
        table.to_csv(target / name, index=False)
    images = sorted(pd.read_csv(source / "reads.csv", dtype=str)["image"].unique())
    for i, rel in enumerate(images):
        pixels = decode(source / rel)
        photometric = ("MONOCHROME2", "MONOCHROME1")[i % 2]
        write_display_dicom(target / rel.replace(".png", ".dcm"), pixels, photometric, acquisition_tags(i))


RATING_PATTERNS = (
    ("Agree all", "Agree all", "Agree all"),
    ("Agree all", "Agree all", "Agree mostly"),
    ("Agree mostly", "agree mostly", "Disagree"),  # case as a hand-made table might have it
    ("Disagree", "Disagree", "Agree all"),
    ("Agree all", "Agree mostly", "Disagree"),  # no majority rating
    ("Agree all", "Disagree", "Disagree"),
)
"""Study ``i``'s three ratings are ``RATING_PATTERNS[i % 6]`` (rater 3 leaves study 7 blank): the majority rating
varies, as on the 1,000 studies REVEAL-CXR's readers rated (the 200 kept all have a majority of "Agree all")."""

RATERS = ("rating_1", "rating_2", "rating_3")


def demographics_of(i: int) -> dict[str, str]:
    """Age (a number), sex and race (blank on every fourth study) of study ``i``; no patient class column."""
    return {"age": str(30 + 3 * i), "sex": ("F", "M", "M")[i % 3], "race": ("White", "Black", "Asian", "")[i % 4]}


def write_release_folder(root: Path, n: int = 12, size: int = 32, ratings: bool = False,
                         demographics: bool = False) -> pd.DataFrame:  # fmt: skip
    """A release-shaped folder: ``labels.csv`` (study id, three of the labels, agreement level, subset; with
    ``ratings`` each reader's rating, with ``demographics`` age, sex and race) and ``images/<study>/`` with a lateral
    and a frontal DICOM file each (the frontal one is the study's image)."""
    rng = np.random.default_rng(1)
    rows = []
    for i in range(n):
        study = f"REVEAL-{i:03d}"
        t = truth(i)
        frontal = np.clip(rng.normal(90, 12, (size, size)) + 50 * t["airspace_opacity"], 0, 255).astype(np.uint8)
        write_display_dicom(root / "images" / study / "1_lateral.dcm", np.zeros((size, size), np.uint8),
                    tags={**acquisition_tags(i), "ViewPosition": "LL"})  # fmt: skip
        write_display_dicom(root / "images" / study / "2_frontal.dcm", frontal, tags=acquisition_tags(i))
        rows.append({"study_id": study, "airspace_opacity": t["airspace_opacity"], "lung_nodule": t["nodule_mass"],
                     "pneumothorax": t["pneumothorax"], "agreement": ("3/3", "2")[i % 3 == 0],
                     "subset": ("released", "holdout")[i % 2]})  # fmt: skip
        if ratings:
            given = list(RATING_PATTERNS[i % len(RATING_PATTERNS)])
            given[2] = "" if i == 7 else given[2]
            rows[-1].update(zip(RATERS, given, strict=True))
        if demographics:
            rows[-1].update(demographics_of(i))
    table = pd.DataFrame(rows)
    table.to_csv(root / "labels.csv", index=False)
    return table
