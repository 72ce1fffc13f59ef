"""Metrics engine (ranking, thresholds, calibration, bootstrap, suite) against scikit-learn and hand computations.

The weighted (count) versions are checked against scikit-learn on the explicitly resampled data: that equality is
what makes the fast bootstrap correct.
"""

import numpy as np
import pytest
from sklearn.metrics import average_precision_score, f1_score, precision_score, recall_score, roc_auc_score

from evaluation.bootstrap import (
    auto_chunk,
    iter_count_chunks,
    percentile_ci,
    resample_indices,
)
from evaluation.calibration import ece, pooled_ece
from evaluation.metric_registry import ClassChunk
from evaluation.ranking import ClassPlan, ap_auroc_weighted, average_precision, calibration_bin, counts_matrix, roc_auc
from evaluation.suite import compute_suite, group_metrics
from evaluation.thresholds import best_f1_threshold, f1_precision_recall_from_counts, select_thresholds

TOL = 1e-9


def hand_ece(y, p, n_bins=15):
    """ECE by the textbook formula, one bin at a time (bin 0 = [0, 1/15], then (lo, hi])."""
    y, p = np.asarray(y, float), np.asarray(p, float)
    edges = np.linspace(0, 1, n_bins + 1)
    total = 0.0
    for k in range(n_bins):
        members = (p <= edges[k + 1]) & ((p > edges[k]) | (k == 0))
        if members.any():
            total += members.sum() / len(p) * abs(y[members].mean() - p[members].mean())
    return total


def resample_counts(n_items, n_boot, seed, strata=None):
    """Counts of resamples ``0..n_boot-1`` in one chunk, as the suite draws them."""
    return next(iter_count_chunks(n_items, n_boot, seed, max(n_boot, 1), strata))[1]


def at_threshold(y, p, threshold, counts=None):
    """``(f1, precision, recall)``, each ``(b,)``, as the suite reads them (NaN where a resample has no positive)."""
    plan = ClassPlan.build(y, p, thresholds=(threshold,))
    counts_t, _ = counts_matrix(len(y), counts)
    return ClassChunk(plan, plan.stats(counts_t), threshold).at_threshold


def scalar(values):
    """The values of the one resample of a weight-free call, as floats."""
    return tuple(float(value[0]) for value in values)


def sk_prf(y, p, t):
    pred = (p >= t).astype(int)
    return (
        f1_score(y, pred, zero_division=0),
        precision_score(y, pred, zero_division=0),
        recall_score(y, pred, zero_division=0),
    )


def make_class(rng, n, prevalence, decimals=None, unlabelled=0.0):
    """Targets with -1 entries and scores correlated with them; ``decimals`` rounds scores to create ties."""
    y = (rng.random(n) < prevalence).astype(int)
    p = np.clip(0.35 * y + 0.65 * rng.random(n), 0, 1)
    if decimals is not None:
        p = np.round(p, decimals)
    y[rng.random(n) < unlabelled] = -1
    return y, p


def make_split(seed=0, n=300, prevalences=(0.4, 0.2, 0.08, 0.03, 0.01, 0.0)):
    rng = np.random.default_rng(seed)
    prevalences = np.asarray(prevalences)
    targets = (rng.random((n, len(prevalences))) < prevalences).astype(int)
    probs = np.clip(0.3 * targets + 0.7 * rng.random(targets.shape) ** 2, 0, 1)
    return targets, probs, [f"c{i}" for i in range(len(prevalences))]


# --- point metrics against scikit-learn ------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("decimals", [None, 1, 2])
def test_ap_auroc_match_sklearn_with_ties_and_unlabelled(seed, decimals):
    rng = np.random.default_rng(seed)
    y, p = make_class(rng, 80, prevalence=rng.uniform(0.05, 0.6), decimals=decimals, unlabelled=0.1)
    y[:2] = [0, 1]  # both classes present
    known = y >= 0
    ap, auroc = ap_auroc_weighted(y, p)
    assert ap == pytest.approx(average_precision_score(y[known], p[known]), abs=TOL)
    assert auroc == pytest.approx(roc_auc_score(y[known], p[known]), abs=TOL)


