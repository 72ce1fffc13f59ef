"""The pediatric-pneumonia benchmark protocol: its YAML, draws, leakage rule, metrics, bootstrap, probe, cache,
adapters."""

from __future__ import annotations

import hashlib
import itertools
import re
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
import torch
from omegaconf import OmegaConf
from sklearn.metrics import accuracy_score, average_precision_score, recall_score, roc_auc_score

from apps.benchmarks.framework import platform_models
from apps.benchmarks.framework.catalog import load_protocol
from apps.benchmarks.framework.clip_models import ClipEncoder, parse_clip_spec
from apps.benchmarks.framework.embeddings import cache_key, encode_subset
from apps.benchmarks.framework.encoders import Encoded, Encoder, Target
from apps.benchmarks.framework.metrics import binary_metrics, bootstrap_table
from apps.benchmarks.framework.models import MODEL_KINDS, load_encoder, model_kind
from apps.benchmarks.framework.platform_models import PlatformRunEncoder, combine, map_outputs, missing_outputs_note
from apps.benchmarks.framework.probe import fit_probe, probe_probabilities
from apps.benchmarks.framework.protocol import BadInput, Features, Prediction, Targets
from apps.benchmarks.framework.report import format_table
from apps.benchmarks.framework.runner import bootstrap_scores, draw_subsets, run_benchmark
from apps.benchmarks.framework.sampling import (
    fingerprint,
    hash_order,
    hash_rank,
    largest_remainder_quotas,
    stratified_draw,
)
from apps.benchmarks.pneumonia import (
    OVERLAP_CAVEAT,
    PneumoniaProtocol,
    card_decisions,
    card_metrics,
    exclude_shared_patients,
    item_id,
    overlap_notes,
    pools,
)
from evaluation.bootstrap import resample_generator, resample_indices
from tests.benchmark_data import write_kermany, write_tiny_clip
from training.data.adapters.kermany import parse_name
from training.data.transforms import GRAY_MEAN, GRAY_STD

PROTOCOL = load_protocol("pneumonia")
SEED = PROTOCOL.seed
TARGET = PROTOCOL.target


# --- the protocol's YAML -----------------------------------------------------------------------------------------


def test_the_yaml_builds_the_protocol_with_its_fixed_settings():
    assert isinstance(PROTOCOL, PneumoniaProtocol) and PROTOCOL.name == "pneumonia"
    assert PROTOCOL.seed == 20261006 and PROTOCOL.train_size == 500 and PROTOCOL.bootstrap == "stratified"
    assert PROTOCOL.versions == {"full": None, "n100": 100} and PROTOCOL.default_version == "full"
    assert (TARGET.label, TARGET.positive_prompt, TARGET.negative_prompt) == (
        "Pneumonia", "a chest x-ray showing pneumonia", "a normal chest x-ray"
    )  # fmt: skip
    assert list(PROTOCOL.methods) == ["zero_shot", "probe", "always_pneumonia", "zero_shot_run_threshold"]
    assert "not the card's rule" in PROTOCOL.methods["zero_shot_run_threshold"]
    assert list(PROTOCOL.metrics) == ["auroc", "accuracy", "sensitivity", "specificity", "ap"]


# --- largest-remainder quotas ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("counts", "total", "expected"),
    [
        ({0: 234, 1: 390}, 100, {0: 37, 1: 63}),  # 37.5 / 62.5: the tied half goes to the larger stratum
        ({0: 1107, 1: 3485}, 500, {0: 121, 1: 379}),  # 120.54 / 379.46 (kermany-dev's train pool)
        ({0: 1341, 1: 3875}, 500, {0: 129, 1: 371}),  # 128.60 / 371.40 (the official train split)
        ({"a": 5, "b": 3, "c": 2}, 7, {"a": 4, "b": 2, "c": 1}),  # 3.5 / 2.1 / 1.4
        ({"a": 1, "b": 1, "c": 1}, 2, {"a": 1, "b": 1, "c": 0}),  # all tied: key order decides
        ({"x": 10, "y": 0}, 4, {"x": 4, "y": 0}),
        ({0: 234, 1: 390}, 624, {0: 234, 1: 390}),  # everything
        ({0: 234, 1: 390}, 0, {0: 0, 1: 0}),
    ],
)
def test_largest_remainder_hand_cases(counts, total, expected):
    assert largest_remainder_quotas(counts, total) == expected


def test_quotas_sum_exactly_stay_within_one_of_the_exact_share_and_ignore_input_order():
    rng = np.random.default_rng(3)
    for _ in range(200):
        counts = {f"s{i}": int(c) for i, c in enumerate(rng.integers(0, 50, size=rng.integers(1, 6)))}
        total = int(rng.integers(0, sum(counts.values()) + 1))
        quotas = largest_remainder_quotas(counts, total)
        assert sum(quotas.values()) == total
        available = sum(counts.values())
        for key, count in counts.items():
            share = total * count / available if available else 0
            assert np.floor(share) <= quotas[key] <= np.ceil(share) and quotas[key] <= count
        assert largest_remainder_quotas(dict(reversed(list(counts.items()))), total) == quotas


def test_quotas_refuse_impossible_draws():
    with pytest.raises(ValueError, match="cannot draw 11"):
        largest_remainder_quotas({0: 5, 1: 5}, 11)
    with pytest.raises(ValueError, match="non-negative"):
        largest_remainder_quotas({0: -1, 1: 5}, 1)


# --- seeded hash ranking and draws -------------------------------------------------------------------------------


def test_hash_rank_is_the_documented_sha256_and_stable_across_versions():
    item = "test/PNEUMONIA/person1_virus_6"
    assert hash_rank(item, SEED) == hashlib.sha256(f"{SEED}:{item}".encode()).hexdigest()
    # A literal value: any change to the hashing (encoding, separator, seed formatting) redraws every subset.
    assert hash_rank(item, 20261006) == "0443e1695544eee55be0beb2d518d84d3c2412f44e0cc374e257998e8ae70ea4"


def test_hash_order_is_stable_order_free_and_seed_dependent():
    ids = [f"train/NORMAL/IM-{i:04d}-0001" for i in range(60)]
    order = hash_order(ids, SEED)
    assert sorted(order) == sorted(ids)
    assert hash_order(list(reversed(ids)), SEED) == order  # input order does not matter
    assert hash_order(ids, SEED) == order  # same seed, same ranking
    assert hash_order(ids, SEED + 1) != order  # another seed, another ranking
    # Removing items keeps the relative order of the others: a draw never reshuffles because a file was added.
    kept = set(ids[::2])
    assert hash_order(sorted(kept), SEED) == [item for item in order if item in kept]


