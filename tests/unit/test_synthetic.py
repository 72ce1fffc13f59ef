"""The built-in SYNTHETIC chest X-ray generator: label profile, determinism, caching and drawing rules."""

from __future__ import annotations

import csv
import json

import cv2
import numpy as np
import pytest

from training.data.synthetic import FINDINGS, TASK1_LABELS, TASK2_LABELS, generate
from training.data.synthetic.findings import RULES
from training.data.synthetic.labels import (
    INDEX,
    NORMAL,
    SPLITS,
    LabelConfig,
    count_table,
    frequency_group,
    sample_labels,
)
from training.data.synthetic.render import ImageSpec, render_image

TINY = {"n_train": 150, "n_val": 60, "n_test": 60, "image_size": 48}


# --- vocabulary -------------------------------------------------------------------------------------------------
def test_label_vocabulary_matches_the_platform():
    assert len(TASK1_LABELS) == 30 and len(TASK2_LABELS) == 6 and FINDINGS == TASK1_LABELS + TASK2_LABELS
    assert TASK1_LABELS[0] == "Alveolar Pattern" and TASK1_LABELS[-1] == "Vertebral Degenerative Changes"
    platform = pytest.importorskip("training.data.findings")
    assert platform.TASK1_LABELS == TASK1_LABELS and platform.TASK2_LABELS == TASK2_LABELS


def test_every_finding_has_a_drawing_rule():
    assert set(RULES) == set(FINDINGS)
    assert all(RULES[f].alter or RULES[f].draw for f in FINDINGS if f != NORMAL)


@pytest.mark.parametrize(
    ("name", "p", "group"),
    [("Normal", 0.4, "normal"), ("Mass", 0.2, "common"), ("Mass", 0.10, "medium"), ("Mass", 0.0101, "medium"),
     ("Mass", 0.01, "rare"), ("Mass", 0.001, "rare"), ("Mass", 0.00099, "very_rare"), ("Mass", 0.0, "very_rare")],
)  # fmt: skip
def test_frequency_group_boundaries(name, p, group):
    assert frequency_group(name, p) == group


# --- label sampler (no drawing) -----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def big_sample():
    return sample_labels(LabelConfig(n_train=20000, n_val=3000, n_test=3000), seed=0)


def test_sampler_reaches_all_frequency_groups_on_train(big_sample):
    table = {row["finding"]: row for row in count_table(big_sample)}
    groups = [row["group"] for row in table.values()]
    assert {"normal", "common", "medium", "rare", "very_rare"} <= set(groups)
    assert groups.count("common") >= 4 and groups.count("medium") >= 10
    assert groups.count("rare") >= 4 and groups.count("very_rare") >= 3
    # 0.25-0.35: Normal excludes unseen-only images and 20% of the finding-free train images are unlabelled
    assert 0.25 <= table[NORMAL]["train_prevalence"] <= 0.35
    for name in TASK2_LABELS:
        assert table[name]["group"] in {"medium", "rare"}


def test_sampler_normal_is_its_own_label_and_some_train_rows_are_all_zero(big_sample):
    """docs/rules.md §12: Normal = no finding of the 36, never beside one; 20% of the train normals unlabelled."""
    findings = [INDEX[n] for n in FINDINGS if n != NORMAL]
    s, normal = big_sample, INDEX[NORMAL]
    no_finding = s.clean[:, findings].sum(axis=1) == 0
    assert np.array_equal(s.clean[:, normal] == 1, no_finding)  # the truth: Normal exactly when nothing is there
    unseen_only = (s.clean[:, [INDEX[n] for n in TASK1_LABELS if n != NORMAL]].sum(axis=1) == 0) & ~no_finding
    assert unseen_only.sum() > 100 and (s.clean[unseen_only, normal] == 0).all()  # e.g. a scoliosis alone
    assert not ((s.labels[:, normal] == 1) & (s.labels[:, findings].sum(axis=1) > 0)).any()  # never co-occurs
    all_zero = s.labels.sum(axis=1) == 0
    train = s.split == "train"
    assert not all_zero[~train].any()  # validation and test are clean: every image is Normal or has a finding
    train_no_finding = train & (s.labels[:, findings].sum(axis=1) == 0)
    assert all_zero[train].sum() == s.noise["unlabelled"]
    assert 0.18 < all_zero[train].sum() / train_no_finding.sum() < 0.22  # unlabelled_rate 0.2 of ~5,900+1,470