def test_degenerate_ranking_cases():
    # No positive: AP and AUROC undefined.
    ap, auroc = ap_auroc_weighted(np.zeros(5, int), np.linspace(0, 1, 5))
    assert np.isnan(ap) and np.isnan(auroc)
    # No negative: AP is 1, AUROC undefined.
    ap, auroc = ap_auroc_weighted(np.ones(4, int), np.array([0.1, 0.5, 0.5, 0.9]))
    assert ap == 1.0 and np.isnan(auroc)
    # All scores equal: AP = prevalence, AUROC = 0.5 (ties count half).
    y = np.array([1, 0, 0, 1, 0])
    assert average_precision(y, np.full(5, 0.3)) == pytest.approx(average_precision_score(y, np.full(5, 0.3)))
    assert average_precision(y, np.full(5, 0.3)) == pytest.approx(0.4)
    assert roc_auc(y, np.full(5, 0.3)) == pytest.approx(0.5)
    # A single positive tied with negatives.
    y, p = np.array([0, 0, 1, 0, 0, 0]), np.array([0.9, 0.4, 0.4, 0.4, 0.1, 0.0])
    assert average_precision(y, p) == pytest.approx(average_precision_score(y, p), abs=TOL)
    assert roc_auc(y, p) == pytest.approx(roc_auc_score(y, p), abs=TOL)
    # Unlabelled entries are excluded, not counted as negatives.
    y_masked = np.array([-1, 0, 1, 0, 0, -1])
    keep = y_masked >= 0
    assert roc_auc(y_masked, p) == pytest.approx(roc_auc_score(y_masked[keep], p[keep]), abs=TOL)
    # Everything unlabelled.
    assert np.isnan(average_precision(np.full(3, -1), np.array([0.1, 0.2, 0.3])))


@pytest.mark.parametrize("threshold", [0.5, 0.3, 0.0, 1.0])
def test_f1_precision_recall_match_sklearn(threshold):
    rng = np.random.default_rng(4)
    y, p = make_class(rng, 120, 0.3, decimals=1, unlabelled=0.1)  # decimals=1 puts scores exactly on 0.3 and 0.5
    known = y >= 0
    assert scalar(at_threshold(y, p, threshold)) == pytest.approx(sk_prf(y[known], p[known], threshold), abs=TOL)


def test_f1_conventions():
    # prob == threshold is positive.
    assert scalar(at_threshold(np.array([1, 0]), np.array([0.5, 0.2]), 0.5)) == (1.0, 1.0, 1.0)
    # No predicted positive: precision 0 (zero_division=0), recall 0, F1 0.
    assert scalar(at_threshold(np.array([1, 0, 1]), np.array([0.1, 0.2, 0.3]), 0.5)) == (0.0, 0.0, 0.0)
    # No positive at all: everything 0 from the counts; the suite then leaves the class out (NaN).
    assert f1_precision_recall_from_counts(0.0, 1.0, 0.0) == (0.0, 0.0, 0.0)
    assert all(np.isnan(at_threshold(np.array([0, 0]), np.array([0.9, 0.2]), 0.5)))


def test_ece_bin_edges():
    # bin 0 takes 0 and 1/15; each later bin is (lo, hi]; 1.0 is in the last bin.
    p = np.array([0.0, 1 / 15, np.nextafter(1 / 15, 1), 2 / 15, 0.5, 1.0])
    assert calibration_bin(p, 15).tolist() == [0, 0, 1, 1, 7, 14]
    assert calibration_bin(p, 15).tolist() == np.digitize(p, np.linspace(0, 1, 16)[1:-1], right=True).tolist()


@pytest.mark.parametrize("seed", range(4))
def test_ece_matches_hand_computation(seed):
    rng = np.random.default_rng(seed)
    y, p = make_class(rng, 200, 0.3, decimals=2, unlabelled=0.1)
    p[:4] = [0.0, 1 / 15, 1.0, 0.5]
    known = y >= 0
    assert ece(y, p) == pytest.approx(hand_ece(y[known], p[known]), abs=TOL)
    # Degenerate: all equal scores, a single bin.
    assert ece(np.array([1, 0, 0, 0]), np.full(4, 0.25)) == pytest.approx(0.0)
    assert ece(np.array([1, 1, 0, 0]), np.full(4, 0.2)) == pytest.approx(0.3)


def test_pooled_ece_pools_all_labelled_pairs():
    targets, probs, _ = make_split(seed=1, n=150)
    targets[::7, 1] = -1
    known = targets >= 0
    assert pooled_ece(targets, probs) == pytest.approx(hand_ece(targets[known], probs[known]), abs=TOL)


# --- weighted versions against scikit-learn on explicitly resampled data -----------------------------------------