def test_stratified_draw_takes_the_quota_of_lowest_ranks_per_label():
    table = pd.DataFrame({"image_id": [f"img{i:03d}" for i in range(50)], "label": [0] * 20 + [1] * 30})
    drawn = stratified_draw(table, 10, "label", "image_id", seed=7)
    assert drawn["label"].value_counts().to_dict() == {1: 6, 0: 4}
    for label, quota in ((0, 4), (1, 6)):
        pool = table.loc[table["label"] == label, "image_id"].tolist()
        assert set(drawn.loc[drawn["label"] == label, "image_id"]) == set(hash_order(pool, 7)[:quota])
    assert drawn["image_id"].is_monotonic_increasing
    assert stratified_draw(table.sample(frac=1, random_state=1), 10, "label", "image_id", 7).equals(drawn)
    assert set(stratified_draw(table, 10, "label", "image_id", 8)["image_id"]) != set(drawn["image_id"])
    assert len(stratified_draw(table, None, "label", "image_id", 7)) == 50
    with pytest.raises(ValueError, match="unique"):
        stratified_draw(pd.concat([table, table.head(1)]), 5, "label", "image_id", 7)


def test_fingerprint_is_order_free_and_sensitive_to_ids_and_labels():
    assert fingerprint(["a", "b"], [1, 0]) == fingerprint(["b", "a"], [0.0, 1.0]) == "9a528f140d5c617a"
    assert fingerprint(["a", "b"], [1, 1]) != fingerprint(["a", "b"], [1, 0])
    assert fingerprint(["a", "c"], [1, 0]) != fingerprint(["a", "b"], [1, 0])


# --- patient numbers and the leakage rule ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("file_name", "patient"),
    [
        ("person123_bacteria_456.jpeg", "person123"),
        ("person123_virus_456.jpeg", "person123"),
        ("person1_virus_6_7.jpeg", "person1"),  # the release's one name with an extra number
        ("IM-0115-0001.jpeg", "IM-0115"),
        ("IM-0429-0001-0002.jpeg", "IM-0429"),
        ("NORMAL2-IM-0383-0001.jpeg", "NORMAL2-IM-0383"),
        ("NORMAL2-IM-0383-0001-0002.jpeg", "NORMAL2-IM-0383"),
    ],
)
def test_patient_number_of_every_file_name_shape(file_name, patient):
    assert parse_name(file_name)[0] == patient


def test_leakage_rule_removes_exactly_the_shared_patients():
    train = pd.DataFrame({
        "image_id": ["t1", "t2", "t3", "t4", "t5", "t6"],
        "patient_id": ["person1", "person2", "IM-0001", "IM-0002", "person1", "NORMAL2-IM-0001"],
    })  # fmt: skip
    test = pd.DataFrame({"image_id": ["s1", "s2", "s3"], "patient_id": ["person1", "IM-0002", "person9"]})
    kept, removed = exclude_shared_patients(train, test)
    assert removed["image_id"].tolist() == ["t1", "t4", "t5"]
    assert kept["image_id"].tolist() == ["t2", "t3", "t6"]  # NORMAL2-IM-0001 is not IM-0001
    assert not set(kept["patient_id"]) & set(test["patient_id"])


def test_subsets_of_a_release_folder(tmp_path):
    shared = write_kermany(tmp_path, train=(140, 380), test=(45, 75))
    full, n100 = draw_subsets(PROTOCOL, tmp_path), draw_subsets(PROTOCOL, tmp_path, "n100")
    assert full.version == "full"  # the YAML's first version is the default
    # n100's 100 test images include all 4 shared patients here, so both versions exclude the same 4 films.
    assert full.params["excluded_train_images"] == n100.params["excluded_train_images"] == 4
    assert "removed 4 image(s) of 4 test patient(s) of this version" in full.description[1]
    assert full.params["train_shared_full_n100"] == 500 and "500 of 500 training images shared" in full.description[3]
    assert {name: subset.pool for name, subset in full.subsets.items()} == {"train": 520, "test": 120}
    train = full.subsets["train"].table
    assert not set(train["path"]) & set(shared["shared_files"])
    assert not set(train["patient_id"]) & set(shared["shared_patients"])
    assert train["label"].value_counts().to_dict() == {0: 135, 1: 365}  # quotas of 140 / 380 for 500
    assert n100.test.table["label"].value_counts().to_dict() == {0: 37, 1: 63}  # 37.5 / 62.5, tie to the larger
    assert len(full.test) == 120 and set(n100.test.ids) <= set(full.test.ids)
    assert full.fingerprints["train"] == n100.fingerprints["train"]  # the same exclusions, the same training draw
    assert full.fingerprints["test"] != n100.fingerprints["test"]
    assert draw_subsets(PROTOCOL, tmp_path, "n100").fingerprints == n100.fingerprints
    assert full.fingerprints["test"] == fingerprint(full.test.table["item_id"], full.test.table["label"])
    assert list(full.test.table.columns) == ["item_id", "path", "patient_id", "label"]
    with pytest.raises(BadInput, match="unknown version 'n50' of benchmark pneumonia; choose one of full, n100"):
        draw_subsets(PROTOCOL, tmp_path, "n50")
    with pytest.raises(BadInput, match="data root .*missing is not a folder"):
        draw_subsets(PROTOCOL, tmp_path / "missing")
    with pytest.raises(BadInput, match="no Kermany images found"):
        draw_subsets(PROTOCOL, tmp_path / "test" / "NORMAL")


def expected_training_ids(root, test_patients: set[str], size: int = 500) -> set[str]:
    """The documented training draw, recomputed from the files on disk: drop the train-folder films of
    ``test_patients``, then per label the quota's lowest ``sha256("<seed>:pneumonia-train-<file stem>")`` ranks."""
    kept = {0: [], 1: []}
    for path in sorted((root / "train").rglob("*.jpeg")):
        if parse_name(path.name)[0] not in test_patients:
            kept[int(path.parent.name == "PNEUMONIA")].append(f"pneumonia-train-{path.stem}")
    quotas = largest_remainder_quotas({label: len(ids) for label, ids in kept.items()}, size)
    return {item for label, ids in kept.items() for item in hash_order(ids, SEED)[: quotas[label]]}


