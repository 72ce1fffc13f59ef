"""Task 2's unseen-class report: internal, external and pooled tests, each bootstrapped within source."""

from __future__ import annotations

import numpy as np
import pytest
from omegaconf import OmegaConf
from sklearn.metrics import average_precision_score

from evaluation.bootstrap import resample_indices
from evaluation.suite import compute_suite
from evaluation.unseen import configured_internal_source, summary_table, unseen_metrics, unseen_scopes
from tests.unit.test_eval_metrics import resample_counts

LABELS = ["Adenopathy", "Scoliosis", "Goiter"]


def scored(seed=0, n_a=40, n_b=25):
    """Two centres of unequal size whose scores separate the classes differently well."""
    rng = np.random.default_rng(seed)
    sources = np.array(["padchest"] * n_a + ["nih"] * n_b)
    targets = (rng.random((n_a + n_b, len(LABELS))) < 0.3).astype(float)
    targets[0, :], targets[n_a, :] = 1, 1  # every class has a positive in both centres
    targets[1, :], targets[n_a + 1, :] = 0, 0
    noise = np.where(sources[:, None] == "padchest", 0.3, 0.8)
    probs = np.clip(0.5 * targets + noise * rng.random(targets.shape), 0, 1)
    order = rng.permutation(len(sources))  # centres interleaved, as in a real test table
    return targets[order], probs[order], sources[order]


def test_stratified_resamples_keep_every_strata_count_and_draw_only_within_it():
    strata = np.array(list("aabbbbbcab"))
    indices = resample_indices(len(strata), 50, seed=4, strata=strata)
    counts = resample_counts(len(strata), 50, 4, strata)
    for name in "abc":
        members = strata == name
        np.testing.assert_array_equal(counts[:, members].sum(axis=1), members.sum())  # count kept in every resample
    assert (strata[indices] == np.sort(strata)).all()  # every draw for a stratum's slots is an image of that stratum
    for b, row in enumerate(indices):
        np.testing.assert_array_equal(np.bincount(row, minlength=len(strata)), counts[b])
    # The draws differ between resamples, and one stratum is exactly the unstratified bootstrap.
    assert len({tuple(r) for r in indices}) > 40
    np.testing.assert_array_equal(resample_counts(10, 7, 4, ["x"] * 10), resample_counts(10, 7, 4))


def test_strata_of_the_wrong_length_are_refused():
    with pytest.raises(ValueError, match="one label per item"):
        compute_suite(np.ones((4, 1)), np.ones((4, 1)), ["A"], n_boot=0, strata=["a", "b"])


def test_stratified_suite_ci_is_the_percentile_of_the_stratified_resamples():
    """Reference implementation: resample the rows within source, compute macro AP with scikit-learn."""
    targets, probs, sources = scored()
    result = compute_suite(targets, probs, LABELS, n_boot=60, seed=3, strata=sources)
    reference = []
    for rows in resample_indices(len(sources), 60, seed=3, strata=sources):
        y, p = targets[rows], probs[rows]
        aps = [average_precision_score(y[:, c], p[:, c]) for c in range(len(LABELS)) if y[:, c].any()]
        reference.append(np.mean(aps))
    np.testing.assert_allclose(np.nanmean(result.replicates["ap"], axis=1), reference, atol=1e-9)
    low, high = np.percentile(reference, [2.5, 97.5])
    assert result.metrics["mAP_ci_low"] == pytest.approx(low) and result.metrics["mAP_ci_high"] == pytest.approx(high)
    unstratified = compute_suite(targets, probs, LABELS, n_boot=60, seed=3)
    assert unstratified.metrics["mAP"] == result.metrics["mAP"]  # same point, other resamples
    assert unstratified.metrics["mAP_ci_low"] != result.metrics["mAP_ci_low"]


