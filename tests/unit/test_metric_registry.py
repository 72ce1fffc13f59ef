"""The metric registry: every entry against a reference implementation, the challenge's chain, and that the suite
computes whatever is registered (a toy metric appears with its macro, CI and groups without touching suite.py)."""

import numpy as np
import pytest
from sklearn.metrics import (
    accuracy_score,
    average_precision_score,
    f1_score,
    precision_score,
    recall_score,
    roc_auc_score,
)

from evaluation.bootstrap import resample_indices
from evaluation.metric_registry import (
    BINARY,
    SUITE,
    BinaryMetric,
    ClassChunk,
    Registry,
    SuiteMetric,
    class_ap,
)
from evaluation.ranking import ClassPlan, counts_matrix
from evaluation.suite import compute_suite
from tests.unit.test_eval_metrics import hand_ece, resample_counts

TOL = 1e-12
CHALLENGE_CHAIN = ["mAP", "mAUROC", "mF1", "mECE", "mPrecision", "mRecall"]  # CXR-LT ranking rules


def at(metric, t):
    return lambda y, p: metric(y, (p >= t).astype(int), zero_division=0)


FIXED, VAL = 0.5, 0.37
REFERENCES = {  # per-class key -> reference on the labelled entries of one class
    "ap": average_precision_score,
    "auroc": roc_auc_score,
    "f1": at(f1_score, FIXED),
    "precision": at(precision_score, FIXED),
    "recall": at(recall_score, FIXED),
    "ece": hand_ece,
    "f1_valthr": at(f1_score, VAL),
    "precision_valthr": at(precision_score, VAL),
    "recall_valthr": at(recall_score, VAL),
}


def one_class(seed, n=120, decimals=None):
    rng = np.random.default_rng(seed)
    y = (rng.random(n) < 0.3).astype(int)
    p = np.clip(0.3 * y + 0.7 * rng.random(n), 0, 1)
    if decimals is not None:
        p = np.round(p, decimals)  # ties, some exactly at the thresholds
    y[:2] = [0, 1]
    y[rng.random(n) < 0.1] = -1
    return y, p


def chunk_of(y, p, counts=None):
    plan = ClassPlan.build(y, p, thresholds=(FIXED, VAL))
    counts_t, _ = counts_matrix(len(y), counts)
    return ClassChunk(plan, plan.stats(counts_t), FIXED, VAL)


# --- entries against reference implementations ---------------------------------------------------------------


def test_every_per_class_entry_has_a_reference():
    assert {m.key for m in SUITE.per_class(val_thresholds=True)} == set(REFERENCES)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("decimals", [None, 1, 2])
def test_per_class_entries_match_references(seed, decimals):
    y, p = one_class(seed, decimals=decimals)
    known = y >= 0
    chunk = chunk_of(y, p)
    for metric in SUITE.per_class(val_thresholds=True):
        got = metric.compute(chunk)
        assert got.shape == (1,)
        assert got[0] == pytest.approx(REFERENCES[metric.key](y[known], p[known]), abs=TOL), metric.name


def test_per_class_entries_on_resamples_equal_references_on_the_resampled_data():
    """The bootstrap's correctness: a count-weighted value equals the reference on the explicitly resampled data."""
    y, p = one_class(7, decimals=2)
    counts = resample_counts(len(y), 5, 2)
    rows = resample_indices(len(y), 5, seed=2)
    chunk = chunk_of(y, p, counts)
    for metric in SUITE.per_class(val_thresholds=True):
        got = metric.compute(chunk)
        for b, row in enumerate(rows):
            yb, pb = y[row], p[row]
            keep = yb >= 0
            assert got[b] == pytest.approx(REFERENCES[metric.key](yb[keep], pb[keep]), abs=TOL), metric.name


def test_a_class_without_a_positive_is_left_out_of_every_macro():
    y = np.array([0, 0, 0, -1, 0])
    p = np.array([0.1, 0.6, 0.4, 0.9, 0.5])
    chunk = chunk_of(y, p)
    for metric in SUITE.per_class(val_thresholds=True):
        assert np.isnan(metric.compute(chunk)).all(), metric.name


def test_ap_and_auroc_entries_share_one_ranking_pass():
    y, p = one_class(3)
    chunk = chunk_of(y, p)
    first = class_ap(chunk)
    assert class_ap(chunk) is first  # cached: splitting AP and AUROC into two entries costs no second pass