@pytest.mark.parametrize("seed", range(5))
def test_weighted_metrics_equal_sklearn_on_resampled_data(seed):
    rng = np.random.default_rng(100 + seed)
    y, p = make_class(rng, 60, prevalence=0.25, decimals=1 if seed % 2 else None, unlabelled=0.1)
    indices = resample_indices(len(y), 6, seed)  # (6, 60)
    counts = resample_counts(len(y), 6, seed)
    ap, auroc = ap_auroc_weighted(y, p, counts)
    f1, precision, recall = at_threshold(y, p, 0.5, counts)
    calib = ece(y, p, counts)
    for b in range(6):
        yb, pb = y[indices[b]], p[indices[b]]
        keep = yb >= 0
        yb, pb = yb[keep], pb[keep]
        assert calib[b] == pytest.approx(hand_ece(yb, pb), abs=TOL)
        if yb.sum() == 0:
            assert np.isnan([ap[b], auroc[b], f1[b], precision[b], recall[b]]).all()
            continue
        assert (f1[b], precision[b], recall[b]) == pytest.approx(sk_prf(yb, pb, 0.5), abs=TOL)
        assert ap[b] == pytest.approx(average_precision_score(yb, pb), abs=TOL)
        if (yb == 0).any():
            assert auroc[b] == pytest.approx(roc_auc_score(yb, pb), abs=TOL)
        else:
            assert np.isnan(auroc[b])


def test_weighted_pooled_ece_equals_resampled():
    targets, probs, _ = make_split(seed=2, n=80)
    targets[::5, 0] = -1
    indices, counts = resample_indices(80, 3, 9), resample_counts(80, 3, 9)
    values = pooled_ece(targets, probs, counts)
    for b in range(3):
        t, p = targets[indices[b]], probs[indices[b]]
        assert values[b] == pytest.approx(hand_ece(t[t >= 0], p[t >= 0]), abs=TOL)


# --- bootstrap ------------------------------------------------------------------------------------------------------


def test_resamples_reproducible_and_seed_dependent():
    first, again, other = resample_indices(50, 20, 7), resample_indices(50, 20, 7), resample_indices(50, 20, 8)
    assert first.shape == (20, 50) and first.min() >= 0 and first.max() < 50
    np.testing.assert_array_equal(first, again)
    assert not np.array_equal(first, other)
    # Resample b is the b-th child of default_rng(seed), whatever range is asked for.
    children = np.random.default_rng(7).spawn(20)
    np.testing.assert_array_equal(first[13], children[13].integers(0, 50, size=50))
    np.testing.assert_array_equal(resample_indices(50, 20, 7, start=5, stop=9), first[5:9])
    counts = resample_counts(50, 20, 7)
    np.testing.assert_array_equal(counts, [np.bincount(row, minlength=50) for row in first])
    assert (counts.sum(axis=1) == 50).all()
    chunks = list(iter_count_chunks(50, 20, 7, chunk=6))
    assert [rows for rows, _ in chunks] == [slice(0, 6), slice(6, 12), slice(12, 18), slice(18, 20)]
    np.testing.assert_array_equal(np.vstack([c for _, c in chunks]), counts)
    assert auto_chunk(150_000, 1000) >= 1 and auto_chunk(1400, 1000) <= 1000


def test_percentile_ci():
    values = np.arange(1001, dtype=float)
    assert percentile_ci(values) == pytest.approx((25.0, 975.0))
    assert percentile_ci(np.append(values, [np.nan, np.nan])) == pytest.approx((25.0, 975.0))
    assert all(np.isnan(percentile_ci(np.full(4, np.nan))))
    with pytest.raises(ValueError, match="ci must be"):
        percentile_ci(values, ci=1.5)


# --- suite ----------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def split():
    targets, probs, labels = make_split(seed=5, n=300)
    targets[::11, 2] = -1
    return targets, probs, labels


@pytest.fixture(scope="module")
def suite(split):
    targets, probs, labels = split
    return compute_suite(targets, probs, labels, n_boot=300, seed=3, chunk=64)


def test_suite_point_values_match_sklearn(split, suite):
    targets, probs, labels = split
    m = suite.metrics
    aps, aurocs, f1s, precisions, recalls, eces = [], [], [], [], [], []
    for c, name in enumerate(labels):
        keep = targets[:, c] >= 0
        y, p = targets[keep, c], probs[keep, c]
        if y.sum() == 0:
            assert not any(f"{k}/{name}" in m for k in ("ap", "auroc", "f1", "precision", "recall", "ece"))
            continue
        aps.append(average_precision_score(y, p))
        aurocs.append(roc_auc_score(y, p))
        f1, precision, recall = sk_prf(y, p, 0.5)
        f1s.append(f1), precisions.append(precision), recalls.append(recall), eces.append(hand_ece(y, p))
        assert m[f"ap/{name}"] == pytest.approx(aps[-1], abs=TOL)
        assert m[f"auroc/{name}"] == pytest.approx(aurocs[-1], abs=TOL)
        assert m[f"f1/{name}"] == pytest.approx(f1, abs=TOL)
        assert m[f"ece/{name}"] == pytest.approx(eces[-1], abs=TOL)
    for key, values in [("mAP", aps), ("mAUROC", aurocs), ("mF1", f1s), ("mPrecision", precisions),
                        ("mRecall", recalls), ("mECE", eces)]:  # fmt: skip
        assert m[key] == pytest.approx(np.mean(values), abs=TOL)
    known = targets >= 0
    assert m["ECE_pooled"] == pytest.approx(hand_ece(targets[known], probs[known]), abs=TOL)


