"""Progression between two films (apps.benchmarks.chextemporal.progression): the prompt bank, zero-shot on the change of
the embeddings (best prompt vs averaged prompts), the classifier rule and its fitting, the trained pair head,
out-of-fold prediction, and the metrics against sklearn."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from sklearn.metrics import accuracy_score, balanced_accuracy_score, confusion_matrix, f1_score

from apps.benchmarks.chextemporal.progression import (
    DELTA_GRID,
    PRESENCE_CLASSES,
    PROGRESSION_CLASSES,
    RULE_CLASSES,
    SEVERITY_CLASSES,
    RuleThresholds,
    apply_rule,
    class_prompts,
    confusion,
    fit_progression_head,
    fit_rule,
    load_prompt_bank,
    majority_floor,
    mean_prompt_scores,
    out_of_fold,
    pair_change,
    predict_head,
    present_grid,
    progression_metrics,
    prompt_embeddings,
    zero_shot_scores,
)
from tests.conftest import PROJECT_ROOT

# ------------------------------------------------------------------------------------------------ prompts


def test_the_project_bank_has_five_templated_prompts_for_every_class():
    bank = load_prompt_bank()
    assert set(bank) == set(RULE_CLASSES)
    for prompts in bank.values():
        assert len(prompts) == 5 and len(set(prompts)) == 5
        assert all(p.count("{finding}") == 1 for p in prompts)
    assert load_prompt_bank("configs/text/progression.yaml") == bank  # relative to the project root
    assert load_prompt_bank(PROJECT_ROOT / "configs" / "text" / "progression.yaml") == bank


def test_class_prompts_insert_the_finding_in_lower_case_in_class_order():
    bank = {"new": ("new {finding}", "{finding} has appeared"), "stable": ("unchanged {finding}",)}
    prompts = class_prompts(bank, "Pleural Effusion", ("stable", "new"))
    assert list(prompts) == ["stable", "new"]
    assert prompts == {
        "stable": ["unchanged pleural effusion"],
        "new": ["new pleural effusion", "pleural effusion has appeared"],
    }
    with pytest.raises(KeyError, match="resolved"):
        class_prompts(bank, "Edema", ("new", "resolved"))


@pytest.mark.parametrize("template", ["new finding", "{finding} and {finding}"])
def test_a_template_without_exactly_one_placeholder_is_refused(tmp_path, template):
    path = tmp_path / "bank.yaml"
    path.write_text(f'prompts:\n  new:\n    - "new {{finding}}"\n    - "{template}"\n')
    with pytest.raises(ValueError, match="exactly once"):
        load_prompt_bank(path)


# ------------------------------------------------------------------------------------------------ zero-shot


def one_prompt_each(text: np.ndarray) -> list[np.ndarray]:
    """Class ``k``'s one prompt embeds as ``text[k]``, through :func:`prompt_embeddings` (which unit-scales it)."""
    return prompt_embeddings({str(k): [str(k)] for k in range(len(text))}, lambda texts: text[[int(t) for t in texts]])


def winner(scores: np.ndarray, classes) -> np.ndarray:
    """The class of each row's highest score, as the benchmark predicts it."""
    return np.asarray(classes)[scores.argmax(axis=1)]


def test_zero_shot_predicts_the_class_whose_text_the_change_points_along():
    # Class texts are the axes e1..e5; every prior film is 3 * e0 (orthogonal to all texts), and the current film
    # adds some of one class's axis. The change of the unit vectors has an e0 part (orthogonal to every text)
    # and a positive part along that class's axis only.
    dim, classes = 6, PROGRESSION_CLASSES
    class_text = np.eye(dim)[1:] * np.array([[2.0], [0.5], [1.0], [4.0], [1.5]])  # lengths must not matter
    prior = np.tile(3.0 * np.eye(dim)[0], (5, 1))
    current = 7.0 * (np.eye(dim)[0] + 0.4 * np.eye(dim)[1:])  # row k moves towards class k
    scores = zero_shot_scores(prior, current, one_prompt_each(class_text))
    assert scores.shape == (5, 5)
    assert list(winner(scores, classes)) == list(classes)
    off_diagonal = scores[~np.eye(5, dtype=bool)]
    assert np.allclose(off_diagonal, 0.0) and (np.diag(scores) > 0).all()
    # Moving back (current and prior swapped) points away from the class: a negative cosine.
    assert (np.diag(zero_shot_scores(current, prior, one_prompt_each(class_text))) < 0).all()