def test_pooled_ece_pools_every_labelled_pair():
    rng = np.random.default_rng(5)
    targets = (rng.random((90, 3)) < [0.5, 0.2, 0.1]).astype(int)
    probs = np.round(np.clip(0.3 * targets + 0.7 * rng.random(targets.shape), 0, 1), 2)
    targets[rng.random(targets.shape) < 0.1] = -1
    (pooled,) = SUITE.pooled()
    total = sum(pooled.compute(chunk_of(targets[:, c], probs[:, c])) for c in range(3))
    known = targets >= 0
    assert pooled.reduce(total)[0] == pytest.approx(hand_ece(targets[known], probs[known]), abs=TOL)


@pytest.mark.parametrize("seed", range(6))
def test_binary_entries_match_scikit_learn(seed):
    rng = np.random.default_rng(seed)
    labels = rng.random(70) < 0.4
    scores = np.round(rng.random(70) + 0.4 * labels, 1 if seed % 2 else 6)
    decisions = scores > 0.6
    references = {
        "auroc": roc_auc_score(labels, scores),
        "ap": average_precision_score(labels, scores),
        "accuracy": accuracy_score(labels, decisions),
        "sensitivity": recall_score(labels, decisions),
        "specificity": recall_score(labels, decisions, pos_label=0),
    }
    assert [m.name for m in BINARY] == ["auroc", "accuracy", "sensitivity", "specificity", "ap"]  # table order
    for metric in BINARY:
        assert metric.compute(labels, scores, decisions) == pytest.approx(references[metric.name], abs=TOL)


def test_binary_entries_are_nan_where_undefined():
    scores, decisions = np.array([0.2, 0.8, 0.5]), np.array([False, True, True])
    only_negatives = {m.name: m.compute(np.zeros(3, bool), scores, decisions) for m in BINARY}
    only_positives = {m.name: m.compute(np.ones(3, bool), scores, decisions) for m in BINARY}
    assert all(np.isnan(only_negatives[k]) for k in ("auroc", "ap", "sensitivity"))
    assert only_negatives["specificity"] == pytest.approx(1 / 3)
    assert all(np.isnan(only_positives[k]) for k in ("auroc", "specificity"))
    assert only_positives["ap"] == 1.0 and only_positives["sensitivity"] == pytest.approx(2 / 3)


# --- the challenge's chain, directions, registry rules ---------------------------------------------------------


def test_tie_break_chain_and_directions_follow_the_challenge():
    chain = SUITE.tie_break_chain()
    assert [m.name for m in chain] == CHALLENGE_CHAIN
    assert [m.tie_break for m in chain] == list(range(len(chain)))
    assert SUITE.lower_is_better() == {"mECE", "ECE_pooled"}  # calibration error: smaller wins
    assert all(m.higher_is_better for m in BINARY)


def test_names_and_keys_are_unique_and_headline_leaves_out_validation_thresholds():
    names = [m.name for m in SUITE]
    keys = [m.key for m in SUITE if m.per_class]
    assert len(set(names + keys)) == len(names) + len(keys)
    assert all(m.per_class == (m.key is not None) for m in SUITE)
    assert set(SUITE.headline()) == {m.name for m in SUITE if not m.name.endswith("_valthr")}
    assert SUITE.by_key("ap") is SUITE.by_key("mAP") is SUITE["mAP"]
    with pytest.raises(ValueError, match="unknown metric"):
        SUITE.by_key("nope")


def test_registry_refuses_clashes():
    ap = SUITE["mAP"]
    with pytest.raises(ValueError, match="already"):
        SUITE.add(ap)
    with pytest.raises(ValueError, match="already names or keys"):
        SUITE.add(SuiteMetric("mAP2", "x", class_ap, key="ap"))  # key clash
    with pytest.raises(ValueError, match="tie-break place"):
        SUITE.add(SuiteMetric("mAP2", "x", class_ap, key="ap2", tie_break=0))
    with pytest.raises(ValueError, match="exactly one"):
        SuiteMetric("both", "x", class_ap, key="b", reduce=np.sum)
    with pytest.raises(ValueError, match="exactly one"):
        SuiteMetric("neither", "x", class_ap)
    assert [m.name for m in SUITE.tie_break_chain()] == CHALLENGE_CHAIN  # nothing half-added


