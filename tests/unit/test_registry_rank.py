"""Ranking runs for the registry: chosen metric, then the challenge's tie-breaks, missing values last."""

from __future__ import annotations

import pytest

from apps.registry import TIE_BREAKS, Candidate, larger_is_better, rank


def _run(run_id: str, start: int = 0, **metrics: float) -> Candidate:
    return Candidate(run_id, start, {key.replace("__", "/"): value for key, value in metrics.items()})


def test_best_metric_first():
    runs = [_run("a", val__mAP=0.2), _run("b", val__mAP=0.4), _run("c", val__mAP=0.3)]
    assert [r.run_id for r in rank(runs, "val/mAP")] == ["b", "c", "a"]


def test_kept_checkpoint_value_wins_over_the_last_epoch():
    runs = [_run("a", val__mAP=0.5, val__mAP_best=0.5), _run("b", val__mAP=0.3, val__mAP_best=0.6)]
    assert rank(runs, "val/mAP")[0].run_id == "b"


@pytest.mark.parametrize(
    ("a", "b", "winner"),
    [
        ({"test__mAP": 0.30}, {"test__mAP": 0.31}, "b"),
        ({"test__mAP": 0.3, "test__mAUROC": 0.8}, {"test__mAP": 0.3, "test__mAUROC": 0.7}, "a"),
        ({"test__mAP": 0.3, "test__mAUROC": 0.8, "test__mF1": 0.2}, {"test__mAP": 0.3, "test__mAUROC": 0.8, "test__mF1": 0.25}, "b"),
        ({"test__mAP": 0.3, "test__mAUROC": 0.8, "test__mF1": 0.2, "test__mECE": 0.05},
         {"test__mAP": 0.3, "test__mAUROC": 0.8, "test__mF1": 0.2, "test__mECE": 0.04}, "b"),  # lower ECE wins
    ],
)  # fmt: skip
def test_tie_breaks_follow_the_challenge(a, b, winner):
    runs = [_run("a", 1, val__mAP=0.5, **a), _run("b", 2, val__mAP=0.5, **b)]
    assert rank(runs, "val/mAP")[0].run_id == winner


def test_full_tie_goes_to_the_earlier_run_and_missing_values_rank_last():
    runs = [_run("late", 5, val__mAP=0.5), _run("early", 1, val__mAP=0.5), _run("none", 0, test__mAP=0.9)]
    assert [r.run_id for r in rank(runs, "val/mAP")] == ["early", "late", "none"]


def test_lower_is_better_metrics():
    assert not larger_is_better("test/mECE") and not larger_is_better("val/loss_best")
    assert larger_is_better("val/proxy_ood_mAP")
    runs = [_run("a", test__mECE=0.1), _run("b", test__mECE=0.05)]
    assert rank(runs, "test/mECE")[0].run_id == "b"


def test_tie_breaks_are_the_challenge_chain_on_test():
    assert TIE_BREAKS == (("test/mAP", True), ("test/mAUROC", True), ("test/mF1", True), ("test/mECE", False),
                          ("test/mPrecision", True), ("test/mRecall", True))  # fmt: skip


EQUAL_TO_MECE = {"val__mAP": 0.5, "test__mAP": 0.3, "test__mAUROC": 0.8, "test__mF1": 0.2, "test__mECE": 0.05}


def test_ties_down_to_mean_recall():
    """Equal on the chosen metric and every earlier tie-break: mean recall decides, whatever the start order."""
    runs = [
        _run("low", 1, **EQUAL_TO_MECE, test__mPrecision=0.4, test__mRecall=0.30),
        _run("high", 3, **EQUAL_TO_MECE, test__mPrecision=0.4, test__mRecall=0.50),
        _run("mid", 2, **EQUAL_TO_MECE, test__mPrecision=0.4, test__mRecall=0.40),
        _run("missing", 0, **EQUAL_TO_MECE, test__mPrecision=0.4),
    ]
    assert [r.run_id for r in rank(runs, "val/mAP")] == ["high", "mid", "low", "missing"]


def test_mean_precision_decides_before_mean_recall():
    runs = [
        _run("recall", 1, **EQUAL_TO_MECE, test__mPrecision=0.40, test__mRecall=0.9),
        _run("precision", 2, **EQUAL_TO_MECE, test__mPrecision=0.45, test__mRecall=0.1),
    ]
    assert rank(runs, "val/mAP")[0].run_id == "precision"


def test_lower_ece_beats_better_precision_and_recall():
    runs = [
        _run("calibrated", 2, **{**EQUAL_TO_MECE, "test__mECE": 0.04}, test__mPrecision=0.1, test__mRecall=0.1),
        _run("sharp", 1, **EQUAL_TO_MECE, test__mPrecision=0.9, test__mRecall=0.9),
    ]
    assert rank(runs, "val/mAP")[0].run_id == "calibrated"


def test_directions_come_from_the_metric_registry():
    assert not larger_is_better("test/ECE_pooled") and not larger_is_better("val/mECE_best")
    assert larger_is_better("test/mPrecision") and larger_is_better("test/mRecall_best")