def test_zero_shot_is_the_cosine_of_the_unit_embedding_difference_with_each_class_text():
    rng = np.random.default_rng(0)
    prior, current, text = rng.normal(size=(7, 8)), rng.normal(size=(7, 8)) * 3, rng.normal(size=(4, 8))
    expected = np.empty((7, 4))
    for i in range(7):
        change = current[i] / np.linalg.norm(current[i]) - prior[i] / np.linalg.norm(prior[i])
        for j in range(4):
            expected[i, j] = change @ text[j] / (np.linalg.norm(change) * np.linalg.norm(text[j]))
    assert np.allclose(zero_shot_scores(prior, current, one_prompt_each(text)), expected)
    # Not the cosine of the raw difference: the films' lengths differ, and they must not weigh on the change.
    raw = (current - prior) / np.linalg.norm(current - prior, axis=1, keepdims=True)
    assert not np.allclose(raw @ (text / np.linalg.norm(text, axis=1, keepdims=True)).T, expected, atol=1e-3)


def test_an_unchanged_pair_scores_zero_for_every_class():
    emb = np.array([[1.0, 2.0, 3.0]])
    assert np.array_equal(pair_change(emb, 2 * emb), np.zeros((1, 3)))
    assert np.array_equal(zero_shot_scores(emb, 2 * emb, one_prompt_each(np.eye(3))), np.zeros((1, 3)))
    with pytest.raises(ValueError, match="must both be"):
        pair_change(emb, np.ones((2, 3)))


def test_the_averaged_rule_uses_the_renormalised_mean_of_the_normalised_prompts():
    vectors = {"a": [3.0, 0.0], "b": [0.0, 1.0], "c": [0.0, -5.0]}
    calls = []

    def embed(texts):
        calls.append(list(texts))
        return np.array([vectors[t] for t in texts])

    per_class = prompt_embeddings({"x": ["a", "b"], "y": ["c"]}, embed)
    assert calls == [["a", "b", "c"]]  # one batched call
    class_vectors = mean_prompt_scores(np.eye(2), per_class).T  # against e0 and e1: each class's own vector
    assert np.allclose(class_vectors, [[np.sqrt(0.5), np.sqrt(0.5)], [0.0, -1.0]])  # a plain mean favours "a"


def test_zero_shot_uses_the_bank_prompts_of_the_finding():
    bank = load_prompt_bank()
    classes, dim = PROGRESSION_CLASSES, 8
    owner = {text: k for k, c in enumerate(classes) for text in class_prompts(bank, "Edema", [c])[c]}
    rng = np.random.default_rng(1)
    seen = []

    def embed(texts):  # each prompt: its class's axis (scaled, with a little noise), so texts of a class agree
        seen.extend(texts)
        return np.array([(1 + owner[t]) * (np.eye(dim)[1 + owner[t]] + 0.01 * rng.normal(size=dim)) for t in texts])

    prior = np.tile(np.eye(dim)[0], (5, 1))
    current = np.eye(dim)[0] + 0.5 * np.eye(dim)[1:6]
    scores = zero_shot_scores(prior, current, prompt_embeddings(class_prompts(bank, "Edema", classes), embed))
    assert list(winner(scores, classes)) == list(classes)
    assert sorted(seen) == sorted(owner) and "worsening edema" in seen


def test_clip_text_tower_scores_the_prompts(tmp_path):
    from apps.benchmarks.framework.clip_models import ClipEncoder
    from tests.benchmark_data import write_tiny_clip

    encoder = ClipEncoder(write_tiny_clip(tmp_path / "tiny"), (), seed=0)
    out = encoder.embed_texts(["new edema", "unchanged edema", "resolved edema"])
    assert out.shape == (3, 16) and np.allclose(np.linalg.norm(out, axis=1), 1.0, atol=1e-5)
    rng = np.random.default_rng(0)
    per_class = prompt_embeddings(class_prompts(load_prompt_bank(), "Edema", PROGRESSION_CLASSES), encoder.embed_texts)
    scores = zero_shot_scores(rng.normal(size=(4, 16)), rng.normal(size=(4, 16)), per_class)
    assert scores.shape == (4, 5) and np.isfinite(scores).all() and (np.abs(scores) <= 1 + 1e-9).all()


