"""Ensemble weights fitted on validation (apps/ensemble.py): what they pick, what they combine to, and what a
stored weights.json may not contain."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from apps.ensemble import (
    EnsembleError,
    MeanWeights,
    PerClassWeights,
    PerModelWeights,
    SplitPredictions,
    align,
    combine,
    macro_ap,
    parse_weights,
    read_split,
)
from evaluation.suite import compute_suite


def _targets(rng: np.random.Generator, n: int, c: int, prevalence: float = 0.2) -> np.ndarray:
    targets = (rng.random((n, c)) < prevalence).astype(float)
    targets[0] = 1.0  # every class has a positive
    return targets


def _informative(rng, targets: np.ndarray, signal: float) -> np.ndarray:
    """Probabilities separating positives by ``signal`` standard deviations."""
    return 1.0 / (1.0 + np.exp(-(signal * targets + rng.normal(size=targets.shape))))


def test_pure_noise_member_gets_almost_no_weight_and_tuned_beats_the_mean():
    rng = np.random.default_rng(0)
    targets = _targets(rng, 400, 5)
    good_a, good_b = _informative(rng, targets, 2.0), _informative(rng, targets, 1.5)
    noise = rng.random(targets.shape)
    probs = np.stack([good_a, noise, good_b])
    weights = PerModelWeights(seed=0).fit(probs, targets)
    assert weights.shape == (3, 5)
    assert np.allclose(weights, weights[:, :1])  # one vector shared by every class
    assert np.allclose(weights.sum(axis=0), 1.0) and (weights >= 0).all()
    assert weights[1, 0] < 0.05, weights[:, 0]
    assert weights[0, 0] > weights[2, 0]  # the stronger member weighs more
    mean = MeanWeights().fit(probs, targets)
    assert macro_ap(targets, combine(probs, weights)) > macro_ap(targets, combine(probs, mean)) + 0.01


def test_per_class_weights_pick_the_member_that_is_good_at_each_class():
    rng = np.random.default_rng(1)
    targets = _targets(rng, 600, 2, prevalence=0.3)  # ~180 positives per class: shrinkage keeps ~90% of the fit
    a = np.stack([_informative(rng, targets[:, 0], 3.0), rng.random(600)], axis=1)  # good at class 0 only
    b = np.stack([rng.random(600), _informative(rng, targets[:, 1], 3.0)], axis=1)  # good at class 1 only
    probs = np.stack([a, b])
    weights = PerClassWeights(seed=0).fit(probs, targets)
    assert weights[0, 0] > 0.85 and weights[1, 1] > 0.85, weights
    assert np.allclose(weights.sum(axis=0), 1.0)
    per_model = PerModelWeights(seed=0).fit(probs, targets)
    tuned, shared = macro_ap(targets, combine(probs, weights)), macro_ap(targets, combine(probs, per_model))
    assert tuned > shared + 0.05  # one vector for both classes cannot pick both members


def test_per_class_shrinks_rare_classes_toward_the_prior_and_leaves_classes_without_positives_at_it():
    rng = np.random.default_rng(2)
    n = 500
    targets = np.zeros((n, 3))
    targets[:, 0] = rng.random(n) < 0.3  # common
    targets[:3, 1] = 1  # three positives
    targets[:, 2] = np.where(rng.random(n) < 0.5, -1, 0)  # no positive at all, half unlabelled
    a = _informative(rng, targets, 2.5)
    b = rng.random((n, 3))
    b[:3, 1] = 1.0  # b sorts the three rare positives first: a perfect, meaningless class-1 fit
    probs = np.stack([a, b])
    prior = PerModelWeights(seed=0).fit(probs, targets)[:, 0]
    unshrunk = PerClassWeights(seed=0, prior_positives=0).fit(probs, targets)
    shrunk = PerClassWeights(seed=0, prior_positives=20).fit(probs, targets)
    assert unshrunk[1, 1] > 0.5  # alone, the rare class would hand its weight to b
    keep = 3 / (3 + 20)
    assert shrunk[:, 1] == pytest.approx(keep * unshrunk[:, 1] + (1 - keep) * prior)
    assert shrunk[:, 2] == pytest.approx(prior)
    assert np.allclose(MeanWeights().fit(probs, targets), 0.5)
    with pytest.raises(EnsembleError, match="prior"):
        PerClassWeights(prior="median")


def test_fits_are_deterministic():
    rng = np.random.default_rng(3)
    targets = _targets(rng, 200, 4)
    probs = np.stack([_informative(rng, targets, s) for s in (0.5, 1.0, 1.5)])
    for weighting in (PerModelWeights(seed=7), PerClassWeights(seed=7)):
        assert np.array_equal(weighting.fit(probs, targets), weighting.fit(probs, targets))


def test_weighted_combination_is_the_hand_computation():
    probs = np.array([[[0.2, 0.9], [0.4, 0.1]], [[0.6, 0.3], [0.0, 0.5]], [[1.0, 0.0], [0.8, 0.7]]])  # (K=3, N=2, C=2)
    weights = np.array([[0.5, 0.0], [0.25, 1.0], [0.25, 0.0]])
    expected = np.array(
        [
            [0.5 * 0.2 + 0.25 * 0.6 + 0.25 * 1.0, 0.3],
            [0.5 * 0.4 + 0.25 * 0.0 + 0.25 * 0.8, 0.5],
        ]
    )
    assert np.allclose(combine(probs, weights), expected)


def test_objective_is_the_suites_map_with_unlabelled_entries_left_out():
    rng = np.random.default_rng(4)
    targets = _targets(rng, 120, 4)
    targets[rng.random(targets.shape) < 0.2] = -1
    targets[:, 3] = np.where(targets[:, 3] == 1, 0, targets[:, 3])  # a class without positive: left out
    probs = rng.random(targets.shape)
    suite = compute_suite(targets, probs, ["a", "b", "c", "d"], n_boot=0).metrics["mAP"]
    assert macro_ap(targets, probs) == pytest.approx(suite)


def _split(run_id, ids, probs, targets):
    return SplitPredictions(run_id, list(ids), np.asarray(probs, float), np.asarray(targets, float))


def test_align_reorders_rows_and_names_the_member_whose_images_or_labels_differ():
    first = _split("run_a", ["x", "y", "z"], [[0.1], [0.2], [0.3]], [[1], [0], [-1]])
    shuffled = _split("run_b", ["z", "x", "y"], [[0.9], [0.7], [0.8]], [[-1], [1], [0]])
    probs, targets = align([first, shuffled], "val")
    assert probs[1, :, 0].tolist() == [0.7, 0.8, 0.9] and targets[:, 0].tolist() == [1, 0, -1]
    other = _split("run_c", ["x", "y", "w"], [[0.1], [0.2], [0.3]], [[1], [0], [-1]])
    with pytest.raises(EnsembleError, match=r"run run_c predictions/val.csv holds other images.*'z'.*'w'"):
        align([first, other], "val")
    relabelled = _split("run_d", ["x", "y", "z"], [[0.1], [0.2], [0.3]], [[1], [1], [-1]])
    with pytest.raises(EnsembleError, match=r"run run_d .*true labels of 'y'"):
        align([first, relabelled], "val")


@pytest.mark.parametrize(
    ("cells", "message"),
    [({"a": "1.5"}, "outside"), ({"a": "nan"}, "outside"), ({"true/a": "2"}, "-1, 0 or 1"), ({}, None)],
)
def test_read_split_checks_each_cell(tmp_path, cells, message):
    row = {"image_id": "007", "a": "0.25", "true/a": "1", **cells}
    path = tmp_path / "val.csv"
    pd.DataFrame([row, {"image_id": "008", "a": "0.5", "true/a": "-1"}]).to_csv(path, index=False)
    if message is None:
        split = read_split(path, "r1", ["a"], "val")
        assert split.ids == ["007", "008"] and split.probs[:, 0].tolist() == [0.25, 0.5]
    else:
        with pytest.raises(EnsembleError, match=f"run r1 predictions/val.csv: .*{message}"):
            read_split(path, "r1", ["a"], "val")
    with pytest.raises(EnsembleError, match=r"missing column\(s\) \['b'"):
        read_split(path, "r1", ["a", "b"], "val")


GOOD = {"format": 1, "weighting": "per_class", "members": ["abc123", "def456"], "labels": ["a", "b", "c"],
        "weights": [[0.5, 1.0, 0.0], [0.5, 0.0, 1.0]]}  # fmt: skip


def test_parse_weights_accepts_a_well_formed_file():
    stored = parse_weights(GOOD, "ens1")
    assert stored.members == ["abc123", "def456"] and stored.labels == ["a", "b", "c"]
    assert stored.weights.shape == (2, 3) and stored.weights[0, 1] == 1.0
    assert parse_weights(stored.to_json(), "ens1").weights.tolist() == GOOD["weights"]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"weights": [[0.5, 1.0], [0.5, 0.0]]}, "2 x 3 matrix"),
        ({"weights": [[0.5, 1.0, 0.0]]}, "2 x 3 matrix"),
        ({"weights": [[1.5, 1.0, 0.0], [-0.5, 0.0, 1.0]]}, "nonnegative"),
        ({"weights": [[0.5, 1.0, 0.0], [0.4, 0.0, 1.0]]}, "'a' sum to 0.9"),
        ({"weights": [[0.5, 1.0, 0.0], [0.5, 0.0, "1"]]}, "not a number"),
        ({"weights": [[0.5, 1.0, 0.0], [0.5, 0.0, True]]}, "not a number"),
        ({"members": ["abc123", "../../etc"]}, "list of run ids"),
        ({"members": ["abc123", "abc123"]}, "listed twice"),
        ({"members": []}, "list of run ids"),
        ({"labels": ["a", "a", "c"]}, "label is listed twice"),
        ({"labels": "abc"}, "list of class names"),
        ({"format": 2}, "format 2"),
    ],
)
def test_parse_weights_refuses_untrusted_content(change, message):
    with pytest.raises(EnsembleError, match=message):
        parse_weights({**GOOD, **change}, "ens1")


def test_parse_weights_refuses_nan_and_non_objects():
    with pytest.raises(EnsembleError, match="finite"):
        parse_weights({**GOOD, "weights": [[float("nan"), 1.0, 0.0], [0.5, 0.0, 1.0]]}, "ens1")
    with pytest.raises(EnsembleError, match="JSON object"):
        parse_weights([GOOD], "ens1")