def test_suite_replicates_equal_sklearn_on_resampled_data(split, suite):
    """Resample b's macro values equal scikit-learn on the resampled images, leaving out classes without a positive."""
    targets, probs, labels = split
    indices = resample_indices(len(targets), suite.n_boot, seed=3, start=0, stop=4)
    for b in range(4):
        t, p = targets[indices[b]], probs[indices[b]]
        aps, f1s = [], []
        for c in range(len(labels)):
            keep = t[:, c] >= 0
            y, s = t[keep, c], p[keep, c]
            if y.sum() == 0:
                assert np.isnan(suite.replicates["ap"][b, c]) and np.isnan(suite.replicates["f1"][b, c])
                continue
            aps.append(average_precision_score(y, s))
            f1s.append(sk_prf(y, s, 0.5)[0])
            assert suite.replicates["auroc"][b, c] == pytest.approx(roc_auc_score(y, s), abs=TOL)
            assert suite.replicates["ece"][b, c] == pytest.approx(hand_ece(y, s), abs=TOL)
        assert np.nanmean(suite.replicates["ap"][b]) == pytest.approx(np.mean(aps), abs=TOL)
        assert np.nanmean(suite.replicates["f1"][b]) == pytest.approx(np.mean(f1s), abs=TOL)


def test_suite_cis_contain_point_and_are_reproducible(split, suite):
    targets, probs, labels = split
    m = suite.metrics
    for key in ("mAP", "mAUROC", "mF1", "mPrecision", "mRecall", "ECE_pooled"):
        assert m[f"{key}_ci_low"] <= m[key] <= m[f"{key}_ci_high"], key
        assert m[f"{key}_ci_low"] < m[f"{key}_ci_high"]
    assert m["mECE_ci_low"] < m["mECE_ci_high"]
    # Chunking does not change anything; another seed changes the CIs but not the point values.
    again = compute_suite(targets, probs, labels, n_boot=300, seed=3, chunk=7)
    assert again.metrics == pytest.approx(m, abs=1e-12)
    other = compute_suite(targets, probs, labels, n_boot=300, seed=4)
    assert other.metrics["mAP"] == m["mAP"] and other.metrics["mAP_ci_low"] != m["mAP_ci_low"]


@pytest.mark.parametrize("chunk", [1, 5, 12])
def test_stratified_replicates_do_not_depend_on_the_chunk_size(chunk):
    """Each resample is drawn from its own seed, so how resamples are cut into chunks changes no replicate (beyond
    the last bits: a sum over a chunk's columns may add in another order)."""
    targets, probs, labels = make_split(seed=6, n=120)
    targets[::7, 1] = -1
    strata = np.random.default_rng(6).choice(["nih", "padchest", "x"], size=len(targets))
    kwargs = dict(n_boot=37, seed=2, strata=strata, val_thresholds=[0.3] * len(labels))
    reference, result = (
        compute_suite(targets, probs, labels, **kwargs),
        compute_suite(targets, probs, labels, chunk=chunk, **kwargs),
    )
    assert set(result.replicates) == set(reference.replicates)
    for key, values in reference.replicates.items():
        np.testing.assert_allclose(result.replicates[key], values, rtol=0, atol=1e-12, err_msg=key)
    for key, values in reference.pooled_replicates.items():
        np.testing.assert_allclose(result.pooled_replicates[key], values, rtol=0, atol=1e-12, err_msg=key)


def test_group_metrics_reuse_the_resamples(split, suite):
    _, _, labels = split
    groups = {"head": [0, 1], "tail": ["c3", "c4", "c5"]}
    out = group_metrics(suite, groups)
    assert out["group/head/mAP"] == pytest.approx(np.mean([suite.metrics["ap/c0"], suite.metrics["ap/c1"]]))
    assert out["group/tail/mAP"] == pytest.approx(np.mean([suite.metrics["ap/c3"], suite.metrics["ap/c4"]]))
    tail = np.nanmean(suite.replicates["ap"][:, [3, 4, 5]], axis=1)
    assert (out["group/tail/mAP_ci_low"], out["group/tail/mAP_ci_high"]) == pytest.approx(percentile_ci(tail))
    assert suite.macro("mAP", [0, 1]) == pytest.approx(
        (out["group/head/mAP"], out["group/head/mAP_ci_low"], out["group/head/mAP_ci_high"])
    )
    assert "group/head/mECE_ci_high" in out