def _at(degrees: float) -> list[float]:
    return [np.cos(np.radians(degrees)), np.sin(np.radians(degrees))]


def test_the_best_prompt_and_the_averaged_prompts_pick_different_classes_where_they_should():
    # The pair changes along e0 (prior -e0, current +e0). Class A has one prompt exactly along the change (0 deg)
    # and one at 120 deg; class B two prompts at +-40 deg. By hand: best prompt A = cos 0 = 1 > B = cos 40 = 0.766
    # (A wins); averaged, A's mean unit vector is (1 + cos 120, sin 120) / 2 -> at 60 deg, cos 0.5, while B's is
    # along e0, cos 1 (B wins).
    vectors = {"a1": _at(0), "a2": _at(120), "b1": _at(40), "b2": _at(-40)}
    per_class = prompt_embeddings({"A": ["a1", "a2"], "B": ["b1", "b2"]}, lambda texts: [vectors[t] for t in texts])
    prior, current = np.array([[-1.0, 0.0]]), np.array([[1.0, 0.0]])
    best = zero_shot_scores(prior, current, per_class, "max")
    averaged = zero_shot_scores(prior, current, per_class, "mean")
    assert np.allclose(best, [[1.0, np.cos(np.radians(40))]]) and winner(best, ("A", "B"))[0] == "A"
    assert np.allclose(averaged, [[0.5, 1.0]]) and winner(averaged, ("A", "B"))[0] == "B"
    with pytest.raises(ValueError, match="prompt_rule must be one of max, mean"):
        zero_shot_scores(prior, current, per_class, "median")


def test_the_protocol_defaults_to_the_best_prompt():
    from apps.benchmarks.framework.catalog import load_protocol

    assert load_protocol("chextemporal").prompt_rule == "max"


# ------------------------------------------------------------------------------------------------ rule

# One pair per branch, at present = 0.5 and delta = 0.25 (exact in binary, so the boundaries are tested exactly).
PAIRS = {  # name: (p_prior, p_current)
    "appears": (0.2, 0.7),
    "appears_at_threshold": (0.49, 0.5),  # present is p >= present
    "goes": (0.7, 0.2),
    "rises": (0.5, 0.875),
    "falls": (0.875, 0.5),
    "rises_by_delta": (0.5, 0.75),  # exactly delta: not more than delta, so stable
    "falls_by_delta": (0.75, 0.5),
    "holds": (0.6, 0.65),
    "absent": (0.1, 0.3),
}
EXPECTED = {
    PROGRESSION_CLASSES: ["new", "new", "resolved", "worse", "improved", "stable", "stable", "stable", "stable"],
    PRESENCE_CLASSES: ["new", "new", "resolved", *["persisting"] * 5, "fallback"],
    SEVERITY_CLASSES: ["worse", "worse", "improved", "worse", "improved", "stable", "stable", "stable", "stable"],
}


@pytest.mark.parametrize("classes", list(EXPECTED))
def test_rule_branches(classes):
    p_prior, p_current = (np.array(v) for v in zip(*PAIRS.values(), strict=True))
    fallback = "resolved"  # any class of the set; only the presence-only set needs it (absent on both films)
    predicted = apply_rule(p_prior, p_current, RuleThresholds(0.5, 0.25, fallback), classes)
    expected = [fallback if e == "fallback" else e for e in EXPECTED[classes]]
    assert list(predicted) == expected
    assert set(predicted) <= set(classes)


def test_rule_without_a_fallback_refuses_only_what_the_class_set_cannot_express():
    thresholds = RuleThresholds(0.5, 0.25)
    assert list(apply_rule([0.2, 0.7, 0.6], [0.7, 0.2, 0.9], thresholds, PRESENCE_CLASSES)) == [
        "new", "resolved", "persisting"
    ]  # fmt: skip
    with pytest.raises(ValueError, match="absent"):
        apply_rule([0.1], [0.2], thresholds, PRESENCE_CLASSES)
    with pytest.raises(ValueError, match="not one of"):
        apply_rule([0.1], [0.2], RuleThresholds(0.5, 0.25, "stable"), PRESENCE_CLASSES)