def test_each_version_excludes_only_the_patients_of_its_own_test_images(tmp_path):
    """The card's rule: with test patients that also have training films, full (every test patient) and n100
    (only the drawn ones) exclude different films and so draw different training sets."""
    shared = write_kermany(tmp_path, train=(140, 380), test=(45, 75), shared=30, shared_films=3)
    full, n100 = draw_subsets(PROTOCOL, tmp_path), draw_subsets(PROTOCOL, tmp_path, "n100")
    all_test_patients = {parse_name(path.name)[0] for path in (tmp_path / "test").rglob("*.jpeg")}
    n100_patients = {parse_name(item.removeprefix("pneumonia-test-") + ".jpeg")[0] for item in n100.test.ids}
    undrawn = set(shared["shared_patients"]) - n100_patients
    k = len(undrawn)  # 20 of the 120 test images are not drawn; k of them have training films (3 each)
    assert 0 < k <= 20
    assert full.params["excluded_train_images"] == 180 and n100.params["excluded_train_images"] == 180 - 3 * k
    expected_full = expected_training_ids(tmp_path, all_test_patients)
    expected_n100 = expected_training_ids(tmp_path, n100_patients)
    assert set(full.subsets["train"].ids) == expected_full and set(n100.subsets["train"].ids) == expected_n100
    # Each version's training draw is free of its own test patients; n100 may use the films of undrawn ones.
    assert not set(full.subsets["train"].table["patient_id"]) & all_test_patients
    assert not set(n100.subsets["train"].table["patient_id"]) & n100_patients
    assert set(n100.subsets["train"].table["patient_id"]) & undrawn
    overlap = len(expected_full & expected_n100)
    assert overlap < 500 and full.fingerprints["train"] != n100.fingerprints["train"]
    counts = {name: draw.subsets["train"].table["label"].value_counts().to_dict() for name, draw in
              (("full", full), ("n100", n100))}  # fmt: skip
    assert counts["full"] == {0: 135, 1: 365}  # quotas of 140 / 380 for 500 (the shared films are all removed)
    # Both runs report both versions' training draws and their overlap, whichever version they test on.
    for draw in (full, n100):
        assert draw.params["train_shared_full_n100"] == overlap
        assert draw.params["train_fingerprint_full"] == full.fingerprints["train"]
        assert draw.params["train_fingerprint_n100"] == n100.fingerprints["train"]
        for name in ("full", "n100"):
            assert (draw.params[f"train_normal_{name}"], draw.params[f"train_pneumonia_{name}"]) == (
                counts[name][0], counts[name][1]
            )  # fmt: skip
        assert draw.description[2] == (
            f"training draw of each version: full 500 images (135 normal / 365 pneumonia), fingerprint "
            f"{full.fingerprints['train']}; n100 500 images ({counts['n100'][0]} normal / {counts['n100'][1]} "
            f"pneumonia), fingerprint {n100.fingerprints['train']}"
        )
        assert draw.description[3] == f"{overlap} of 500 training images shared between full and n100"
    assert f"removed {180 - 3 * k} image(s) of {60 - k} test patient(s) of this version" in n100.description[1]
    assert n100.subsets["train"].pool == 520 + 3 * k


def test_another_version_that_cannot_be_drawn_is_reported_not_fatal(tmp_path):
    """Full excludes every shared film and is left with 480 < 500 training images; n100 keeps the films of its
    undrawn patients, so it still draws, and says why full's training draw is missing."""
    write_kermany(tmp_path, train=(100, 380), test=(45, 75), shared=30, shared_films=5)
    n100 = draw_subsets(PROTOCOL, tmp_path, "n100")
    assert "full cannot be drawn here (cannot draw 500 items from 480)" in n100.description[2]
    assert "train_fingerprint_full" not in n100.params and "train_shared_full_n100" not in n100.params
    assert n100.params["train_fingerprint_n100"] == n100.fingerprints["train"]
    with pytest.raises(BadInput, match="cannot draw 500 items from 480"):
        draw_subsets(PROTOCOL, tmp_path, "full")


# --- metrics and the stratified bootstrap ------------------------------------------------------------------------


def test_metrics_match_scikit_learn_including_ties():
    rng = np.random.default_rng(0)
    for trial in range(20):
        labels = (rng.random(80) < 0.6).astype(int)
        scores = rng.integers(0, 12, 80) / 11.0 if trial % 2 else rng.random(80)  # many ties on odd trials
        decisions = scores > 0.5
        got = binary_metrics(labels, scores, decisions)
        assert got["auroc"] == pytest.approx(roc_auc_score(labels, scores), abs=1e-12)
        assert got["ap"] == pytest.approx(average_precision_score(labels, scores), abs=1e-12)
        assert got["accuracy"] == pytest.approx(accuracy_score(labels, decisions))
        assert got["sensitivity"] == pytest.approx(recall_score(labels, decisions))
        assert got["specificity"] == pytest.approx(recall_score(labels, decisions, pos_label=0))


def test_always_pneumonia_predictor_on_the_official_test_mix():
    labels = np.array([0] * 234 + [1] * 390)
    got = binary_metrics(labels, np.ones(624), np.ones(624, dtype=bool))
    assert got["accuracy"] == pytest.approx(0.625)
    assert got["specificity"] == 0.0 and got["sensitivity"] == 1.0
    assert got["auroc"] == pytest.approx(0.5) and got["ap"] == pytest.approx(0.625)
    table = bootstrap_table(labels, {"zero_shot": (np.ones(624), np.ones(624, dtype=bool))}, n_boot=200, seed=1)
    accuracy = table.set_index("metric").loc["accuracy"]
    # Label-stratified resamples keep 234 / 390, so a constant predictor's accuracy has no spread at all.
    assert accuracy["value"] == accuracy["ci_low"] == accuracy["ci_high"] == pytest.approx(0.625)


def test_stratified_resamples_keep_each_class_count():
    labels = np.array([0] * 23 + [1] * 41 + [0] * 11)
    resamples = resample_indices(labels.size, 300, 5, strata=labels)
    assert resamples.shape == (300, labels.size)
    counts = np.stack([np.bincount(labels[row], minlength=2) for row in resamples])
    assert (counts == [34, 41]).all()
    assert len({row.tobytes() for row in resamples}) == 300  # real resamples, not copies
    assert np.array_equal(resample_indices(labels.size, 300, 5, strata=labels), resamples)
    assert not np.array_equal(resample_indices(labels.size, 300, 6, strata=labels), resamples)
    # The benchmark's own draw: resample b redraws each label's images (labels in order) from generator b.
    groups = [np.flatnonzero(labels == value) for value in (0, 1)]
    for b in (0, 7, 299):
        rng = resample_generator(5, b)
        expected = np.concatenate([g[rng.integers(0, g.size, size=g.size)] for g in groups])
        assert np.array_equal(resamples[b], expected)


def test_bootstrap_table_intervals_bracket_the_point_and_missing_protocols_stay_nan():
    rng = np.random.default_rng(1)
    labels = np.array([0] * 60 + [1] * 100)
    scores = labels * 0.6 + rng.random(160)
    table = bootstrap_table(labels, {"zero_shot": None, "probe": (scores, scores > 0.8)}, n_boot=300, seed=0)
    assert len(table) == 10
    probe = table[table["protocol"] == "probe"]
    assert (probe["ci_low"] <= probe["value"]).all() and (probe["value"] <= probe["ci_high"]).all()
    assert (probe["ci_high"] > probe["ci_low"]).all()
    assert table[table["protocol"] == "zero_shot"][["value", "ci_low", "ci_high"]].isna().all().all()
    text = format_table(table, {"zero_shot": "Zero-shot", "probe": "Linear probe"}, PROTOCOL.metrics)
    assert text.count("n/a") == 5 and "ROC-AUC" in text and "Average precision" in text
    assert text.splitlines()[0] == "| metric (95% CI) | Zero-shot | Linear probe |"


