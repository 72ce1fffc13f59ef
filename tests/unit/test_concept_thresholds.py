"""Concept thresholds (evaluation/concept_thresholds.py) on hand-worked examples and against brute force."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from evaluation.concept_thresholds import (
    MODES,
    best_global,
    choose_thresholds,
    coordinate_ascent,
    image_f1,
    mean_image_f1,
    predict,
    predicted_concepts,
)

# Two images, three concepts. Image 0 carries concept 0, image 1 concepts 0 and 2; concept 1 is never true.
TRUTH = np.array([[1, 0, 0], [1, 0, 1]])
SCORES = np.array([[0.9, 0.8, 0.1], [0.7, 0.2, 0.6]])


def test_per_image_f1_by_hand():
    truth = np.array([[1, 1, 0], [0, 0, 0], [1, 0, 0]])
    predicted = np.array([[1, 0, 1], [1, 0, 0], [1, 0, 0]], dtype=bool)
    # image 0: TP 1, |P| 2, |T| 2 -> 0.5; image 1 has no true concept: left out;
    # image 2: TP 1, |P| 1, |T| 1 + 1 missed (a true CUI outside the columns) -> 2/3.
    values = image_f1(truth, predicted, missed=np.array([0, 0, 1]))
    np.testing.assert_allclose(values[[0, 2]], [0.5, 2 / 3])
    assert np.isnan(values[1])
    assert mean_image_f1(truth, predicted, np.array([0, 0, 1])) == pytest.approx((0.5 + 2 / 3) / 2)
    # An image whose only true concepts are outside the columns counts, with F1 0 whatever is predicted.
    assert image_f1(np.zeros((1, 2)), np.ones((1, 2), bool), np.array([2]))[0] == 0.0
    assert np.isnan(mean_image_f1(np.zeros((2, 2)), np.ones((2, 2), bool)))


def test_global_threshold_by_hand():
    # All six scores, highest first, and the mean F1 once the cut passes each:
    # 0.9 -> (1 + 0) / 2 = .5; 0.8 -> (2/3 + 0) / 2; 0.7 -> (2/3 + 2/3) / 2; 0.6 -> (2/3 + 1) / 2 = .8333 (best);
    # 0.2 -> (2/3 + 4/5) / 2; 0.1 -> (1/2 + 4/5) / 2. The cut is halfway between 0.6 and the next score, 0.2.
    threshold, f1 = best_global(TRUTH, SCORES)
    assert threshold == pytest.approx(0.4) and f1 == pytest.approx(5 / 6)
    assert mean_image_f1(TRUTH, predict(SCORES, threshold)) == pytest.approx(f1)
    chosen = choose_thresholds(TRUTH, SCORES, "global")
    assert chosen.mode == "global" and chosen.rounds == 0
    np.testing.assert_allclose(chosen.thresholds, [0.4, 0.4, 0.4])


def test_per_class_coordinate_ascent_by_hand():
    # From 0.4 everywhere, image 0 also gets concept 1 (0.8), never true on validation. With concepts that have no
    # validation positive left at the global threshold (the default), nothing can improve: F1 stays 5/6.
    kept = choose_thresholds(TRUTH, SCORES, "per_class")
    np.testing.assert_allclose(kept.thresholds, [0.4, 0.4, 0.4])
    assert kept.val_f1 == pytest.approx(5 / 6) and kept.global_f1 == pytest.approx(5 / 6) and kept.rounds == 1
    # Fitting every concept: concept 1 goes to "never" (halfway between its top score 0.8 and 1), image 0 is then
    # exact, and the mean F1 reaches 1; a second round moves nothing.
    fitted = choose_thresholds(TRUTH, SCORES, "per_class", min_positives=0)
    np.testing.assert_allclose(fitted.thresholds, [0.4, 0.9, 0.4])
    assert fitted.val_f1 == pytest.approx(1.0) and fitted.global_threshold == pytest.approx(0.4)
    assert fitted.rounds == 2
    assert predicted_concepts(SCORES, fitted.thresholds, ["C0000001", "C0000002", "C0000003"]) == [
        ["C0000001"], ["C0000001", "C0000003"]]  # fmt: skip


def test_at_or_above_the_threshold_is_predicted_and_ties_cannot_be_split():
    assert predicted_concepts(np.array([[0.5, 0.49]]), 0.5, ["A", "B"]) == [["A"]]
    # Two images tie at 0.7 on concept 0, one true and one not: a cut keeps both or neither.
    truth = np.array([[1, 0], [0, 1], [0, 1]])
    scores = np.array([[0.7, 0.1], [0.7, 0.9], [0.2, 0.8]])
    threshold, _ = best_global(truth, scores)
    chosen = predict(scores, threshold)
    assert chosen[0, 0] == chosen[1, 0]


def _brute_global(truth, scores, missed):
    candidates = np.unique(np.append(scores.ravel(), 1.5))
    return max(mean_image_f1(truth, predict(scores, t), missed) for t in candidates)


def test_global_sweep_matches_brute_force_and_per_class_is_a_coordinate_optimum():
    rng = np.random.default_rng(0)
    for trial in range(20):
        n, c = rng.integers(3, 12), rng.integers(1, 5)
        truth = (rng.random((n, c)) < 0.4).astype(int)
        scores = np.round(np.clip(truth * 0.3 + rng.random((n, c)) * 0.7, 0, 1), 1 + trial % 2)  # ties included
        missed = rng.integers(0, 2, n)
        threshold, f1 = best_global(truth, scores, missed)
        assert f1 == pytest.approx(_brute_global(truth, scores, missed)), trial
        assert mean_image_f1(truth, predict(scores, threshold), missed) == pytest.approx(f1), trial
        result = choose_thresholds(truth, scores, "per_class", missed, min_positives=0, max_rounds=50)
        assert result.val_f1 >= f1 - 1e-12
        assert result.val_f1 == pytest.approx(mean_image_f1(truth, predict(scores, result.thresholds), missed))
        # No single concept's threshold can be moved to another cut for a better mean F1.
        for k, t in itertools.product(range(c), np.unique(np.append(scores.ravel(), 1.5))):
            moved = result.thresholds.copy()
            moved[k] = t
            assert mean_image_f1(truth, predict(scores, moved), missed) <= result.val_f1 + 1e-12


def test_validation_without_true_concepts_falls_back_and_unknown_modes_are_named():
    threshold, f1 = best_global(np.zeros((3, 2)), np.full((3, 2), 0.3))
    assert threshold == 0.5 and np.isnan(f1)
    thresholds, rounds = coordinate_ascent(np.zeros((3, 2)), np.full((3, 2), 0.3), np.full(2, 0.5))
    np.testing.assert_array_equal(thresholds, [0.5, 0.5])
    assert rounds == 0
    with pytest.raises(ValueError, match=r"'best' is not one of \['global', 'per_class'\]"):
        choose_thresholds(TRUTH, SCORES, "best")
    with pytest.raises(ValueError, match="same"):
        choose_thresholds(TRUTH, SCORES[:, :2])
    assert set(MODES) == {"global", "per_class"}


def test_never_is_above_a_top_score_of_one():
    truth = np.array([[0, 1], [0, 1]])
    scores = np.array([[1.0, 0.9], [1.0, 0.8]])
    result = choose_thresholds(truth, scores, "per_class", min_positives=0)
    assert result.thresholds[0] > 1.0 and not predict(scores, result.thresholds)[:, 0].any()
    assert result.to_dict(["A", "B"])["thresholds"]["B"] == pytest.approx(result.thresholds[1])
