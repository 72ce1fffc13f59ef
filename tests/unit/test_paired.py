"""The paired bootstrap of ``make compare`` (evaluation.paired, evaluation.comparison, evaluation.paired_data).

Checked against a plain loop written here (scikit-learn's AP/AUROC on explicitly resampled rows, the same
resample indices), hand-computed Holm and p-values, and the known cases: a run against itself, a run with one
class's scores flipped, and runs whose test sets differ.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from sklearn.metrics import average_precision_score, roc_auc_score

from evaluation.bootstrap import resample_indices
from evaluation.comparison import Settings, compare
from evaluation.paired import bootstrap_p_value, holm, seed_noise, smallest_holm_p
from evaluation.paired_data import DifferentTestSets, align

LABELS = ["a", "b", "c", "d"]
N = 120


def _targets(seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return (rng.random((N, len(LABELS))) < [0.4, 0.25, 0.15, 0.06]).astype(int)


def _probs(targets: np.ndarray, seed: int, signal: float = 0.3) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.clip(targets * signal + rng.random(targets.shape) * (1 - signal), 0, 1)


def _frame(targets: np.ndarray, probs: np.ndarray, sources=None, ids=None) -> pd.DataFrame:
    frame = pd.DataFrame(probs, columns=LABELS)
    frame.insert(0, "image_id", ids if ids is not None else [f"img{i:03d}" for i in range(len(probs))])
    frame["source"] = sources if sources is not None else np.where(np.arange(len(probs)) % 3 == 0, "x", "y")
    for k, label in enumerate(LABELS):
        frame[f"true/{label}"] = targets[:, k]
    return frame


def test_p_value_hand_cases():
    assert bootstrap_p_value(np.zeros(99)) == 1.0  # d == 0 everywhere: both tails hold every resample
    assert bootstrap_p_value(np.arange(1.0, 10.0)) == pytest.approx(2 * 1 / 10)  # all 9 above 0: 2 (0+1)/(9+1)
    # 3 of 9 at or below 0, 6 at or above: 2 (3 + 1) / 10; NaN dropped before counting
    assert bootstrap_p_value(np.array([-2, -1, 0.0, 1, 2, 3, 4, 5, 6, np.nan])) == pytest.approx(0.8)
    assert np.isnan(bootstrap_p_value(np.full(5, np.nan)))


def test_holm_against_a_hand_computed_case():
    # sorted: 0.005 (x4), 0.01 (x3), 0.03 (x2), 0.04 (x1) -> 0.02, 0.03, 0.06, max(0.06, 0.04) = 0.06
    adjusted = holm([0.01, 0.04, 0.03, 0.005, np.nan])
    np.testing.assert_allclose(adjusted[:4], [0.03, 0.06, 0.06, 0.02])
    assert np.isnan(adjusted[4])
    np.testing.assert_allclose(holm([0.5, 0.9]), [1.0, 1.0])  # capped at 1
    assert smallest_holm_p(999, 30) == pytest.approx(0.06)  # why make compare defaults to more resamples


def _loop_metric(score, targets: np.ndarray, probs: np.ndarray, rows: np.ndarray) -> float:
    """Macro over the classes defined in this resample, computed from the resampled rows themselves."""
    values = []
    for k in range(targets.shape[1]):
        y, p = targets[rows, k], probs[rows, k]
        if y.sum() > 0 and (score is average_precision_score or y.min() == 0):
            values.append(score(y, p))
    return float(np.mean(values)) if values else np.nan


def test_paired_bootstrap_equals_a_plain_loop_over_the_same_resamples():
    """Seeds included: entry A has two seeds, B one; the loop adds the documented between-seed term itself."""
    targets = _targets()
    a1, a2, b = _probs(targets, 1), _probs(targets, 2), _probs(targets, 3, signal=0.4)
    sources = np.where(np.arange(N) % 3 == 0, "x", "y")
    data = align({"a1": _frame(targets, a1), "a2": _frame(targets, a2), "b": _frame(targets, b)})
    settings = Settings(n_boot=50, seed=7)
    result = compare(data, {"A": ["a1", "a2"], "B": ["b"]}, settings=settings).pairs.set_index("metric")

    indices = resample_indices(N, settings.n_boot, settings.seed, strata=sources)  # (B, N): the rules' draws
    noise = seed_noise(settings.n_boot, settings.seed)
    for name, score in (("mAP", average_precision_score), ("mAUROC", roc_auc_score)):
        points = [_loop_metric(score, targets, p, np.arange(N)) for p in (a1, a2, b)]
        spread = np.sqrt(np.var(points[:2], ddof=1) / 2)
        draws = []
        for row, rows in enumerate(indices):
            a_mean = np.mean([_loop_metric(score, targets, a1, rows), _loop_metric(score, targets, a2, rows)])
            draws.append(_loop_metric(score, targets, b, rows) - a_mean + noise[row] * spread)
        draws = np.array(draws)
        assert result.at[name, "difference"] == pytest.approx(points[2] - np.mean(points[:2]), abs=1e-12)
        low, high = np.percentile(draws, [2.5, 97.5])
        assert result.at[name, "ci_low"] == pytest.approx(low, abs=1e-12)
        assert result.at[name, "ci_high"] == pytest.approx(high, abs=1e-12)
        tail = min((draws <= 0).sum(), (draws >= 0).sum())
        assert result.at[name, "p"] == pytest.approx(min(1.0, 2 * (tail + 1) / (len(draws) + 1)))


def test_a_run_against_itself_differs_by_zero_with_p_one():
    targets = _targets()
    probs = _probs(targets, 1)
    data = align({"r": _frame(targets, probs), "same": _frame(targets, probs)})
    comparison = compare(data, {"A": ["r"], "A again": ["same"]}, settings=Settings(n_boot=200))
    pairs = comparison.pairs
    assert (pairs["difference"] == 0).all() and (pairs["ci_low"] == 0).all() and (pairs["ci_high"] == 0).all()
    assert (pairs["p"] == 1).all() and (pairs["p_holm"] == 1).all() and not pairs["significant"].any()
    assert comparison.verdict() == ["A again vs A: tied on mAP, mAUROC, mF1, mECE, mPrecision, mRecall"]


def test_a_flipped_class_is_the_only_significant_class():
    targets = _targets()
    probs = _probs(targets, 1, signal=0.5)
    flipped = probs.copy()
    flipped[:, 0] = 1 - flipped[:, 0]  # class "a" ranked backwards, the others untouched
    data = align({"r": _frame(targets, probs), "f": _frame(targets, flipped)})
    comparison = compare(data, {"A": ["r"], "F": ["f"]}, settings=Settings(n_boot=400))
    table = comparison.per_class.set_index("class")
    assert table.at["a", "F mark"] == "worse" and table.at["a", "F p_holm"] < 0.05
    for label in LABELS[1:]:
        assert table.at[label, "F mark"] == "" and table.at[label, "F p_holm"] == 1.0
        assert table.at[label, "F - A"] == 0.0
    assert table.loc[LABELS, "support"].tolist() == targets.sum(axis=0).tolist()
    assert comparison.pairs.set_index("metric").at["mAP", "better"] == "A"


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda f: f.assign(image_id=f["image_id"].where(f.index != 5, "new")), "tested on different images: 1 only"),
        (lambda f: f.assign(**{"true/b": 1 - f["true/b"]}), "same images but different labels in 120 cell"),
        (lambda f: f.assign(source="x"), "different sources"),
        (lambda f: f.drop(columns=["true/d"]), "predict different classes"),
        (lambda f: f.drop(columns=["source"]), "records the source of each test image"),
    ],
)
def test_runs_scored_on_different_test_sets_are_refused_with_the_reason(change, message):
    targets = _targets()
    frame = _frame(targets, _probs(targets, 1))
    with pytest.raises(DifferentTestSets, match=message):
        align({"run A": frame, "run B": change(frame.copy())})


def test_rows_are_matched_by_image_id_not_by_order():
    targets = _targets()
    probs = _probs(targets, 1)
    frame = _frame(targets, probs)
    shuffled = frame.sample(frac=1.0, random_state=0)
    data = align({"r": frame, "s": shuffled})
    np.testing.assert_array_equal(data.probs["r"], data.probs["s"])
    assert data.strata is not None and set(data.strata) == {"x", "y"}