def test_the_runners_bootstrap_equals_bootstrap_table_for_the_binary_protocol(tmp_path):
    """The shared runner's bootstrap loop (any protocol) must give the pneumonia protocol exactly the numbers of
    ``metrics.bootstrap_table`` (its label-stratified binary reference), down to the last bit."""
    write_kermany(tmp_path, train=(140, 380), test=(45, 75))
    test = draw_subsets(PROTOCOL, tmp_path, "n100").test
    labels = test.targets.labels
    rng = np.random.default_rng(4)
    scores = labels * 0.3 + rng.random(len(labels))
    methods = {"zero_shot": None, "probe": Prediction(scores, scores > 0.6)}
    ours = bootstrap_scores(PROTOCOL, test.targets, methods, n_boot=200)
    reference = bootstrap_table(labels, {"zero_shot": None, "probe": (scores, scores > 0.6)}, n_boot=200, seed=SEED)
    pd.testing.assert_frame_equal(ours, reference, check_exact=True)
    assert bootstrap_scores(PROTOCOL, test.targets, methods, n_boot=0)["ci_low"].isna().all()


def test_card_names_cover_only_the_methods_that_answered():
    labels = np.array([0, 0, 1, 1, 1])
    scores = np.array([0.1, 0.6, 0.4, 0.8, 0.9])
    methods = {"zero_shot": None, "probe": Prediction(scores, scores > 0.5)}
    table = bootstrap_scores(PROTOCOL, Targets("binary", ("Pneumonia",), labels), methods, n_boot=0)
    assert card_metrics(table) == {
        "roc_auc_probe": pytest.approx(5 / 6), "accuracy_probe": 0.6, "sensitivity_probe": pytest.approx(2 / 3),
        "specificity_probe": 0.5, "average_precision_probe": pytest.approx((1 + 1 + 3 / 4) / 3),
    }  # fmt: skip


# --- probe -------------------------------------------------------------------------------------------------------


def test_probe_learns_a_separable_direction_and_reports_convergence():
    rng = np.random.default_rng(2)
    labels = np.array([0] * 100 + [1] * 300)
    features = rng.normal(size=(400, 8)) * [1, 1, 1, 1, 1, 1, 1, 100]
    features[:, 0] += 3 * labels  # signal on a small-scale feature next to a huge-scale noise feature
    probe, converged = fit_probe(features, labels)
    probs = probe_probabilities(probe, features)
    assert converged and roc_auc_score(labels, probs) > 0.95
    assert probs.shape == (400,) and ((probs > 0) & (probs < 1)).all()
    with pytest.raises(ValueError, match="both labels"):
        fit_probe(features[:50], labels[:50])


# --- model kinds, open_clip, cache -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "kind"),
    [
        ("1999f7b07e4f410e91e7c94c68713904", "run"),
        ("run:1999f7b07e4f410e91e7c94c68713904", "run"),
        ("models:/cxrlt-pneumonia@champion", "models"),
        ("models:/cxrlt-pneumonia/3", "models"),
        ("clip:ViT-B-32:laion2b_s34b_b79k", "clip"),
        ("clip:hf-hub:microsoft/BiomedCLIP-PubMedBERT_256-vit_base_patch16_224", "clip"),
    ],
)
def test_model_spec_prefix_selects_the_kind(spec, kind):
    assert model_kind(spec) == kind and kind in MODEL_KINDS


def test_unknown_model_kind_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown model kind 'hub'"):
        load_encoder("hub:foo", (TARGET,), "sqlite:///unused.db")


@pytest.mark.parametrize(
    ("spec", "parsed"),
    [
        ("clip:ViT-B-32", ("ViT-B-32", None)),
        ("clip:ViT-B-32:laion2b_s34b_b79k", ("ViT-B-32", "laion2b_s34b_b79k")),
        ("clip:hf-hub:org/repo", ("hf-hub:org/repo", None)),
        ("clip:local-dir:/models/tiny", ("local-dir:/models/tiny", None)),
    ],
)
def test_clip_spec_parsing(spec, parsed):
    assert parse_clip_spec(spec) == parsed


def test_tiny_random_clip_scores_the_prompt_margin(tmp_path):
    spec = write_tiny_clip(tmp_path / "tiny")
    encoder = load_encoder(spec, (TARGET,), "sqlite:///unused.db", seed=SEED)
    assert isinstance(encoder, ClipEncoder) and encoder.image_size == 32 and encoder.has_zero_shot("Pneumonia")
    assert encoder.any_zero_shot and encoder.zero_shot_notes == {} and encoder.mapped == {}
    images = np.random.default_rng(0).integers(0, 256, (5, 32, 32), dtype=np.uint8)
    out = encoder.encode(images)
    assert out.embeddings.shape == (5, 16) and out.zero_shot.shape == out.decisions.shape == (5, 1)
    assert np.allclose(np.linalg.norm(out.embeddings, axis=1), 1.0, atol=1e-5)
    with torch.inference_mode():
        text = encoder.model.encode_text(encoder.tokenizer([TARGET.positive_prompt, TARGET.negative_prompt]), True)
    expected = out.embeddings @ text[0].numpy() - out.embeddings @ text[1].numpy()
    assert np.allclose(out.zero_shot[:, 0], expected, atol=1e-5)
    assert np.array_equal(out.decisions[:, 0], out.zero_shot[:, 0] > 0)  # the margin's own rule: above 0
    again = load_encoder(spec, (TARGET,), "sqlite:///unused.db", seed=SEED)  # seeded random init: same model
    assert np.allclose(again.encode(images).zero_shot, out.zero_shot) and again.identity == encoder.identity
    other = load_encoder(spec, (TARGET,), "sqlite:///unused.db", seed=SEED + 1)
    assert not np.allclose(other.encode(images).zero_shot, out.zero_shot) and other.identity != encoder.identity