def test_unlabelled_rows_move_nothing_else():
    base = sample_labels(LabelConfig(n_train=400, n_val=100, n_test=100), seed=1)
    none = sample_labels(LabelConfig(n_train=400, n_val=100, n_test=100, unlabelled_rate=0.0), seed=1)
    assert none.noise["unlabelled"] == 0 and base.noise["unlabelled"] > 0
    assert np.array_equal(base.clean, none.clean) and np.array_equal(base.view, none.view)
    differ = (base.labels != none.labels).any(axis=0)
    assert differ.tolist() == [name == NORMAL for name in FINDINGS]  # only Normal, only on the unlabelled rows


def test_sampler_min_positives_in_every_split(big_sample):
    for split in SPLITS:
        rows = big_sample.split == split
        assert big_sample.labels[rows].sum(axis=0).min() >= 3, split
        assert big_sample.clean[rows].sum(axis=0).min() >= 3, split


def test_min_positives_hold_for_a_tiny_set():
    sample = sample_labels(LabelConfig(n_train=120, n_val=50, n_test=50), seed=3)
    for split in SPLITS:
        assert sample.labels[sample.split == split].sum(axis=0).min() >= 3


def test_label_noise_is_train_only(big_sample):
    s = big_sample
    held_out = s.split != "train"
    assert np.array_equal(s.labels[held_out], s.clean[held_out])
    train = s.split == "train"
    clean, noisy = s.clean[train], s.labels[train]
    task = [INDEX[n] for n in FINDINGS if n != NORMAL]
    missed = ((clean == 1) & (noisy == 0))[:, task].sum() / clean[:, task].sum()
    added = ((clean == 0) & (noisy == 1))[:, task].sum() / (clean[:, task] == 0).sum()
    assert 0.08 < missed < 0.16
    assert 0.0005 < added < 0.005


def test_co_occurrence_rules_on_clean_labels(big_sample):
    clean = big_sample.clean
    cvc, devices = clean[:, INDEX["Central Venous Catheter"]], clean[:, INDEX["Support Devices"]]
    assert np.all(devices[cvc == 1] == 1)
    emph = clean[:, INDEX["Emphysema"]] == 1
    hyper = clean[:, INDEX["Hyperinflated Lung"]] == 1
    assert hyper[emph].mean() > 3 * hyper[~emph].mean()
    athero = clean[:, INDEX["Aortic Atheromatosis"]] == 1
    assert clean[athero, INDEX["Aortic Elongation"]].mean() > 0.7
    old = big_sample.age > 70
    degenerative = clean[:, INDEX["Vertebral Degenerative Changes"]] == 1
    assert degenerative[old].mean() > 2 * degenerative[big_sample.age < 50].mean()


def test_patients_never_cross_splits_and_some_have_follow_ups(big_sample):
    s = big_sample
    patients = {split: set(s.patient[s.split == split]) for split in SPLITS}
    assert not patients["train"] & patients["val"] and not patients["train"] & patients["test"]
    assert not patients["val"] & patients["test"]
    assert (s.visit > 0).mean() > 0.15 and s.visit.max() >= 2


def test_centres_and_views(big_sample):
    s = big_sample
    b = s.source == "centre_b"
    assert 0.08 < b[s.split == "train"].mean() < 0.22 and 0.4 < b[s.split == "test"].mean() < 0.6
    ap = s.view == "AP"
    assert ap[b].mean() > ap[~b].mean() + 0.15