def test_rule_refuses_unknown_classes_and_missing_scores():
    with pytest.raises(ValueError, match="can only predict"):
        apply_rule([0.1], [0.2], RuleThresholds(0.5, 0.1), ("new", "gone"))
    with pytest.raises(ValueError, match="NaN"):
        apply_rule([np.nan], [0.2], RuleThresholds(0.5, 0.1), PROGRESSION_CLASSES)


@pytest.mark.parametrize("classes", [PROGRESSION_CLASSES, PRESENCE_CLASSES, SEVERITY_CLASSES])
def test_rule_never_predicts_outside_the_class_set(classes):
    rng = np.random.default_rng(2)
    p_prior, p_current = rng.uniform(size=500), rng.uniform(size=500)
    predicted = apply_rule(p_prior, p_current, RuleThresholds(0.5, 0.1, classes[0]), classes)
    assert set(predicted) == set(classes)


def _synthetic_probabilities(n=600, seed=3):
    rng = np.random.default_rng(seed)
    return rng.uniform(size=n), rng.uniform(size=n)


def test_fit_rule_recovers_the_thresholds_that_made_the_labels():
    p_prior, p_current = _synthetic_probabilities()
    grid = present_grid(p_prior, p_current)
    assert len(grid) == 21 and grid[0] == min(p_prior.min(), p_current.min())
    assert set(grid) <= set(p_prior) | set(p_current)  # observed values, not interpolations
    for present, delta in [(grid[10], 0.1), (grid[5], 0.2), (grid[14], 0.025)]:
        labels = apply_rule(p_prior, p_current, RuleThresholds(present, delta), PROGRESSION_CLASSES)
        fitted = fit_rule(p_prior, p_current, labels, PROGRESSION_CLASSES)
        assert (fitted.present, fitted.delta) == (present, delta)
        assert fitted.balanced_accuracy == 1.0
        assert fitted.fallback == majority_floor(labels, 1, PROGRESSION_CLASSES)[0]


def test_fit_rule_on_a_presence_only_set_recovers_presence_and_keeps_the_first_delta():
    p_prior, p_current = _synthetic_probabilities(seed=4)
    present = present_grid(p_prior, p_current)[8]
    labels = apply_rule(p_prior, p_current, RuleThresholds(present, 0.2, "new"), PRESENCE_CLASSES)
    fitted = fit_rule(p_prior, p_current, labels, PRESENCE_CLASSES)
    # delta cannot matter when worse, stable and improved are all "persisting": the tie goes to the grid's first.
    assert (fitted.present, fitted.delta, fitted.balanced_accuracy) == (present, DELTA_GRID[0], 1.0)


def test_fit_rule_maximises_balanced_accuracy_as_sklearn_computes_it():
    p_prior, p_current = _synthetic_probabilities(n=300, seed=5)
    rng = np.random.default_rng(5)
    # Noisy labels, mostly stable: no thresholds are perfect, and plain accuracy would prefer "all stable".
    labels = apply_rule(p_prior, p_current, RuleThresholds(0.4, 0.1), PROGRESSION_CLASSES)
    flip = rng.uniform(size=300) < 0.3
    labels[flip] = "stable"
    fitted = fit_rule(p_prior, p_current, labels, PROGRESSION_CLASSES)
    best = apply_rule(p_prior, p_current, fitted, PROGRESSION_CLASSES)
    assert fitted.balanced_accuracy == pytest.approx(balanced_accuracy_score(labels, best))
    for present in present_grid(p_prior, p_current):
        for delta in DELTA_GRID:
            other = apply_rule(p_prior, p_current, RuleThresholds(present, delta, fitted.fallback), PROGRESSION_CLASSES)
            assert balanced_accuracy_score(labels, other) <= fitted.balanced_accuracy + 1e-12
    with pytest.raises(ValueError, match="outside"):
        fit_rule(p_prior, p_current, np.full(300, "persisting"), PROGRESSION_CLASSES)


# ------------------------------------------------------------------------------------------------ trained head


