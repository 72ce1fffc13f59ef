"""A CXR-LT 2026 release in miniature, shaped exactly as ``configs/data/cxrlt2026.yaml`` describes it, for tests.

``write_release(root)`` writes what participants receive: ``images/<ImageID>.png`` as 16-bit grayscale PNG, and the
label table(s) with the challenge image id, the split information and the classes in the organisers' spelling
(:data:`training.data.label_names.ORGANISER_SPELLING`); **no patient column**. File names, the id column, the split
column and the split spellings are read from the YAML, so a change there is a change here.

- ``layout="column"``: the YAML's one table with its split column; ``layout="files"``: one table per split, keyed
  by the release's split names (the YAML's commented alternative), and the training table has no Task 2 columns.
- Task 1 labels on every row (the real test labels are the organisers'; here they are given so a run can be
  scored); Task 2's six unseen classes on the development and test rows only (empty on training rows).
- ``nih="table"``: the NIH external test is rows of the release's ``external_test`` split (``images/``, 8-bit like
  NIH); ``nih="folder"``: an NIH ChestX-ray folder under ``root/nih`` (``images/`` and ``Data_Entry_2017_v2020.csv``)
  plus the organisers' list ``root/nih_external_test.csv`` (``ImageID`` and the six unseen columns), for
  ``data.source.external`` (:attr:`Release.external`); ``nih=None``: no external test.

Images are noise around a per-image level, tiny (``size`` px): the point is the release's shape, not learning.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import cv2
import numpy as np
import pandas as pd
import yaml

from training.data.findings import TASK1_LABELS, TASK2_LABELS
from training.data.label_names import ORGANISER_SPELLING

CONFIG = Path(__file__).resolve().parents[1] / "configs" / "data" / "cxrlt2026.yaml"
#: The release's split spellings this fixture writes, as the YAML maps them.
TRAIN, DEVELOPMENT, TEST, EXTERNAL = "train", "development", "test", "external_test"
#: The NIH findings the stand-in maps, one per external image in turn (``Data_Entry`` spelling).
NIH_FINDINGS = ("Effusion", "No Finding", "Cardiomegaly|Effusion", "Infiltration", "Nodule")


def release_config() -> dict:
    """The ``source`` block of configs/data/cxrlt2026.yaml, as written (interpolations unresolved)."""
    return yaml.safe_load(CONFIG.read_text())["source"]


@dataclass
class Release:
    """What :func:`write_release` wrote: counts per release split, and ``external`` for ``data.source.external``."""

    root: Path
    counts: dict[str, int]
    external: dict | None = None
    overrides: list[str] = field(default_factory=list)

    def hydra_overrides(self) -> list[str]:
        """``data=cxrlt2026 ...`` overrides that point a run at this release."""
        return ["data=cxrlt2026", f"data.root={self.root}", *self.overrides]


def _labels(rng: np.random.Generator, n: int, names, prevalence: float = 0.25) -> dict[str, np.ndarray]:
    """0/1 columns in the organisers' spelling; every class has a positive and a negative when ``n >= 2``."""
    out = {}
    for k, name in enumerate(names):
        values = (rng.random(n) < prevalence).astype(int)
        if n >= 2:
            values[k % n], values[(k + 1) % n] = 1, 0
        out[ORGANISER_SPELLING[name]] = values
    return out


def _image(path: Path, rng: np.random.Generator, size: int, bits: int) -> None:
    level = rng.uniform(0.2, 0.8)
    pixels = np.clip(level + 0.15 * rng.standard_normal((size, size)), 0, 1)
    top = 65535 if bits == 16 else 255
    cv2.imwrite(str(path), (pixels * top).astype(np.uint16 if bits == 16 else np.uint8))


def write_release(root: Path, *, layout: str = "column", nih: str | None = "table", n_train: int = 96,
                  n_dev: int = 32, n_test: int = 24, n_external: int = 16, size: int = 40, seed: int = 0) -> Release:  # fmt: skip
    """Write the release under ``root`` (see the module docstring) and return what was written."""
    config = release_config()
    rng = np.random.default_rng(seed)
    images = root / config["image_dir"]
    images.mkdir(parents=True, exist_ok=True)
    id_column, split_column = config["id_column"], config["split_column"]
    counts = {TRAIN: n_train, DEVELOPMENT: n_dev, TEST: n_test}
    if nih == "table":
        counts[EXTERNAL] = n_external
    tables = {}
    for split, n in counts.items():
        prefix = "nih" if split == EXTERNAL else "pc"
        ids = [f"{prefix}{split[:3]}{i:05d}" for i in range(n)]  # challenge ids: text, not PadChest's
        for image_id in ids:
            _image(images / f"{image_id}{config['image_suffix']}", rng, size, 8 if split == EXTERNAL else 16)
        columns = {id_column: ids, **_labels(rng, n, TASK1_LABELS)}
        if split != TRAIN:
            columns.update(_labels(rng, n, TASK2_LABELS, prevalence=0.3))
        tables[split] = pd.DataFrame(columns)
    if layout == "column":
        for split, table in tables.items():
            table.insert(1, split_column, split)
        pd.concat(tables.values(), ignore_index=True).to_csv(root / config["table"], index=False)  # NaN -> empty
        overrides = []
    elif layout == "files":
        files = {split: f"{split}_labels.csv" for split in tables}
        for split, table in tables.items():
            table.to_csv(root / files[split], index=False)
        overrides = [f"data.source.table={{{','.join(f'{k}:{v}' for k, v in files.items())}}}",
                     "data.source.split_column=null"]  # fmt: skip
    else:
        raise ValueError(f"layout must be 'column' or 'files', got {layout!r}")
    release = Release(root, counts, overrides=overrides)
    if nih == "folder":
        release.external = write_nih_external(root, rng, n_external, size)
        counts[EXTERNAL] = n_external
        release.overrides.append(
            "data.source.external={" + ",".join(f"{k}:{v}" for k, v in release.external.items()) + "}"
        )
    return release


def write_nih_external(root: Path, rng: np.random.Generator, n: int, size: int) -> dict:
    """An NIH folder (``nih/images``, ``nih/Data_Entry_2017_v2020.csv``) and the organisers' list beside the release.

    NIH's table holds two more images than the list (not in the external test); the list gives the six unseen
    classes and no seen class, so the seen ones come from NIH's labels (the stand-in's mapping).
    """
    nih = root / "nih"
    (nih / "images").mkdir(parents=True, exist_ok=True)
    names = [f"{i + 1:08d}_000.png" for i in range(n + 2)]
    for name in names:
        _image(nih / "images" / name, rng, size, 8)
    pd.DataFrame({
        "Image Index": names, "Finding Labels": [NIH_FINDINGS[i % len(NIH_FINDINGS)] for i in range(len(names))],
        "Follow-up #": 0, "Patient ID": [str(1000 + i // 2) for i in range(len(names))], "Patient Age": 50,
        "Patient Gender": "F", "View Position": "PA",
    }).to_csv(nih / "Data_Entry_2017_v2020.csv", index=False)  # fmt: skip
    listed = pd.DataFrame({"ImageID": [n_[:-4] for n_ in names[:n]], **_labels(rng, n, TASK2_LABELS, 0.3)})
    listed.to_csv(root / "nih_external_test.csv", index=False)
    return {"root": str(nih), "list": str(root / "nih_external_test.csv"), "labels": "Data_Entry_2017_v2020.csv"}