def test_one_clip_encoder_answers_every_target_with_its_own_prompt_direction(tmp_path):
    spec = write_tiny_clip(tmp_path / "tiny")
    effusion = Target("Effusion", "a chest x-ray with a pleural effusion", "a chest x-ray without effusion")
    both = load_encoder(spec, (TARGET, effusion), "sqlite:///unused.db", seed=SEED)
    assert both.target_labels == ("Pneumonia", "Effusion") and both.column("Effusion") == 1
    images = np.random.default_rng(1).integers(0, 256, (4, 32, 32), dtype=np.uint8)
    out = both.encode(images)
    assert out.zero_shot.shape == (4, 2) and out.zero_shot.dtype == np.float64 and out.decisions.dtype == bool
    # Each column is the margin a single-target encoder computes for that target alone.
    for k, target in enumerate((TARGET, effusion)):
        alone = load_encoder(spec, (target,), "sqlite:///unused.db", seed=SEED).encode(images)
        assert np.allclose(out.zero_shot[:, k], alone.zero_shot[:, 0], atol=1e-6)
        assert np.allclose(out.embeddings, alone.embeddings)
    assert np.array_equal(out.decisions, out.zero_shot > 0)
    # The cache key (and the model identity) change when only the second target's prompt changes.
    reworded = Target("Effusion", "a chest x-ray showing pleural fluid", effusion.negative_prompt)
    changed = load_encoder(spec, (TARGET, reworded), "sqlite:///unused.db", seed=SEED)
    assert changed.identity != both.identity and cache_key(changed, "fp") != cache_key(both, "fp")
    assert cache_key(load_encoder(spec, (TARGET, effusion), "sqlite:///unused.db", seed=SEED), "fp") == cache_key(
        both, "fp"
    )
    with pytest.raises(KeyError, match="'Edema' is not a target"):
        both.column("Edema")
    with pytest.raises(ValueError, match="target labels must be unique"):
        load_encoder(spec, (TARGET, TARGET), "sqlite:///unused.db")


# --- a platform classifier's outputs -> a protocol's targets ------------------------------------------------------

MODEL_LABELS = ["Atelectasis", "Pleural_Thickening", "Pleural Other", "Pneumonia", "Effusion"]


def test_targets_map_to_classifier_outputs_in_any_spelling():
    assert map_outputs(MODEL_LABELS, Target("Pneumonia", "", "")) == (3,)  # no outputs named: the label itself
    assert map_outputs(MODEL_LABELS, Target("pneumonia", "", "")) == (3,)
    thickening = Target("Pleural thickening", "", "", outputs=("pleural thickening", "PLEURAL-OTHER"))
    assert map_outputs(MODEL_LABELS, thickening) == (1, 2)  # model order, whatever the order named
    assert map_outputs(MODEL_LABELS, Target("X", "", "", outputs=("pleural_other", "Pleural Other"))) == (2,)
    assert map_outputs(MODEL_LABELS, Target("Nodule", "", "", outputs=("Nodule", "Mass"))) == ()
    assert Target("A", "", "", outputs=["b", "c"]).outputs == ("b", "c")  # a YAML list becomes a tuple


def test_a_target_scores_the_max_and_calls_any_output_over_its_own_threshold():
    probs = np.array([
        # Atel  PlThick PlOther Pneu  Eff
        [0.10, 0.30, 0.55, 0.20, 0.90],
        [0.10, 0.45, 0.10, 0.60, 0.10],
        [0.10, 0.20, 0.35, 0.40, 0.10],
        [0.10, 0.40, 0.50, 0.50, 0.10],
    ])  # fmt: skip
    thresholds = [0.5, 0.4, 0.6, 0.5, 0.5]
    scores, decisions = combine(probs, (1, 2), thresholds)
    assert scores.tolist() == [0.55, 0.45, 0.35, 0.5]
    # Row 0: PlOther 0.55 < its 0.6, PlThick 0.30 < 0.4; row 1: PlThick 0.45 >= 0.4; row 3: 0.40 >= 0.4 (at it).
    assert decisions.tolist() == [False, True, False, True]
    # Without the run's thresholds each output is called from 0.5 on.
    assert combine(probs, (1, 2), None)[1].tolist() == [True, False, False, True]
    scores, decisions = combine(probs, (3,), thresholds)  # one output: its own probability and threshold
    assert scores.tolist() == [0.2, 0.6, 0.4, 0.5] and decisions.tolist() == [False, True, False, True]
    scores, decisions = combine(probs, (), thresholds)
    assert np.isnan(scores).all() and scores.shape == (4,) and not decisions.any()


def test_a_target_without_outputs_says_what_was_looked_for():
    nodule = Target("Nodule", "", "", outputs=("Nodule", "Mass"))
    note = missing_outputs_note("run abc (task task1)", MODEL_LABELS, nodule)
    assert note == (
        "run abc (task task1) has none of the outputs 'Nodule', 'Mass' (those that answer 'Nodule') "
        "(its labels: Atelectasis, Pleural_Thickening, Pleural Other, Pneumonia, Effusion), so it has no "
        "zero-shot score for it"
    )
    assert "has no 'Cardiomegaly' output (its labels: Atelectasis" in missing_outputs_note(
        "run abc", MODEL_LABELS, Target("Cardiomegaly", "", "")
    )


class TinyClassifier(torch.nn.Module):
    """A platform classifier's shape: ``backbone`` (images -> pooled features) and a linear ``head``."""

    def __init__(self, labels: int):
        super().__init__()
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            self.backbone = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(16 * 16, 3))
            self.head = torch.nn.Linear(3, labels)