def _separable_pairs(n=150, dim=4, seed=6):
    """Pairs whose change is a large step along one axis per class: linearly separable on current - prior."""
    rng = np.random.default_rng(seed)
    classes = ("worse", "stable", "improved")
    steps = {"worse": 3.0 * np.eye(dim)[0], "stable": np.zeros(dim), "improved": -3.0 * np.eye(dim)[0]}
    labels = np.array([classes[i % 3] for i in range(n)])
    prior = rng.normal(size=(n, dim))
    current = prior + np.array([steps[c] for c in labels]) + 0.05 * rng.normal(size=(n, dim))
    return prior, current, labels


def test_head_fits_separable_pairs_and_returns_probabilities_in_the_given_class_order():
    prior, current, labels = _separable_pairs()
    classes = ("new", "improved", "stable", "worse")  # "new" has no training pairs: its column is all 0
    head = fit_progression_head(prior, current, labels, seed=0, classes=classes)
    assert head.classes == classes and head.converged
    probs = predict_head(head, prior, current)
    assert probs.shape == (len(labels), 4)
    assert np.allclose(probs.sum(axis=1), 1.0) and np.all(probs[:, 0] == 0)
    assert np.array_equal(winner(probs, classes), labels)  # training accuracy 1, columns in order
    # Another class order only permutes the columns.
    reordered = fit_progression_head(prior, current, labels, seed=0, classes=("worse", "stable", "improved"))
    again = predict_head(reordered, prior, current)
    assert np.allclose(again, probs[:, [3, 2, 1]], atol=1e-6)
    default = fit_progression_head(prior, current, labels)
    assert default.classes == ("worse", "stable", "improved")  # the labels' classes in the usual order
    nih = fit_progression_head(prior, current, np.array(["resolved", "persisting", "new"])[np.arange(150) % 3])
    assert nih.classes == PRESENCE_CLASSES


def test_head_refuses_a_single_class_and_unknown_labels():
    prior, current, labels = _separable_pairs(n=30)
    with pytest.raises(ValueError, match="two classes"):
        fit_progression_head(prior, current, np.full(30, "stable"))
    with pytest.raises(ValueError, match="outside"):
        fit_progression_head(prior, current, labels, classes=("worse", "stable"))


# ------------------------------------------------------------------------------------------------ metrics


@pytest.mark.parametrize("drawn", [PROGRESSION_CLASSES, PROGRESSION_CLASSES[:4]])
def test_metrics_equal_sklearn_on_random_labels(drawn):
    rng = np.random.default_rng(7)
    truth, predicted = rng.choice(drawn, 200), rng.choice(drawn, 200)
    metrics = progression_metrics(truth, predicted, PROGRESSION_CLASSES)
    assert metrics["accuracy"] == pytest.approx(accuracy_score(truth, predicted))
    assert metrics["macro_f1"] == pytest.approx(f1_score(truth, predicted, average="macro"))
    for c in PROGRESSION_CLASSES:
        recall = np.mean(predicted[truth == c] == c) if (truth == c).any() else np.nan
        assert metrics[f"accuracy/{c}"] == pytest.approx(recall, nan_ok=True)
    table = confusion(truth, predicted, PROGRESSION_CLASSES)
    assert np.array_equal(table.to_numpy(), confusion_matrix(truth, predicted, labels=list(PROGRESSION_CLASSES)))
    assert list(table.index) == list(table.columns) == list(PROGRESSION_CLASSES)
    assert (table.index.name, table.columns.name) == ("truth", "predicted")
    if len(drawn) < len(PROGRESSION_CLASSES):  # "resolved" is in neither: left out, not averaged in as 0
        counted_as_zero = f1_score(truth, predicted, labels=list(PROGRESSION_CLASSES), average="macro", zero_division=0)
        assert metrics["macro_f1"] > counted_as_zero
        assert table.loc["resolved"].sum() == table["resolved"].sum() == 0


def test_macro_f1_counts_a_class_predicted_but_never_true_as_zero():
    truth, predicted = ["new", "new", "stable"], ["new", "worse", "stable"]
    metrics = progression_metrics(truth, predicted, PROGRESSION_CLASSES)
    # new: P 1, R 1/2 -> 2/3; stable: 1; worse: 0 (predicted, never true); improved, resolved: left out.
    assert metrics["macro_f1"] == pytest.approx((2 / 3 + 1 + 0) / 3)
    assert metrics["macro_f1"] == pytest.approx(f1_score(truth, predicted, average="macro", zero_division=0))


