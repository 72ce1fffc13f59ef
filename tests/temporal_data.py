"""Small stand-ins for the grounding and progression tests: NIH-shaped folders, one with boxes and one with
follow-up series (``Data_Entry_2017_v2020.csv`` as released)."""

from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np
import pandas as pd


def write_bbox_folder(root: Path, n: int = 12, stored: int = 64, original: int = 1024) -> pd.DataFrame:
    """``n`` images stored at ``stored`` px whose boxes are given in the release's ``original``-px frame (1024
    frame on the 512-px copies): a bright square marks each box. Images alternate Effusion boxes centred in the
    image and Nodule boxes in the top-left corner (image 0 has both). Returns the box table as written."""
    rng = np.random.default_rng(0)
    (root / "images").mkdir(parents=True, exist_ok=True)
    boxes, entries = [], []
    for i in range(n):
        name = f"{i + 1:08d}_000.png"
        image = rng.normal(80, 8, (stored, stored))
        mine = []
        if i % 2 == 0:
            mine.append(("Effusion", original * 3 / 8, original * 3 / 8, original / 4, original / 4))
        if i % 2 == 1 or i == 0:
            mine.append(("Nodule", original / 16, original / 16, original / 8, original / 8))
        for finding, x, y, w, h in mine:
            s = stored / original
            image[int(y * s) : int((y + h) * s), int(x * s) : int((x + w) * s)] += 100
            boxes.append({"Image Index": name, "Finding Label": finding, "Bbox [x": x, "y": y, "w": w, "h]": h})
        cv2.imwrite(str(root / "images" / name), np.clip(image, 0, 255).astype(np.uint8))
        labels = "|".join(sorted({m[0] for m in mine}))
        entries.append({"Image Index": name, "Finding Labels": labels, "Follow-up #": 0, "Patient ID": i + 1,
                        "Patient Age": 50, "Patient Sex": "F", "View Position": "PA", "OriginalImage[Width": original,
                        "Height]": original, "OriginalImagePixelSpacing[x": 0.143, "y]": 0.143})  # fmt: skip
    table = pd.DataFrame(boxes)
    header = "Image Index,Finding Label,Bbox [x,y,w,h],,,\n"  # the release's header: x's name holds the whole list
    rows = "".join(f"{r['Image Index']},{r['Finding Label']},{r['Bbox [x']},{r['y']},{r['w']},{r['h]']}\n"
                   for r in boxes)  # fmt: skip
    (root / "BBox_List_2017.csv").write_text(header + rows)
    pd.DataFrame(entries).to_csv(root / "Data_Entry_2017_v2020.csv", index=False)
    return table


def write_followup_folder(root: Path, patients: int = 30, size: int = 32) -> pd.DataFrame:
    """``Data_Entry_2017_v2020.csv`` and images for ``patients`` patients with three films each: Effusion appears on
    the second film of every third patient (new), is present throughout for the next third (persisting) and goes
    away on the second film for the rest (resolved); the effusion brightens the lower half of a film. The rows are
    shuffled: the order must come from ``Follow-up #``."""
    rng = np.random.default_rng(1)
    (root / "images").mkdir(parents=True, exist_ok=True)
    rows = []
    for p in range(patients):
        pattern = [(0, 1, 1), (1, 1, 1), (1, 0, 0)][p % 3]
        for follow_up, effusion in enumerate(pattern):
            name = f"{p + 1:08d}_{follow_up:03d}.png"
            image = rng.normal(90, 10, (size, size))
            image[size // 2 :] += 70 * effusion
            cv2.imwrite(str(root / "images" / name), np.clip(image, 0, 255).astype(np.uint8))
            rows.append({"Image Index": name, "Finding Labels": "Effusion" if effusion else "No Finding",
                         "Follow-up #": follow_up, "Patient ID": p + 1, "Patient Age": 40 + follow_up,
                         "Patient Sex": "M", "View Position": "PA", "OriginalImage[Width": 1024, "Height]": 1024})  # fmt: skip
    table = pd.DataFrame(rows).sample(frac=1.0, random_state=0)
    table.to_csv(root / "Data_Entry_2017_v2020.csv", index=False)
    return table


RELEASE_CLASSES = ("new", "worse", "stable", "improved", "resolved")


def write_release_pairs(root: Path, patients: int = 40, size: int = 32) -> pd.DataFrame:
    """A CheXTemporal-shaped release: ``chextemporal_pairs.csv`` (one prior/current pair per patient, Pleural
    Effusion, the five classes in turn, sources A and B alternating) and ``chextemporal_boxes.csv`` (a centred box
    in the 1024 frame on each film where the finding is present: the current film only for new, the prior only
    for resolved, both otherwise with one correspondence id). Returns the pair table."""
    rng = np.random.default_rng(2)
    (root / "images").mkdir(parents=True, exist_ok=True)
    pairs, boxes = [], []
    for p in range(patients):
        label = RELEASE_CLASSES[p % 5]
        films = {}
        for role in ("prior", "current"):
            rel = f"images/p{p:03d}_{role}.png"
            cv2.imwrite(str(root / rel), np.clip(rng.normal(90, 10, (size, size)), 0, 255).astype(np.uint8))
            films[role] = rel
        pair_id = f"pair{p:03d}"
        pairs.append({"pair_id": pair_id, "patient_id": f"P{p:03d}", "prior_path": films["prior"],
                      "path": films["current"], "finding": "Pleural Effusion", "progression": label,
                      "days_between": 3 + p % 4, "source": ("A", "B")[p % 2]})  # fmt: skip
        roles = {"new": ("current",), "resolved": ("prior",)}.get(label, ("prior", "current"))
        for role in roles:
            boxes.append({"pair_id": pair_id, "image": role, "finding": "Pleural Effusion", "x": 384, "y": 384,
                          "w": 256, "h": 256, "frame_width": 1024, "frame_height": 1024,
                          "correspondence_id": f"r{p}" if len(roles) == 2 else ""})  # fmt: skip
    table = pd.DataFrame(pairs)
    table.to_csv(root / "chextemporal_pairs.csv", index=False)
    pd.DataFrame(boxes).to_csv(root / "chextemporal_boxes.csv", index=False)
    return table
