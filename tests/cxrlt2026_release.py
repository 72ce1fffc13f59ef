"""A CXR-LT 2026 release in miniature, shaped exactly as the organisers ship theirs (docs/data.md, "The CXR-LT 2026
release"), for tests. No row of theirs is copied: ids, patients and labels are drawn here; only the format is theirs.

``write_release(root)`` writes, names as released:

- ``CXRLT_2026_training.csv``: ``ImageID,StudyDate_DICOM,PatientID`` then the 30 class columns in the organisers'
  order and spelling (:data:`evaluation.organiser_names.TASK1_COLUMNS`), LF, rows sorted by ImageID as text;
  ``PatientID`` written as a spreadsheet leaves it (``%.2E`` of the true id: several patients share one value);
- ``Removal.csv``: the evaluation images plus another image of each of their studies, and ``leaked`` images that
  (unlike the real release) are also in the training table, so the test can see them dropped;
- ``CXRLT_2026_TEST_ALL_TASK1.csv``: the id columns then 30 empty headers, every row 30 trailing empty fields;
  ``CXRLT_2026_TEST_ALL_TASK2.csv``: the id columns only, no newline at the end; ``Eval_Class_Task2.txt`` (each
  class followed by a tab but the last) and ``Train_CLASS.txt``;
- ``dev_labels_task1.csv`` / ``dev_labels_task2.csv``: labels of the evaluation images in the release's layout
  (what ``data.source.eval_labels`` and ``make score`` read); the organisers' own are not public, so the names are
  this fixture's;
- the images, 16-bit grayscale PNG named by ImageID, in PadChest's numbered folders (``layout="subdirs"``) or flat;
- beside the release (``<root>-padchest/``), a PadChest-style label table with the true ``PatientID`` of every
  image (``data.padchest_table``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import cv2
import numpy as np
import pandas as pd

from evaluation.organiser_names import TASK1_COLUMNS, TASK2_COLUMNS
from training.data.adapters.cxrlt2026_files import ID_COLUMNS, REMOVAL, TASK2_CLASSES, TEST_LISTS, TRAINING_TABLE

TRAINING_HEADER = ",".join([*ID_COLUMNS, *TASK1_COLUMNS.values()])
DEV_LABELS = {"task1": "dev_labels_task1.csv", "task2": "dev_labels_task2.csv"}
PADCHEST_TABLE = "PADCHEST_chest_x_ray_images_labels_160K_01.02.19.csv"


@dataclass
class Release:
    """What :func:`write_release` wrote."""

    root: Path
    training: pd.DataFrame  # the training table as written (text)
    true_patients: dict[str, str]  # ImageID -> true PatientID, every image
    evaluation: dict[str, list[str]]  # task -> its test list's ImageIDs, in order
    leaked: list[str]  # Removal images also in the training table
    padchest_table: Path

    def overrides(self, labelled: bool = True, padchest: bool = True) -> list[str]:
        """Hydra overrides pointing a run at this release, with the evaluation labels and PadChest's table."""
        out = ["data=cxrlt2026", f"data.root={self.root}"]
        if labelled:
            out.append(f"data.source.eval_labels=[{','.join(DEV_LABELS.values())}]")
        if padchest:
            out.append(f"data.padchest_table={self.padchest_table}")
        return out


def _image_id(rng: np.random.Generator) -> str:
    """A PadChest-shaped ImageID: a 38-digit number, ``_``, six letters, ``.png``."""
    digits = "".join(rng.choice(list("0123456789"), 38))
    return f"{int(digits[0]) or 1}{digits[1:]}_{''.join(rng.choice(list('abcdefghijklmnopqrstuvwxyz'), 6))}.png"


def _labels(rng: np.random.Generator, n: int, columns, prevalence: float = 0.25) -> dict[str, np.ndarray]:
    """0/1 columns; every class has a positive and a negative when ``n >= 2``."""
    out = {}
    for k, column in enumerate(columns):
        values = (rng.random(n) < prevalence).astype(int)
        if n >= 2:
            values[k % n], values[(k + 1) % n] = 1, 0
        out[column] = values
    return out


def _write_image(path: Path, rng: np.random.Generator, size: int, bits: int = 16) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    pixels = np.clip(rng.uniform(0.2, 0.8) + 0.15 * rng.standard_normal((size, size)), 0, 1)
    cv2.imwrite(str(path), (pixels * (2**bits - 1)).astype(np.uint16 if bits == 16 else np.uint8))