def test_internal_external_and_pooled_are_each_resampled_within_source():
    targets, probs, sources = scored()
    metrics = unseen_metrics(targets, probs, LABELS, sources, n_boot=40, seed=1, threshold=0.5, internal="padchest")
    for scope, centre in (("internal", "padchest"), ("external", "nih")):
        rows = sources == centre
        alone = compute_suite(targets[rows], probs[rows], LABELS, n_boot=40, seed=1).metrics
        for key in ("mAP", "mAP_ci_low", "mAP_ci_high", "mAUROC_ci_high"):
            assert metrics[f"test_unseen/{scope}/{key}"] == pytest.approx(alone[key]), (scope, key)
        assert metrics[f"test_unseen/{scope}/mAP"] == pytest.approx(metrics[f"test_unseen/source/{centre}/mAP"])
        # The known value: macro AP of that source's rows.
        expected = np.mean([average_precision_score(targets[rows, c], probs[rows, c]) for c in range(len(LABELS))])
        assert metrics[f"test_unseen/{scope}/mAP"] == pytest.approx(expected)
    pooled = compute_suite(targets, probs, LABELS, n_boot=40, seed=1, strata=sources).metrics
    for key in ("mAP", "mAP_ci_low", "mAP_ci_high", "mAUROC", "mAUROC_ci_low"):
        assert metrics[f"test_unseen/pooled/{key}"] == pytest.approx(pooled[key])
        assert metrics[f"test_unseen/{key}"] == pytest.approx(pooled[key])  # the flat figures are the pooled test
    assert {"test_unseen_random/internal/mAP", "test_unseen_random/external/mAUROC_ci_low"} <= set(metrics)
    assert "test_unseen/ap/Scoliosis" in metrics and "test_unseen/internal/ap/Scoliosis" not in metrics


def test_internal_is_the_configured_source_not_the_largest_one():
    targets, probs, sources = scored(n_a=20, n_b=50)  # nih is now the bigger centre
    metrics = unseen_metrics(targets, probs, LABELS, sources, n_boot=0, seed=1, threshold=0.5, internal="padchest")
    assert metrics["test_unseen/internal/mAP"] == metrics["test_unseen/source/padchest/mAP"]
    assert metrics["test_unseen/external/mAP"] == metrics["test_unseen/source/nih/mAP"]
    untold = unseen_metrics(targets, probs, LABELS, sources, n_boot=0, seed=1, threshold=0.5)
    assert not any("/internal/" in k or "/external/" in k for k in untold) and "test_unseen/pooled/mAP" in untold
    assert configured_internal_source(OmegaConf.create({"data": {"internal_source": "padchest"}})) == "padchest"
    assert configured_internal_source(OmegaConf.create({"data": {"internal_source": None}})) is None
    assert configured_internal_source(OmegaConf.create({"data": {}})) is None


def test_external_of_several_centres_keeps_each_centres_count():
    assert unseen_scopes(np.array(["a", "a"]), "a") == {}  # one centre: only the flat figures
    scopes = unseen_scopes(np.array(["a", "b", "c", "b"]), "a")
    assert {k: v.tolist() for k, v in scopes.items()} == {"pooled": [0, 1, 2, 3], "internal": [0],
                                                          "external": [1, 2, 3], "source/a": [0], "source/b": [1, 3],
                                                          "source/c": [2]}  # fmt: skip


def test_summary_names_the_internal_external_and_pooled_rows():
    targets, probs, sources = scored()
    metrics = unseen_metrics(targets, probs, LABELS, sources, n_boot=20, seed=1, threshold=0.5, internal="padchest")
    text = summary_table(metrics, LABELS, "padchest")
    rows = [
        line.split(" | ")[0].lstrip("| ") for line in text.splitlines() if line.startswith("| ") and "---" not in line
    ]
    assert rows == ["test set", "pooled (resampled within source)", "internal (padchest)", "external", "nih (external)",
                    "padchest (internal)"]  # fmt: skip
    assert f"| internal (padchest) | {metrics['test_unseen/internal/mAP']:.3f} [" in text
