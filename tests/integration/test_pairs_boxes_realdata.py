"""Pair and box readers on the real releases in ../shared/data: NIH boxes, NIH follow-up pairs, covid follow-ups."""

from __future__ import annotations

import pandas as pd
import pytest
from PIL import Image

from apps.benchmarks.chextemporal.pairs import (
    COARSE,
    PROGRESSION,
    DataContractError,
    covid_pairs,
    nih_followup_pairs,
    patient_split,
    validate_pairs,
)
from apps.benchmarks.framework.boxes import read_nih_boxes
from apps.benchmarks.framework.protocol import Box
from tests.conftest import shared_data
from training.data.findings import NIH14_LABELS

pytestmark = pytest.mark.realdata
NIH_FINDINGS = [name for name in NIH14_LABELS if name != "No Finding"]


def test_nih_boxes_read_as_published_and_fit_the_512_images():
    root = shared_data("nih-bbox")
    boxes = read_nih_boxes(root)
    assert len(boxes) == 984 and boxes["image_id"].nunique() == 880
    counts = boxes["finding"].value_counts().to_dict()
    assert counts == {"Atelectasis": 180, "Effusion": 153, "Cardiomegaly": 146, "Infiltration": 123,
                      "Pneumonia": 120, "Pneumothorax": 98, "Mass": 85, "Nodule": 79}  # fmt: skip
    assert (boxes["frame_width"] == 1024).all() and (boxes["frame_height"] == 1024).all()
    sizes = {}
    for path in boxes["path"].unique():
        with Image.open(root / path) as image:
            sizes[path] = image.size  # (width, height)
    assert len(sizes) == 880 and set(sizes.values()) == {(512, 512)}
    for r in boxes.itertuples():
        box = Box(r.finding, r.x, r.y, r.w, r.h, int(r.frame_width), int(r.frame_height))
        moved = box.in_frame(*sizes[r.path])
        assert moved.x == r.x / 2 and moved.h == r.h / 2
        assert moved.x >= 0 and moved.y >= 0
        assert moved.x + moved.w <= moved.frame_width and moved.y + moved.h <= moved.frame_height


def test_nih1000_follow_up_pairs_stay_within_a_patient_and_in_time_order():
    root = shared_data("nih1000")
    entries = pd.read_csv(root / "Data_Entry_2017_v2020.csv", dtype=str, keep_default_na=False)
    pairs = validate_pairs(nih_followup_pairs(entries, NIH_FINDINGS), root, NIH_FINDINGS, COARSE)  # files on disk
    assert len(pairs) == 1067
    assert pairs["progression"].value_counts().to_dict() == {"new": 397, "resolved": 384, "persisting": 286}
    assert len(pairs[["prior_path", "path"]].drop_duplicates()) == 511  # of 736 consecutive film pairs
    assert pairs["patient_id"].nunique() == 86
    patient_of = dict(zip("images/" + entries["Image Index"], entries["Patient ID"], strict=True))
    assert (pairs["prior_path"].map(patient_of) == pairs["patient_id"]).all()
    assert (pairs["path"].map(patient_of) == pairs["patient_id"]).all()
    assert (pairs["prior_follow_up"] < pairs["follow_up"]).all()
    age = dict(zip("images/" + entries["Image Index"], entries["Patient Age"].astype(int), strict=True))
    assert (pairs["prior_path"].map(age) <= pairs["path"].map(age)).all()
    split = patient_split(pairs, {"train": 0.7, "val": 0.1, "test": 0.2}, seed=0)
    assert (split.groupby("patient_id")["split"].nunique() == 1).all()


def test_nih1000_labels_table_carries_the_2017_follow_up_numbers_and_is_refused():
    """``labels.csv``'s ``follow_up`` is the file-name suffix (2017 numbering), not v2020's chronological one."""
    root = shared_data("nih1000")
    labels = pd.read_csv(root / "labels.csv", dtype=str, keep_default_na=False)
    with pytest.raises(DataContractError, match=r"labels line \d+, column follow_up: .*not in time order"):
        nih_followup_pairs(labels, NIH_FINDINGS)
    entries = pd.read_csv(root / "Data_Entry_2017_v2020.csv", dtype=str, keep_default_na=False)
    follow_up = dict(zip("images/" + entries["Image Index"], entries["Follow-up #"], strict=True))
    fixed = nih_followup_pairs(labels.assign(follow_up=labels["image"].map(follow_up)), NIH_FINDINGS)
    assert set(fixed["pair_id"]) == set(nih_followup_pairs(entries, NIH_FINDINGS)["pair_id"])


def test_covid_temporal_pairs():
    root = shared_data("covid-temporal")
    pairs = covid_pairs(root)
    assert len(pairs) == 123 and (pairs["progression"] != "").sum() == 5
    assert pairs["progression"].value_counts().to_dict() == {"": 118, "stable": 3, "improved": 1, "worse": 1}
    assert set(pairs["progression"]) <= {"", *PROGRESSION}
    # 60 patients (183 films - 60 = 123 consecutive pairs; the data README says 61)
    assert pairs["patient_id"].nunique() == 60 and pairs["pair_id"].is_unique
    extent = covid_pairs(root, score="geographic_extent")
    assert extent["progression"].value_counts().to_dict() == {"": 118, "worse": 4, "stable": 1}