def test_a_platform_run_answers_every_target_from_its_mapped_outputs(monkeypatch):
    network = TinyClassifier(len(MODEL_LABELS)).eval()
    thresholds = [0.5, 0.4, 0.6, 0.45, 0.5]
    finished = SimpleNamespace(network=network, run_id="r1", checkpoint_sha256="abc", labels=MODEL_LABELS,
                               thresholds=thresholds, image_size=16, resize="stretch", task="task1", version=None)  # fmt: skip
    monkeypatch.setattr(platform_models, "load_finished", lambda spec, client: finished)
    monkeypatch.setattr(platform_models, "tracking_client", lambda uri: None)
    targets = (TARGET, Target("Pleural thickening", "", "", outputs=("pleural_thickening", "pleural other")),
               Target("Nodule", "", "", outputs=("Nodule", "Mass")))  # fmt: skip
    encoder = load_encoder("run:r1", targets, "sqlite:///unused.db")
    assert isinstance(encoder, PlatformRunEncoder) and encoder.any_zero_shot
    assert encoder.mapped == {"Pneumonia": ("Pneumonia",), "Pleural thickening": ("Pleural_Thickening", "Pleural Other"),
                              "Nodule": ()}  # fmt: skip
    assert [encoder.has_zero_shot(t.label) for t in targets] == [True, True, False]
    assert list(encoder.zero_shot_notes) == ["Nodule"]
    assert "none of the outputs 'Nodule', 'Mass'" in encoder.zero_shot_notes["Nodule"]
    rule = "the probability of Pneumonia is at or above the run's validation threshold 0.45"
    assert encoder.decision_rule("Pneumonia") == rule
    images = np.random.default_rng(2).integers(0, 256, (6, 16, 16), dtype=np.uint8)
    out = encoder.encode(images)
    with torch.inference_mode():
        x = (torch.from_numpy(images).float() / 255.0 - GRAY_MEAN) / GRAY_STD
        probs = torch.sigmoid(network.head(network.backbone(x.unsqueeze(1)))).numpy().astype(np.float64)
    assert out.zero_shot.shape == out.decisions.shape == (6, 3) and out.embeddings.shape == (6, 3)
    assert np.array_equal(out.zero_shot[:, 0], probs[:, 3]) and np.array_equal(out.decisions[:, 0], probs[:, 3] >= 0.45)
    assert np.array_equal(out.zero_shot[:, 1], probs[:, 1:3].max(axis=1))
    assert np.array_equal(out.decisions[:, 1], (probs[:, 1] >= 0.4) | (probs[:, 2] >= 0.6))
    assert np.isnan(out.zero_shot[:, 2]).all() and not out.decisions[:, 2].any()
    # Decisions are cached, so the thresholds they used are part of the identity.
    finished.thresholds = [0.5, 0.4, 0.6, 0.5, 0.5]
    assert load_encoder("run:r1", targets, "sqlite:///unused.db").identity != encoder.identity
    finished.thresholds = None
    plain = load_encoder("run:r1", targets[:1], "sqlite:///unused.db")
    assert np.array_equal(plain.encode(images).decisions[:, 0], probs[:, 3] >= 0.5)
    assert plain.decision_rule("Pneumonia").endswith("the default threshold 0.5")
    # A model with none of the targets' outputs: embeddings only, for the probe.
    alone = load_encoder("run:r1", targets[2:], "sqlite:///unused.db")
    assert not alone.any_zero_shot and alone.encode(images).zero_shot is None


class CountingEncoder(Encoder):
    """Mean intensity (and its square) as the embedding and the zero-shot probability of every target, called
    from 0.5 on; counts how many images it encoded."""

    image_size = 16
    zero_shot_kind = "probability"

    def __init__(self, name: str = "counting", targets=(TARGET,)):
        super().__init__(name, targets)
        self.name, self.calls = name, 0

    @property
    def identity(self) -> str:
        return self.name

    def encode(self, images: np.ndarray) -> Encoded:
        self.calls += len(images)
        mean = images.reshape(len(images), -1).mean(axis=1) / 255.0
        scores = np.repeat(mean[:, None], len(self.targets), axis=1)
        return Encoded(np.stack([mean, mean**2], axis=1).astype(np.float32), scores, scores >= 0.5)


def test_embeddings_are_computed_once_per_model_and_subset(tmp_path):
    write_kermany(tmp_path / "data", train=(140, 380), test=(45, 75))
    draw = draw_subsets(PROTOCOL, tmp_path / "data", "n100")
    encoder, cache = CountingEncoder(), tmp_path / "cache"
    fp, table = draw.fingerprints["test"], pd.DataFrame({"image_id": draw.test.ids, "path": draw.test.table["path"]})
    first, hit = encode_subset(encoder, tmp_path / "data", table, fp, cache, batch_size=32)
    assert not hit and encoder.calls == 100 and first.embeddings.shape == (100, 2)
    second, hit = encode_subset(encoder, tmp_path / "data", table, fp, cache, batch_size=32)
    assert hit and encoder.calls == 100  # nothing re-encoded
    assert np.array_equal(first.embeddings, second.embeddings) and np.array_equal(first.zero_shot, second.zero_shot)
    assert np.array_equal(first.decisions, second.decisions) and second.decisions.dtype == bool
    assert first.zero_shot.shape == (100, 1) and second.zero_shot.dtype == np.float64
    assert cache_key(encoder, fp) != cache_key(CountingEncoder("other weights"), fp)
    assert cache_key(encoder, fp) != cache_key(encoder, draw.fingerprints["train"])
    # The key also follows the targets the scores answer: other prompts, other outputs, another target.
    for targets in [(Target("Pneumonia", "a chest x-ray with pneumonia", TARGET.negative_prompt),),
                    (Target("Pneumonia", TARGET.positive_prompt, TARGET.negative_prompt, ("Consolidation",)),),
                    (TARGET, Target("Edema", "edema", "no edema"))]:  # fmt: skip
        assert cache_key(CountingEncoder(targets=targets), fp) != cache_key(encoder, fp)
    result = run_benchmark(PROTOCOL, draw, encoder, tmp_path / "data", n_boot=50, cache_dir=cache)
    assert result.cache_hits == {"train": False, "test": True} and encoder.calls == 600
    assert result.notes[-1] == "embeddings from the cache: test"
    assert result.params == {**draw.params, "probe_C": 1.0, "probe_max_iter": 2000}
    assert draw.params["excluded_train_images"] == 4
    # Brighter images are pneumonia in the generated set: both protocols rank far above chance.
    metrics = result.metrics()
    assert metrics["zero_shot/auroc"] > 0.9 and metrics["probe/auroc"] > 0.9
    # The model card's names, logged beside the platform's, carry the same values.
    card = {"auroc": "roc_auc", "accuracy": "accuracy", "sensitivity": "sensitivity", "specificity": "specificity",
            "ap": "average_precision"}  # fmt: skip
    for method, (metric, stem) in itertools.product(("zero_shot", "probe"), card.items()):
        assert metrics[f"{stem}_{method}"] == metrics[f"{method}/{metric}"]
    answered = ("zero_shot", "probe", "always_pneumonia")  # no run threshold: that extra column is n/a
    assert result.extras.metrics.keys() == {f"{stem}_{m}" for m in answered for stem in card.values()}
    assert len(result.scores) == 100 and set(result.scores["label"]) == {0, 1}
    # The card's call: a probability above 0.5, not a threshold the benchmark picks.
    assert ((result.scores["zero_shot_score"] > 0.5) == result.scores["zero_shot_pneumonia"].astype(bool)).all()
    assert "zero-shot score: probability, pneumonia when above 0.5 (the card's rule; no threshold is tuned)" in (
        result.notes
    )  # fmt: skip
    assert list(itertools.chain(result.scores.columns)) == [
        "item_id", "path", "patient_id", "label", "zero_shot_score", "zero_shot_pneumonia", "probe_probability",
        "probe_pneumonia",
    ]  # fmt: skip


# --- the card's item ids, decision rule, floor and caveats ----------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("test/PNEUMONIA/person136_bacteria_648.jpeg", "pneumonia-test-person136_bacteria_648"),  # the card's example
        ("train/NORMAL/NORMAL2-IM-0383-0001.jpeg", "pneumonia-train-NORMAL2-IM-0383-0001"),
        ("test/NORMAL/IM-0001-0001.png", "pneumonia-test-IM-0001-0001"),  # the extension is not part of it
        ("train/PNEUMONIA/person1_virus_6_7.jpeg", "pneumonia-train-person1_virus_6_7"),
    ],
)
def test_item_ids_are_the_cards_split_and_file_stem(path, expected):
    assert item_id(path) == expected


