"""Small stand-ins for the benchmark tests: a Kermany-shaped image folder and a tiny random open_clip model."""

from __future__ import annotations

import json
from pathlib import Path

import cv2
import numpy as np

TINY_CLIP = {
    "model_cfg": {
        "embed_dim": 16,
        "vision_cfg": {"image_size": 32, "layers": 1, "width": 32, "head_width": 16, "patch_size": 8},
        "text_cfg": {"context_length": 16, "vocab_size": 49408, "width": 16, "heads": 2, "layers": 1},
    },
    "preprocess_cfg": {"mean": [0.5, 0.5, 0.5], "std": [0.25, 0.25, 0.25]},
}


def write_tiny_clip(folder: Path) -> str:
    """A weightless open_clip config (random init, about 1 M parameters); returns its ``clip:local-dir:`` spec."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "open_clip_config.json").write_text(json.dumps(TINY_CLIP))
    return f"clip:local-dir:{folder}"


def write_kermany(root: Path, train: tuple[int, int] = (140, 380), test: tuple[int, int] = (45, 75),
                  shared: int = 2, size: int = 24, seed: int = 0) -> dict:  # fmt: skip
    """Write tiny JPEGs in the release layout ``{train,test}/{NORMAL,PNEUMONIA}/``, in the release's name shapes.

    Pneumonia images are brighter on average, so a probe has something to learn. The first ``shared`` test
    patients of each label also get one image in the train folder (what the leakage rule must remove).

    Args:
        root: the folder to create.
        train: (normal, pneumonia) images in the train folder, not counting the shared-patient ones.
        test: (normal, pneumonia) images in the test folder.
        shared: test patients per label that also have a train image.
        size: image side in pixels.
        seed: pixel noise seed.

    Returns:
        ``{"shared_patients": [...], "shared_files": [...]}`` (the train files of the shared patients).
    """
    rng = np.random.default_rng(seed)

    def write(rel: str, positive: bool) -> None:
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        base = 150 if positive else 90
        cv2.imwrite(str(path), np.clip(rng.normal(base, 30, (size, size)), 0, 255).astype(np.uint8))

    def names(label: str, count: int, start: int) -> list[tuple[str, str]]:
        """(file name, patient number) pairs in the release's shapes."""
        out = []
        for i in range(start, start + count):
            if label == "PNEUMONIA":
                kind = ("bacteria", "virus")[i % 2]
                name = f"person{i}_{kind}_{i * 3}.jpeg" if i % 7 else f"person{i}_{kind}_{i}_{i + 1}.jpeg"
                out.append((name, f"person{i}"))
            elif i % 2:
                out.append((f"IM-{i:04d}-0001.jpeg", f"IM-{i:04d}"))
            else:
                out.append((f"NORMAL2-IM-{i:04d}-0001-0002.jpeg", f"NORMAL2-IM-{i:04d}"))
        return out

    shared_patients, shared_files = [], []
    for label, (n_train, n_test) in zip(("NORMAL", "PNEUMONIA"), zip(train, test, strict=True), strict=True):
        test_names = names(label, n_test, start=1)
        for name, _ in test_names:
            write(f"test/{label}/{name}", label == "PNEUMONIA")
        for name, _ in names(label, n_train, start=10_000):
            write(f"train/{label}/{name}", label == "PNEUMONIA")
        for name, patient in test_names[:shared]:  # the same patient, another film, filed in the train folder
            other = f"{patient}_bacteria_99999.jpeg" if label == "PNEUMONIA" else f"{name[:-5]}-0009.jpeg"
            write(f"train/{label}/{other}", label == "PNEUMONIA")
            shared_files.append(f"train/{label}/{other}")
            shared_patients.append(patient)
    return {"shared_patients": shared_patients, "shared_files": shared_files}