def write_release(root: Path, *, n_train: int = 96, n_task1: int = 24, n_task2: int = 12, n_patients: int = 40,
                  leaked: int = 2, layout: str = "subdirs", size: int = 40, seed: int = 0) -> Release:  # fmt: skip
    """Write the release under ``root`` (see the module docstring) and return what was written."""
    if layout not in ("subdirs", "flat"):
        raise ValueError(f"layout must be 'subdirs' or 'flat', got {layout!r}")
    rng = np.random.default_rng(seed)
    root.mkdir(parents=True, exist_ok=True)
    n_eval = n_task1 + n_task2
    ids = sorted({_image_id(rng) for _ in range(n_train + 2 * n_eval + 8)})[: n_train + 2 * n_eval]
    ids = list(rng.permutation(ids))
    train_ids, eval_ids, study_mates = ids[:n_train], ids[n_train : n_train + n_eval], ids[n_train + n_eval :]
    # True patient ids: 38-digit numbers whose first three digits take 8 values, so several round to one %.2E value.
    patients = [
        str(320 + int(rng.integers(8))) + "".join(rng.choice(list("0123456789"), 35)) for _ in range(n_patients)
    ]
    true = {image_id: patients[int(rng.integers(n_patients))] for image_id in ids}
    lossy = {image_id: f"{float(patient):.2E}" for image_id, patient in true.items()}
    dates = {image_id: f"20{int(rng.integers(10, 17))}{int(rng.integers(1, 13)):02d}15" for image_id in ids}

    def id_frame(chosen) -> pd.DataFrame:
        return pd.DataFrame({"ImageID": chosen, "StudyDate_DICOM": [dates[i] for i in chosen],
                             "PatientID": [lossy[i] for i in chosen]})  # fmt: skip

    in_table = sorted(train_ids + eval_ids[:leaked])  # the leaked images break the organisers' own rule on purpose
    training = pd.concat([id_frame(in_table), pd.DataFrame(_labels(rng, len(in_table), TASK1_COLUMNS.values()))],
                         axis=1).astype(str)  # fmt: skip
    training.to_csv(root / TRAINING_TABLE, index=False, lineterminator="\n")
    id_frame(sorted(eval_ids + study_mates)).to_csv(root / REMOVAL, index=False, lineterminator="\n")

    task1, task2 = eval_ids[:n_task1], eval_ids[n_task1:]
    with open(root / TEST_LISTS["task1"], "w", newline="") as handle:
        handle.write(",".join(ID_COLUMNS) + "," * len(TASK1_COLUMNS) + "\n")
        for image_id in task1:
            handle.write(f"{image_id},{dates[image_id]},{lossy[image_id]}" + "," * len(TASK1_COLUMNS) + "\n")
    lines = [",".join(ID_COLUMNS)] + [f"{i},{dates[i]},{lossy[i]}" for i in task2]
    (root / TEST_LISTS["task2"]).write_text("\n".join(lines))  # no newline at the end, as released
    (root / TASK2_CLASSES).write_text("\t\n".join(TASK2_COLUMNS.values()))
    (root / "Train_CLASS.txt").write_text("\n".join(TASK1_COLUMNS.values()) + "\n")
    for task, chosen, columns in (("task1", task1, TASK1_COLUMNS), ("task2", task2, TASK2_COLUMNS)):
        labels = pd.DataFrame(_labels(rng, len(chosen), columns.values(), 0.3))
        pd.concat([id_frame(chosen), labels], axis=1).to_csv(root / DEV_LABELS[task], index=False)

    for k, image_id in enumerate(ids):
        folder = root / str(k % 3) if layout == "subdirs" else root
        _write_image(folder / image_id, rng, size)

    padchest = root.parent / f"{root.name}-padchest" / PADCHEST_TABLE
    padchest.parent.mkdir(parents=True, exist_ok=True)
    pd.DataFrame({"ImageID": ids, "ImageDir": 0, "PatientID": [true[i] for i in ids]}).to_csv(padchest, index=False)
    return Release(root, training, true, {"task1": task1, "task2": task2}, eval_ids[:leaked], padchest)


#: The NIH findings of the external test's stand-in images, one per image in turn (``Data_Entry`` spelling).
NIH_FINDINGS = ("Effusion", "No Finding", "Cardiomegaly|Effusion", "Infiltration", "Nodule")


def write_nih_external(root: Path, rng: np.random.Generator, n: int, size: int) -> dict:
    """An NIH folder (``nih/images``, ``nih/Data_Entry_2017_v2020.csv``) and the organisers' list beside the release.

    NIH's table holds two more images than the list (not in the external test); the list gives the six unseen
    classes and no seen class, so the seen ones come from NIH's labels (the stand-in's mapping).
    """
    nih = root / "nih"
    (nih / "images").mkdir(parents=True, exist_ok=True)
    names = [f"{i + 1:08d}_000.png" for i in range(n + 2)]
    for name in names:
        _write_image(nih / "images" / name, rng, size, 8)
    pd.DataFrame({
        "Image Index": names, "Finding Labels": [NIH_FINDINGS[i % len(NIH_FINDINGS)] for i in range(len(names))],
        "Follow-up #": 0, "Patient ID": [str(1000 + i // 2) for i in range(len(names))], "Patient Age": 50,
        "Patient Gender": "F", "View Position": "PA",
    }).to_csv(nih / "Data_Entry_2017_v2020.csv", index=False)  # fmt: skip
    listed = pd.DataFrame({"ImageID": [n_[:-4] for n_ in names[:n]], **_labels(rng, n, TASK2_COLUMNS.values(), 0.3)})
    listed.to_csv(root / "nih_external_test.csv", index=False)
    return {"root": str(nih), "list": str(root / "nih_external_test.csv"), "labels": "Data_Entry_2017_v2020.csv"}