def test_every_pool_row_carries_the_cards_id_and_a_malformed_path_is_refused(tmp_path):
    write_kermany(tmp_path, train=(14, 38), test=(9, 15))
    for pool in pools(tmp_path):
        for row in pool.itertuples():
            split, _, name = row.path.split("/")
            assert row.item_id == f"pneumonia-{split}-{Path(name).stem}"
            assert re.fullmatch(r"pneumonia-(train|test)-(person\d+_(bacteria|virus)[\d_]+|(NORMAL2-)?IM-[\d-]+)",
                                row.item_id)  # fmt: skip
    with pytest.raises(ValueError, match="x.jpeg: expected <split>/<class folder>/<file>"):
        item_id("x.jpeg")


def test_two_files_with_one_card_id_are_refused_naming_both(tmp_path):
    write_kermany(tmp_path, train=(14, 38), test=(9, 15))
    normal = sorted((tmp_path / "test" / "NORMAL").glob("*.jpeg"))[0]
    (tmp_path / "test" / "PNEUMONIA" / normal.name).write_bytes(normal.read_bytes())
    with pytest.raises(BadInput) as error:
        draw_subsets(PROTOCOL, tmp_path, "n100")
    assert f"pneumonia-test-{normal.stem} names more than one image" in str(error.value)
    assert f"test/NORMAL/{normal.name}" in str(error.value) and f"test/PNEUMONIA/{normal.name}" in str(error.value)


def test_the_draw_ranks_the_cards_ids_and_ignores_row_order_and_file_extensions(tmp_path):
    write_kermany(tmp_path, train=(140, 380), test=(45, 75))
    n100 = draw_subsets(PROTOCOL, tmp_path, "n100")
    # By hand, from the files: per label the quota's lowest sha256("<seed>:pneumonia-test-<file stem>").
    stems = {label: [p.stem for p in sorted((tmp_path / "test" / folder).glob("*"))]
             for label, folder in ((0, "NORMAL"), (1, "PNEUMONIA"))}  # fmt: skip
    quotas = largest_remainder_quotas({label: len(names) for label, names in stems.items()}, 100)
    expected = set()
    for label, names in stems.items():
        ranked = sorted(names, key=lambda stem: hashlib.sha256(f"{SEED}:pneumonia-test-{stem}".encode()).hexdigest())
        expected |= {f"pneumonia-test-{stem}" for stem in ranked[: quotas[label]]}
    assert set(n100.test.ids) == expected and quotas == {0: 37, 1: 63}
    # Shuffled pools draw the same rows.
    train_pool, test_pool = pools(tmp_path)
    shuffled = [PROTOCOL.draw_version(train_pool.sample(frac=1, random_state=seed),
                                      test_pool.sample(frac=1, random_state=seed + 1), "n100") for seed in (1, 2)]  # fmt: skip
    for test, train, _ in shuffled:
        pd.testing.assert_frame_equal(test.table, n100.test.table)
        pd.testing.assert_frame_equal(train.table, n100.subsets["train"].table)
    # The key is the card's id, not the path: the same films stored as .png draw (and fingerprint) the same.
    for path in list(tmp_path.rglob("*.jpeg")):
        path.rename(path.with_suffix(".png"))
    again = draw_subsets(PROTOCOL, tmp_path, "n100")
    assert again.fingerprints == n100.fingerprints and again.test.ids == n100.test.ids


def hand_features(draw, test_scores: np.ndarray, test_decisions: np.ndarray) -> Features:
    """Encoded outputs made by hand: 2-d embeddings that carry the label (for the probe), the given zero-shot
    scores and the encoder's own cached decisions on the test items (random ones on the training items)."""
    rng = np.random.default_rng(5)
    encoded = {}
    for name, subset in draw.subsets.items():
        n, labels = len(subset), subset.targets.labels
        embeddings = np.c_[labels + rng.normal(0, 0.8, n), rng.normal(size=n)].astype(np.float32)
        scores, decisions = (test_scores, test_decisions) if name == "test" else (rng.random(n), rng.random(n) > 0.5)
        encoded[(name, "path")] = Encoded(embeddings, np.asarray(scores, float)[:, None], decisions[:, None])
    return Features(encoded, ("Pneumonia",))


def run_encoder(monkeypatch, thresholds):
    """A platform run with one ``Pneumonia`` output and the given stored validation thresholds."""
    finished = SimpleNamespace(network=TinyClassifier(1).eval(), run_id="r1", checkpoint_sha256="abc",
                               labels=["Pneumonia"], thresholds=thresholds, image_size=16, resize="stretch",
                               task="pneumonia", version=None, config=None)  # fmt: skip
    monkeypatch.setattr(platform_models, "load_finished", lambda spec, client: finished)
    monkeypatch.setattr(platform_models, "tracking_client", lambda uri: None)
    return load_encoder("run:r1", (TARGET,), "sqlite:///unused.db")


def values(outcome, draw) -> pd.Series:
    return bootstrap_scores(PROTOCOL, draw.test.targets, outcome.methods, n_boot=0).set_index(["protocol", "metric"])[
        "value"
    ]


def at(labels, decisions) -> dict[str, float]:
    """Accuracy, sensitivity and specificity of ``decisions`` by scikit-learn."""
    return {"accuracy": accuracy_score(labels, decisions), "sensitivity": recall_score(labels, decisions),
            "specificity": recall_score(labels, decisions, pos_label=0)}  # fmt: skip


