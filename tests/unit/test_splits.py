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


def test_stratified_split_is_patient_disjoint_balanced_and_order_free():
    from training.data.splits import stratified_patient_split

    rng = np.random.default_rng(0)
    patients = rng.integers(0, 400, 1500).astype(str)
    labels = (rng.random((1500, 4)) < [0.3, 0.05, 0.02, 0.01]).astype(float)
    labels[rng.random(labels.shape) < 0.05] = np.nan  # unlabelled cells count as negatives for balancing
    fractions = {"train": 0.7, "val": 0.1, "test": 0.2}
    splits = stratified_patient_split(patients, labels, fractions, seed=3)
    by_patient = {}
    for patient, split in zip(patients, splits, strict=True):
        assert by_patient.setdefault(patient, split) == split
    # every class with >= 10 positive patients has positives in every split
    positive = np.nan_to_num(labels) == 1
    for c in range(4):
        assert all(positive[splits == s, c].any() for s in fractions), c
    share = {s: len({p for p, x in by_patient.items() if x == s}) / len(by_patient) for s in fractions}
    assert all(abs(share[s] - f) < 0.03 for s, f in fractions.items())
    order = rng.permutation(1500)
    again = stratified_patient_split(patients[order], labels[order], fractions, seed=3)
    assert (again == splits[order]).all()
    assert (stratified_patient_split(patients, labels, fractions, seed=4) != splits).any()
