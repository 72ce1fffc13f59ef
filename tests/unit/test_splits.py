"""Patient-disjoint splits."""

import numpy as np

from training.data.splits import patient_split


def test_patients_never_straddle_splits_and_fractions_hold():
    patients = [f"p{i // 3}" for i in range(3000)]  # 1,000 patients with 3 images each
    splits = patient_split(patients, seed=1)
    by_patient = {}
    for patient, split in zip(patients, splits, strict=True):
        by_patient.setdefault(patient, set()).add(split)
    assert all(len(s) == 1 for s in by_patient.values())
    share = {name: np.mean(splits == name) for name in ("train", "val", "test")}
    assert abs(share["train"] - 0.7) < 0.05 and abs(share["val"] - 0.1) < 0.03 and abs(share["test"] - 0.2) < 0.04


def test_assignment_is_stable_when_patients_are_added_or_reordered():
    first = dict(zip([f"p{i}" for i in range(200)], patient_split([f"p{i}" for i in range(200)], seed=5), strict=True))
    more = [f"p{i}" for i in range(400)][::-1]
    second = dict(zip(more, patient_split(more, seed=5), strict=True))
    assert all(second[p] == s for p, s in first.items())
    assert (patient_split(list(first), seed=6) != np.array(list(first.values()))).any()