def test_per_class_and_per_finding_accuracy_by_hand():
    truth = ["new", "new", "stable", "stable", "stable", "resolved"]
    predicted = ["new", "stable", "stable", "stable", "worse", "resolved"]
    findings = ["Edema", "Edema", "Effusion", "Effusion", "Effusion", "Effusion"]
    metrics = progression_metrics(truth, predicted, PROGRESSION_CLASSES, findings)
    assert metrics["accuracy"] == pytest.approx(4 / 6)
    assert metrics["accuracy/new"] == 0.5 and metrics["accuracy/stable"] == pytest.approx(2 / 3)
    assert metrics["accuracy/resolved"] == 1.0
    assert np.isnan(metrics["accuracy/worse"]) and np.isnan(metrics["accuracy/improved"])
    assert metrics["accuracy/Edema"] == 0.5 and metrics["accuracy/Effusion"] == 0.75
    assert "accuracy/Edema" not in progression_metrics(truth, predicted, PROGRESSION_CLASSES)


def test_metrics_edge_cases():
    empty = progression_metrics([], [], PRESENCE_CLASSES)
    assert all(np.isnan(v) for v in empty.values()) and set(empty) == {
        "accuracy", "macro_f1", "accuracy/new", "accuracy/persisting", "accuracy/resolved"
    }  # fmt: skip
    with pytest.raises(ValueError, match="outside"):
        progression_metrics(["new"], ["worse"], PRESENCE_CLASSES)
    with pytest.raises(ValueError, match="outside"):
        confusion(["new"], ["worse"], PRESENCE_CLASSES)
    with pytest.raises(ValueError, match="2 predictions"):
        progression_metrics(["new"], ["new", "new"], PRESENCE_CLASSES)
    with pytest.raises(ValueError, match="share a metric key"):
        progression_metrics(["new"], ["new"], PRESENCE_CLASSES, findings=["new"])
    assert isinstance(confusion([], [], PRESENCE_CLASSES), pd.DataFrame)


def test_majority_floor():
    train = ["stable", "new", "stable", "worse", "stable", "new"]
    floor = majority_floor(train, 4, PROGRESSION_CLASSES)
    assert floor.shape == (4,) and list(floor) == ["stable"] * 4
    tied = ["worse", "new", "new", "worse"]
    assert majority_floor(tied, 2, PROGRESSION_CLASSES)[0] == "new"  # first in class order
    assert majority_floor(tied, 2, ("worse", "new"))[0] == "worse"
    assert majority_floor(tied[::-1], 1)[0] == "new"  # default: CLASS_ORDER, whatever the training order
    assert majority_floor(["resolved", "persisting"], 1)[0] == "persisting"  # not alphabetical
    metrics = progression_metrics(["stable", "new"], majority_floor(train, 2, PROGRESSION_CLASSES), PROGRESSION_CLASSES)
    assert metrics["accuracy"] == 0.5
    with pytest.raises(ValueError, match="needs training labels"):
        majority_floor([], 3)


# ------------------------------------------------------------------------------------------------ out-of-fold


def test_out_of_fold_predicts_every_row_once_from_the_other_folds():
    folds = np.array([2, 0, 1, 0, 2, 1, 1])
    calls = []

    def fit_predict(train, rows):
        calls.append((train.tolist(), rows.tolist()))
        return np.array([f"fold {folds[r]} from {len(train)}" for r in rows])

    out = out_of_fold(folds, fit_predict)
    assert calls == [([0, 2, 4, 5, 6], [1, 3]), ([0, 1, 3, 4], [2, 5, 6]), ([1, 2, 3, 5, 6], [0, 4])]
    assert out.tolist() == ["fold 2 from 5", "fold 0 from 5", "fold 1 from 4", "fold 0 from 5", "fold 2 from 5",
                            "fold 1 from 4", "fold 1 from 4"]  # fmt: skip
    with pytest.raises(ValueError, match="no rows to fit on"):
        out_of_fold(np.zeros(3, int), fit_predict)
    with pytest.raises(ValueError, match=r"fold 0: \(1,\) predictions for 2 rows"):
        out_of_fold(folds, lambda train, rows: ["x"])