def test_a_run_whose_tuned_threshold_is_not_one_half_is_scored_at_the_cards_0_5(tmp_path, monkeypatch):
    """The card's rule: a classifier's probability above 0.5; the run's own threshold (0.3) is only the extra
    column, and the two columns differ exactly as the two rules do."""
    write_kermany(tmp_path, train=(140, 380), test=(45, 75))
    draw = draw_subsets(PROTOCOL, tmp_path, "n100")
    labels = draw.test.targets.labels
    probs = np.clip(labels * 0.15 + np.random.default_rng(3).random(len(labels)) * 0.7, 0, 1)
    probs[:3] = [0.5, 0.3, 0.4]  # exactly 0.5 is not above it; 0.3 reaches the run's threshold
    encoder = run_encoder(monkeypatch, [0.3])
    _, own = combine(probs[:, None], (0,), encoder.thresholds)  # what the encoder cached: at or above 0.3
    outcome = PROTOCOL.predict(draw, encoder, hand_features(draw, probs, own))
    got = values(outcome, draw)
    card, run = probs > 0.5, probs >= 0.3
    assert (card != run).sum() > 10 and not card[0] and run[0] and run[1]
    for metric, value in at(labels, card).items():
        assert got["zero_shot", metric] == pytest.approx(value, abs=1e-12)
    for metric, value in at(labels, run).items():
        assert got["zero_shot_run_threshold", metric] == pytest.approx(value, abs=1e-12)
    assert got["zero_shot", "accuracy"] != got["zero_shot_run_threshold", "accuracy"]
    for method in ("zero_shot", "zero_shot_run_threshold"):  # the ranking metrics do not depend on a threshold
        assert got[method, "auroc"] == pytest.approx(roc_auc_score(labels, probs), abs=1e-12)
        assert got[method, "ap"] == pytest.approx(average_precision_score(labels, probs), abs=1e-12)
    scores = outcome.scores
    assert np.array_equal(scores["zero_shot_pneumonia"], card.astype(int))
    assert np.array_equal(scores["zero_shot_pneumonia_run_threshold"], run.astype(int))
    for metric, value in at(labels, scores["probe_probability"] > 0.5).items():  # the probe: above 0.5 as well
        assert got["probe", metric] == pytest.approx(value, abs=1e-12)
    assert outcome.notes[0] == ("zero-shot score: probability, pneumonia when above 0.5 (the card's rule; no "
                                "threshold is tuned)")  # fmt: skip
    extra = next(note for note in outcome.notes if note.startswith("zero-shot at the run's own threshold"))
    assert "not the card's rule" in extra and "validation threshold 0.3" in extra


def test_a_run_without_thresholds_has_no_extra_column(tmp_path, monkeypatch):
    write_kermany(tmp_path, train=(140, 380), test=(45, 75))
    draw = draw_subsets(PROTOCOL, tmp_path, "n100")
    probs = np.random.default_rng(4).random(len(draw.test))
    encoder = run_encoder(monkeypatch, None)
    outcome = PROTOCOL.predict(draw, encoder, hand_features(draw, probs, probs >= 0.5))
    assert outcome.methods["zero_shot_run_threshold"] is None
    assert np.array_equal(outcome.methods["zero_shot"].decisions, probs > 0.5)
    assert "zero_shot_pneumonia_run_threshold" not in outcome.scores
    assert values(outcome, draw).loc["zero_shot_run_threshold"].isna().all()


class MarginEncoder(Encoder):
    """An image-text model's shape (scores are prompt margins) whose cached calls are deliberately all positive:
    the protocol must call from the margin itself."""

    image_size = 16
    zero_shot_kind = "margin"

    @property
    def identity(self) -> str:
        return "margin"

    def encode(self, images):  # never called: the features are made by hand
        raise AssertionError


def test_an_image_text_model_calls_pneumonia_on_a_positive_prompt_margin(tmp_path):
    write_kermany(tmp_path, train=(140, 380), test=(45, 75))
    draw = draw_subsets(PROTOCOL, tmp_path, "n100")
    labels = draw.test.targets.labels
    margins = (labels - 0.4) * 0.02 + np.random.default_rng(6).normal(0, 0.02, len(labels))
    margins[:2] = [0.0, 1e-9]  # a zero margin is no call; any positive one is
    outcome = PROTOCOL.predict(draw, MarginEncoder("clip:x", (TARGET,)),
                               hand_features(draw, margins, np.ones(len(labels), bool)))  # fmt: skip
    got = values(outcome, draw)
    calls = margins > 0
    assert not calls[0] and calls[1] and not calls.all()
    assert np.array_equal(outcome.methods["zero_shot"].decisions, calls)
    for metric, value in at(labels, calls).items():
        assert got["zero_shot", metric] == pytest.approx(value, abs=1e-12)
    assert got["zero_shot", "auroc"] == pytest.approx(roc_auc_score(labels, margins), abs=1e-12)
    assert outcome.methods["zero_shot_run_threshold"] is None  # its own call is the card's rule
    assert outcome.notes[0].startswith("zero-shot score: margin, pneumonia when above 0 (the card's rule")
    np.testing.assert_array_equal(card_decisions(np.array([-1.0, 0.0, np.nan, 0.2]), "margin"),
                                  [False, False, False, True])  # fmt: skip
    with pytest.raises(ValueError, match="no decision rule for zero-shot scores of kind 'logit'"):
        card_decisions(margins, "logit")


def test_the_always_pneumonia_floor_is_the_test_items_prevalence(tmp_path):
    write_kermany(tmp_path, train=(140, 380), test=(45, 75))
    for version in ("full", "n100"):
        draw = draw_subsets(PROTOCOL, tmp_path, version)
        labels = draw.test.targets.labels
        outcome = PROTOCOL.predict(draw, MarginEncoder("clip:x", (TARGET,)),
                                   hand_features(draw, np.zeros(len(labels)), np.zeros(len(labels), bool)))  # fmt: skip
        got = values(outcome, draw).loc["always_pneumonia"]
        always = np.ones(len(labels), dtype=bool)
        prevalence = labels.sum() / len(labels)  # 75/120 (full), 63/100 (n100)
        assert prevalence == {"full": 75 / 120, "n100": 63 / 100}[version]
        assert got["accuracy"] == pytest.approx(accuracy_score(labels, always)) == pytest.approx(prevalence)
        assert got["specificity"] == recall_score(labels, always, pos_label=0) == 0.0 and got["sensitivity"] == 1.0
        assert got["auroc"] == 0.5 and got["ap"] == pytest.approx(prevalence)
        floor = next(note for note in outcome.notes if note.startswith("floor: always pneumonia"))
        assert f"accuracy = prevalence = {labels.sum()}/{len(labels)} = {prevalence:.3f}" in floor
        assert "specificity 0" in floor


def test_every_report_carries_the_overlap_caveat_and_names_a_kermany_runs_folder():
    assert overlap_notes(MarginEncoder("clip:x", (TARGET,))) == [OVERLAP_CAVEAT]
    assert "PneumoniaMNIST" in OVERLAP_CAVEAT and "may have seen these test images" in OVERLAP_CAVEAT

    def run(target: str, root: str):
        config = OmegaConf.create({"data": {"root": root, "source": {"_target_": target, "root": "${data.root}"}}})
        return SimpleNamespace(finished=SimpleNamespace(config=config))

    kermany = run("training.data.adapters.kermany.KermanySource", "/data/chest_xray")
    first, second = overlap_notes(kermany)
    assert first == OVERLAP_CAVEAT and second.startswith("this run was trained on the Kermany folder /data/chest_xray:")
    assert overlap_notes(run("training.data.adapters.nih14.NIH14Source", "/data/nih")) == [OVERLAP_CAVEAT]
    assert overlap_notes(SimpleNamespace(finished=SimpleNamespace(config=None))) == [OVERLAP_CAVEAT]