# --- drawing rules -----------------------------------------------------------------------------------------------
def _render(findings=(), index=7, size=96, **overrides):
    spec = {"seed": 0, "index": index, "patient": index, "age": 60.0, "female": False, "source": "centre_a",
            "view": "PA", "findings": tuple(findings)}  # fmt: skip
    spec.update(overrides)
    return render_image(ImageSpec(**spec), size, noiseless=True, return_scene=True)


def _silhouette_width(image: np.ndarray, row: int) -> int:
    """Width of the bright central (mediastinal/cardiac) run on ``row``."""
    line = image[row].astype(float)
    centre = int(np.argmax(line[len(line) // 3 : 2 * len(line) // 3])) + len(line) // 3
    threshold = 0.5 * (line[centre] + np.percentile(line[len(line) // 6 : 5 * len(line) // 6], 10))
    left = right = centre
    while left > 0 and line[left - 1] > threshold:
        left -= 1
    while right < len(line) - 1 and line[right + 1] > threshold:
        right += 1
    return right - left + 1


@pytest.mark.parametrize("index", [3, 11, 42])
def test_cardiomegaly_widens_the_heart(index):
    normal, scene0 = _render((), index)
    big, scene1 = _render(("Cardiomegaly",), index)
    assert scene0.geom.ctr < 0.5 < scene1.geom.ctr
    x, y, _, _, _ = scene1.geom.heart()
    row = int(y * normal.shape[0])
    widths = [(_silhouette_width(normal, r), _silhouette_width(big, r)) for r in range(row - 3, row + 4)]
    assert np.median([b / a for a, b in widths]) > 1.08


def test_effusion_brightens_the_lower_lung_zone():
    base, scene = _render((), 5)
    wet, _ = _render(("Pleural Effusion",), 5)
    diff = wet.astype(float) - base.astype(float)
    size = diff.shape[0]
    lower = diff[int(0.55 * size) : int(0.85 * size)]
    upper = diff[int(0.15 * size) : int(0.45 * size)]
    assert lower.max() > 8 and lower.mean() > 0.3
    assert lower.mean() > 5 * max(abs(upper.mean()), 0.01)


def test_pneumothorax_darkens_a_rim_and_osteopenia_fades_bones():
    base, _ = _render((), 9)
    ptx, _ = _render(("Pneumothorax",), 9)
    assert (ptx.astype(int) - base).min() < -5
    weak, _ = _render(("Osteopenia",), 9)
    assert weak.mean() < base.mean()


def test_scoliosis_bends_the_spine():
    _, straight = _render((), 4)
    _, bent = _render(("Scoliosis",), 4)
    spread = [np.ptp([v[0] for v in s.vertebrae if 0.15 < v[1] < 0.85]) for s in (straight, bent)]
    assert spread[1] > spread[0] + 0.02


def test_every_rule_changes_the_image_and_normal_changes_nothing():
    base, _ = _render((), 2, size=64)
    for name in FINDINGS:
        image, _ = _render((name,), 2, size=64)
        changed = np.abs(image.astype(int) - base).sum()
        assert (changed == 0) == (name == NORMAL), name


def test_rendering_is_order_independent_and_conspicuity_varies():
    a, _ = _render(("Nodule", "Cardiomegaly"), 8)
    b, _ = _render(("Cardiomegaly", "Nodule"), 8)
    assert np.array_equal(a, b)
    ctrs = [_render(("Cardiomegaly",), i, size=48)[1].geom.ctr for i in range(12)]
    assert min(ctrs) > 0.5 and max(ctrs) - min(ctrs) > 0.04


# --- generation: determinism and caching ---------------------------------------------------------------------------
def _read(out):
    manifest = (out / "manifest.csv").read_bytes()
    images = {p.name: p.read_bytes() for p in sorted((out / "images").iterdir())}
    return manifest, images


def test_generate_is_deterministic_across_workers_and_seeds(tmp_path):
    # a parallel OpenCV call in this (parent) process first: forked workers used to hang on the inherited pool
    cv2.warpAffine(np.ones((1024, 1024), np.float32), np.float32([[1, 0, 2], [0, 1, 1]]), (1024, 1024))
    one = generate(tmp_path / "a", seed=1, workers=1, verbose=False, **TINY).parent
    two = generate(tmp_path / "b", seed=1, workers=2, verbose=False, **TINY).parent
    other = generate(tmp_path / "c", seed=2, workers=2, verbose=False, **TINY).parent
    assert _read(one) == _read(two)
    assert _read(one)[0] != _read(other)[0]
    assert _read(one)[1] != _read(other)[1]


def test_manifest_layout(tmp_path):
    manifest = generate(tmp_path, seed=0, workers=1, verbose=False, **TINY)
    with open(manifest, newline="") as handle:
        rows = list(csv.reader(handle))
    header, body = rows[0], rows[1:]
    assert header == ["image_id", "path", "split", "patient_id", "source", "view", *FINDINGS]
    assert len(body) == 270 and body[0][0] == "syn000000" and body[0][1] == "images/syn000000.png"
    assert {r[2] for r in body} == set(SPLITS) and {r[4] for r in body} <= {"centre_a", "centre_b"}
    assert {r[5] for r in body} <= {"PA", "AP"} and {v for r in body for v in r[6:]} == {"0", "1"}
    image = cv2.imread(str(tmp_path / body[0][1]), cv2.IMREAD_UNCHANGED)
    assert image.dtype == np.uint8 and image.shape == (48, 48)
    params = json.loads((tmp_path / "params.json").read_text())
    assert params["params"]["seed"] == 0 and params["params"]["version"]
    assert params["label_noise"]["false_negative_rate"] == 0.12 and params["label_noise"]["applied_to"] == ["train"]


def test_generate_caches_and_regenerates_on_change(tmp_path, capsys):
    manifest = generate(tmp_path, seed=0, workers=1, **TINY)
    image = tmp_path / "images" / "syn000000.png"
    stamps = (manifest.stat().st_mtime_ns, image.stat().st_mtime_ns)
    capsys.readouterr()
    again = generate(tmp_path, seed=0, workers=2, **TINY)  # workers is not part of the cache key
    assert again == manifest and "synthetic set up to date" in capsys.readouterr().out
    assert (manifest.stat().st_mtime_ns, image.stat().st_mtime_ns) == stamps

    stale = tmp_path / "images" / "stale.png"
    stale.write_bytes(b"x")
    before = manifest.read_bytes()
    generate(tmp_path, seed=5, workers=1, verbose=False, **TINY)
    assert not stale.exists() and manifest.read_bytes() != before


def test_interrupted_generation_is_redone(tmp_path):
    manifest = generate(tmp_path, seed=0, workers=1, verbose=False, **TINY)
    (tmp_path / "images" / "syn000003.png").unlink()  # a lost image
    generate(tmp_path, seed=0, workers=1, verbose=False, **TINY)
    assert (tmp_path / "images" / "syn000003.png").is_file()
    manifest.unlink()  # killed before the manifest was written
    generate(tmp_path, seed=0, workers=1, verbose=False, **TINY)
    assert manifest.is_file()


def test_concurrent_prepares_generate_once(tmp_path, monkeypatch):
    """Two workers preparing the same synthetic set at once: one generates, the other waits and reuses it."""
    import threading
    import time

    import training.data.synthetic as synthetic
    from training.data.sources import SyntheticSource

    calls, active, overlap = [], [0], [False]

    def fake_generate(root, **kwargs):
        active[0] += 1
        overlap[0] |= active[0] > 1
        marker = root / "manifest.csv"
        if not marker.exists():
            calls.append(root)
            time.sleep(0.3)
            root.mkdir(parents=True, exist_ok=True)
            marker.write_text("x")
        active[0] -= 1
        return marker

    monkeypatch.setattr(synthetic, "generate", fake_generate)
    sources = [SyntheticSource(str(tmp_path), {"image_size": 32, "seed": 1}) for _ in range(2)]
    threads = [threading.Thread(target=s.prepare) for s in sources]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(calls) == 1 and not overlap[0]