def test_registered_is_undone_even_on_error():
    registry = Registry((BinaryMetric("a", "A", lambda *_: 0.0),))
    with pytest.raises(RuntimeError), registry.registered(BinaryMetric("b", "B", lambda *_: 1.0)):
        assert [m.name for m in registry] == ["a", "b"]
        raise RuntimeError
    assert [m.name for m in registry] == ["a"] and "b" not in registry


# --- the suite computes what is registered ----------------------------------------------------------------------


def class_prevalence(chunk: ClassChunk) -> np.ndarray:
    """Toy per-class metric: the labelled positive fraction in each resample."""
    return chunk.stats.positives / chunk.stats.total


def positive_pairs(chunk: ClassChunk) -> np.ndarray:
    """Toy pooled metric, map step: positives and labelled pairs of one class."""
    return np.vstack([chunk.stats.positives, chunk.stats.total])


TOY = SuiteMetric("mPrevalence", "Prevalence", class_prevalence, key="prevalence")
TOY_POOLED = SuiteMetric("prevalence_pooled", "Pooled prevalence", positive_pairs, reduce=lambda s: s[0] / s[1])


@pytest.fixture
def toy_metrics():
    with SUITE.registered(TOY), SUITE.registered(TOY_POOLED):
        yield


@pytest.fixture
def split():
    rng = np.random.default_rng(11)
    targets = (rng.random((160, 4)) < [0.4, 0.1, 0.05, 0.3]).astype(int)
    targets[rng.random(targets.shape) < 0.1] = -1
    targets[:, 3] = -1  # no labelled entry: left out of every macro mean and the pooled value
    probs = np.clip(0.3 * targets + 0.7 * rng.random(targets.shape), 0, 1)
    return targets, probs, ["a", "b", "c", "d"]


def prevalence(t):
    known = t >= 0
    return (t == 1).sum(axis=0) / np.maximum(known.sum(axis=0), 1), known.any(axis=0)


def test_a_registered_metric_appears_in_the_suite_with_ci_and_groups(split, toy_metrics):
    targets, probs, labels = split
    groups = {"head": ["a", "d"], "tail": ["b", "c"]}
    result = compute_suite(targets, probs, labels, n_boot=40, seed=1, class_groups=groups)
    m = result.metrics
    per_class, labelled = prevalence(targets)
    assert m["mPrevalence"] == pytest.approx(per_class[labelled].mean(), abs=TOL)
    assert m["prevalence/a"] == pytest.approx(per_class[0], abs=TOL) and "prevalence/d" not in m
    assert m["mPrevalence_ci_low"] <= m["mPrevalence"] <= m["mPrevalence_ci_high"]
    assert m["mPrevalence_ci_low"] < m["mPrevalence_ci_high"]
    assert m["group/tail/mPrevalence"] == pytest.approx(per_class[[1, 2]].mean(), abs=TOL)
    assert "group/head/mPrevalence_ci_high" in m
    known = targets >= 0
    assert m["prevalence_pooled"] == pytest.approx((targets == 1).sum() / known.sum(), abs=TOL)
    assert m["prevalence_pooled_ci_low"] <= m["prevalence_pooled"] <= m["prevalence_pooled_ci_high"]
    for b, rows in enumerate(resample_indices(len(targets), 40, seed=1, stop=3)):  # replicates: resampled data
        resampled, _ = prevalence(targets[rows])
        assert result.replicates["prevalence"][b, :3] == pytest.approx(resampled[:3], abs=TOL)
    assert result.macro("mPrevalence", ["b"])[0] == pytest.approx(per_class[1], abs=TOL)


def test_registering_a_metric_changes_no_other_value(split):
    targets, probs, labels = split
    before = compute_suite(targets, probs, labels, n_boot=30, seed=2).metrics
    with SUITE.registered(TOY), SUITE.registered(TOY_POOLED):
        during = compute_suite(targets, probs, labels, n_boot=30, seed=2).metrics
    after = compute_suite(targets, probs, labels, n_boot=30, seed=2).metrics
    assert {k: v for k, v in during.items() if "revalence" not in k} == before == after
    assert "mPrevalence" in during and not any("revalence" in k for k in after)
