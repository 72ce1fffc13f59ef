"""A tiny ROCOv2-shaped release for the ImageCLEF benchmark tests: images per split, concept tables (all and
manually validated, as the release's gzipped CSVs) and caption tables."""

from __future__ import annotations

import gzip
from pathlib import Path

import cv2
import numpy as np

MODALITY = {"ct": "C0040405", "xray": "C1306645"}
CHEST, ABDOMEN, NODULE = "C0817096", "C0000726", "C0034079"


def concepts_of(i: int) -> list[str]:
    """Image ``i``: CT or X-ray alternating, chest or abdomen every third image, a nodule every fifth."""
    concepts = [MODALITY["ct"] if i % 2 else MODALITY["xray"], ABDOMEN if i % 3 == 0 else CHEST]
    return concepts + ([NODULE] if i % 5 == 0 else [])


def caption_of(i: int) -> str:
    kind = "CT" if i % 2 else "Chest X-ray"
    return f"{kind} showing a {2 + i % 4}.5 cm lesion." if i % 5 == 0 else f"{kind} without abnormality."


def write_gz(path: Path, header: str, rows: list[str]) -> None:
    with gzip.open(path, "wt") as handle:
        handle.write("\n".join([header, *rows]) + "\n")


def write_rocov2(root: Path, sizes: dict[str, int] | None = None, size: int = 24) -> None:
    """``{split}/<ID>.jpg`` and ``{split}_concepts.csv.gz``, ``{split}_concepts_manual.csv.gz`` (modality and body
    region only), ``{split}_captions.csv.gz``. CT images are brighter, so a model has something to learn."""
    rng = np.random.default_rng(0)
    for split, n in (sizes or {"train": 40, "valid": 12, "test": 12}).items():
        (root / split).mkdir(parents=True, exist_ok=True)
        concepts, manual, captions = [], [], []
        for i in range(n):
            image_id = f"ROCOv2_2023_{split}_{i + 1:06d}"
            image = rng.normal(150 if i % 2 else 80, 10, (size, size))
            cv2.imwrite(str(root / split / f"{image_id}.jpg"), np.clip(image, 0, 255).astype(np.uint8))
            found = concepts_of(i)
            concepts.append(f"{image_id},{';'.join(found)}")
            manual.append(f"{image_id},{';'.join(c for c in found if c != NODULE)}")
            captions.append(f'{image_id},"{caption_of(i)}"')
        write_gz(root / f"{split}_concepts.csv.gz", "ID,CUIs", concepts)
        write_gz(root / f"{split}_concepts_manual.csv.gz", "ID,CUIs", manual)
        write_gz(root / f"{split}_captions.csv.gz", "ID,Caption", captions)