def test_suite_with_groups_and_val_thresholds():
    targets, probs, labels = make_split(seed=8, n=240)
    val_targets, val_probs, _ = make_split(seed=9, n=240)
    thresholds = select_thresholds(val_targets, val_probs)
    assert thresholds[-1] == 0.5  # no validation positive: fallback
    result = compute_suite(
        targets, probs, labels, n_boot=50, val_thresholds=thresholds, class_groups={"head": ["c0", "c1"]}
    )
    m = result.metrics
    f1s = [sk_prf(targets[:, c], probs[:, c], thresholds[c])[0] for c in range(5)]
    assert m["mF1_valthr"] == pytest.approx(np.mean(f1s), abs=TOL)
    assert m["f1_valthr/c0"] == pytest.approx(f1s[0], abs=TOL)
    assert {"mPrecision_valthr", "mRecall_valthr_ci_high", "group/head/mAP_ci_low"} <= set(m)
    mapping = compute_suite(targets, probs, labels, n_boot=0, val_thresholds=dict(zip(labels, thresholds, strict=True)))
    assert mapping.metrics["mF1_valthr"] == m["mF1_valthr"]
    assert not any(key.endswith("_ci_low") for key in mapping.metrics)


def test_best_f1_threshold_maximises_validation_f1():
    rng = np.random.default_rng(12)
    for _ in range(5):
        y, p = make_class(rng, 100, 0.2, decimals=2)
        t = best_f1_threshold(y, p)
        best = max(f1_score(y, (p >= s).astype(int), zero_division=0) for s in np.unique(p))
        assert f1_score(y, (p >= t).astype(int)) == pytest.approx(best, abs=TOL)
    # Midpoint between the last kept score and the next one.
    assert best_f1_threshold(np.array([1, 1, 0, 0]), np.array([0.9, 0.8, 0.4, 0.1])) == pytest.approx(0.6)
    assert best_f1_threshold(np.array([0, 0]), np.array([0.9, 0.8]), fallback=0.3) == 0.3


# --- input validation -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda t, p, lab: (t[:-1], p, lab), "does not match probs shape"),
        (lambda t, p, lab: (t, p, lab[:-1]), "labels for 3 columns"),
        (lambda t, p, lab: (t, np.where(np.arange(12).reshape(4, 3) == 7, np.nan, p), lab), "row 2, column 1"),
        (lambda t, p, lab: (t, np.where(np.arange(12).reshape(4, 3) == 5, np.inf, p), lab), "non-finite"),
        (lambda t, p, lab: (t, np.where(np.arange(12).reshape(4, 3) == 3, 1.5, p), lab), r"\[0, 1\]; row 1, column 0"),
        (lambda t, p, lab: (t, p - 0.7, lab), "must lie in"),
        (lambda t, p, lab: (np.where(np.arange(12).reshape(4, 3) == 11, 2, t), p, lab), "row 3, column 2"),
        (lambda t, p, lab: (t, p[:, 0], lab), "2-D"),
    ],
)  # fmt: skip
def test_invalid_inputs_raise(change, message):
    targets = np.array([[1, 0, -1], [0, 1, 0], [1, 1, 0], [0, 0, 1]])
    probs = np.full((4, 3), 0.6)
    with pytest.raises(ValueError, match=message):
        compute_suite(*change(targets, probs, ["a", "b", "c"]), n_boot=2)


def test_invalid_arguments_raise():
    targets, probs = np.array([[1, 0], [0, 1]]), np.full((2, 2), 0.5)
    with pytest.raises(ValueError, match="val_thresholds has 1 values"):
        compute_suite(targets, probs, ["a", "b"], n_boot=2, val_thresholds=[0.5])
    with pytest.raises(ValueError, match="no threshold for class 'b'"):
        compute_suite(targets, probs, ["a", "b"], n_boot=2, val_thresholds={"a": 0.5})
    with pytest.raises(ValueError, match="unknown class 'z'"):
        compute_suite(targets, probs, ["a", "b"], n_boot=2, class_groups={"g": ["z"]})
    with pytest.raises(ValueError, match="threshold must be"):
        compute_suite(targets, probs, ["a", "b"], threshold=1.5)
