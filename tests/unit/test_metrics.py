"""Macro point metrics of the suite against sklearn, and the constant-predictor baseline."""

import numpy as np
import pytest
from sklearn.metrics import average_precision_score, roc_auc_score

from evaluation.metrics import prevalence_baseline_map
from evaluation.suite import compute_suite


def multilabel_summary(targets, probs, labels):
    return compute_suite(targets, probs, labels, n_boot=0).metrics


@pytest.fixture
def scored():
    rng = np.random.default_rng(3)
    targets = (rng.random((200, 5)) < [0.5, 0.2, 0.05, 0.0, 1.0]).astype(float)
    probs = np.clip(targets * 0.3 + rng.random((200, 5)) * 0.7, 0, 1)
    return targets, probs


def test_macro_means_skip_undefined_classes(scored):
    targets, probs = scored
    result = multilabel_summary(targets, probs, list("abcde"))
    aps = [average_precision_score(targets[:, c], probs[:, c]) for c in (0, 1, 2, 4)]  # d has no positive
    aurocs = [roc_auc_score(targets[:, c], probs[:, c]) for c in (0, 1, 2)]  # e has no negative
    assert result["mAP"] == pytest.approx(np.mean(aps), abs=1e-12)
    assert result["mAUROC"] == pytest.approx(np.mean(aurocs), abs=1e-12)
    assert "ap/d" not in result and "auroc/e" not in result and result["ap/e"] == pytest.approx(1.0)


def test_unlabelled_entries_are_ignored(scored):
    targets, probs = scored
    masked = targets.copy()
    masked[:50, 0] = -1
    result = multilabel_summary(masked, probs, list("abcde"))
    assert result["ap/a"] == pytest.approx(average_precision_score(targets[50:, 0], probs[50:, 0]))


def test_prevalence_baseline_is_the_map_of_a_constant_predictor(scored):
    targets, _ = scored
    constant = np.full(targets.shape, 0.5)
    assert prevalence_baseline_map(targets) == pytest.approx(
        multilabel_summary(targets, constant, list("abcde"))["mAP"]
    )


def test_headline_metrics_are_what_the_suite_logs(scored):
    """evaluate.MACROS and the report's headline rows come from the registry and name real suite outputs."""
    from evaluation.evaluate import MACROS
    from evaluation.report import HEADLINE

    targets, probs = scored
    metrics = compute_suite(targets, probs, list("abcde"), n_boot=20).metrics
    assert MACROS == HEADLINE
    assert {"mAP", "mAUROC", "mF1", "mPrecision", "mRecall", "mECE", "ECE_pooled"} <= set(MACROS)
    for name in MACROS:
        assert np.isfinite(metrics[name]) and metrics[f"{name}_ci_low"] <= metrics[name] <= metrics[f"{name}_ci_high"]
    assert not any(name.endswith("_valthr") for name in MACROS)  # only with validation thresholds
