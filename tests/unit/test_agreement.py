"""Reader agreement: the label kappa and the rating kappa against sklearn and by hand, majority votes by hand, the
bootstraps against a naive loop."""

from __future__ import annotations

import io
import warnings

import numpy as np
import pandas as pd
import pytest
from matplotlib.figure import Figure
from sklearn.metrics import cohen_kappa_score

from apps.benchmarks.reveal.agreement import (
    ALL_READERS,
    OVERALL,
    agreement_plot,
    bootstrap_counts,
    cohen_kappa,
    kappa_from_counts,
    leave_one_out,
    majority,
    model_agreement,
    pair_indicator,
    reader_agreement,
    verdicts,
)
from apps.benchmarks.reveal.ratings import (
    constant_majority,
    kappa_from_confusion,
    majority_rating,
    on_scale,
    others_rating,
    rating_agreement,
)
from evaluation.bootstrap import percentile_ci, resample_indices


def sk_kappa(a, b) -> float:
    """sklearn's kappa, NaN where it is undefined (it warns there)."""
    a, b = np.asarray(a), np.asarray(b)
    if a.size == 0:
        return float("nan")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return float(cohen_kappa_score(a, b, labels=[0, 1]))


def test_kappa_by_hand():
    a = np.array([1, 1, 1, 1, 1, 1, 0, 0, 0, 0])
    b = np.array([1, 1, 1, 1, 1, 0, 1, 0, 0, 0])
    # 2x2 (a rows, b columns): (0,0)=3, (0,1)=1, (1,0)=1, (1,1)=5; n=10.
    # po = (3+5)/10 = 0.8; P(a=1) = 0.6, P(b=1) = 0.6; pe = 0.6*0.6 + 0.4*0.4 = 0.52.
    # kappa = (0.8 - 0.52) / (1 - 0.52) = 0.28 / 0.48 = 7/12.
    assert cohen_kappa(a, b) == pytest.approx(7 / 12)
    # Opposite calls: (0,1)=2, (1,0)=2; po = 0, pe = 0.5*0.5 + 0.5*0.5 = 0.5; kappa = (0 - 0.5)/0.5 = -1.
    assert cohen_kappa(np.array([0, 0, 1, 1]), np.array([1, 1, 0, 0])) == pytest.approx(-1.0)
    # a constant 0, b constant 1: po = 0, pe = 1*0 + 0*1 = 0, kappa = 0.
    assert cohen_kappa(np.zeros(3, int), np.ones(3, int)) == pytest.approx(0.0)


def test_kappa_equals_sklearn_on_random_data():
    rng = np.random.default_rng(0)
    for trial in range(200):
        n = int(rng.integers(1, 40))
        a = (rng.random(n) < rng.random()).astype(int)
        b = np.where(rng.random(n) < rng.random(), a, 1 - a) if trial % 2 else (rng.random(n) < 0.3).astype(int)
        expected = sk_kappa(a, b)
        if np.isfinite(expected):
            assert cohen_kappa(a, b) == pytest.approx(expected, abs=1e-12)
        else:
            assert np.isnan(cohen_kappa(a, b))


@pytest.mark.parametrize("a, b", [([], []), ([1, 1, 1], [1, 1, 1]), ([0, 0], [0, 0])])
def test_kappa_is_nan_when_undefined(a, b):
    assert np.isnan(cohen_kappa(np.array(a, int), np.array(b, int)))
    assert np.isnan(sk_kappa(a, b))


def test_kappa_rejects_missing_reads_and_mismatched_lengths():
    with pytest.raises(ValueError):
        cohen_kappa(np.array([1, -1]), np.array([1, 0]))
    with pytest.raises(ValueError):
        cohen_kappa(np.array([1, 0]), np.array([1]))


def test_weighted_counts_equal_explicit_repetition():
    rng = np.random.default_rng(1)
    a = rng.integers(0, 2, 30)
    b = np.where(rng.random(30) < 0.7, a, 1 - a)
    weights = rng.integers(0, 4, 30)
    weighted = (pair_indicator(a, b) * weights[:, None]).sum(axis=0)
    assert kappa_from_counts(weighted) == pytest.approx(cohen_kappa(np.repeat(a, weights), np.repeat(b, weights)))


def test_bootstrap_counts_equal_counts_of_the_resampled_items():
    rng = np.random.default_rng(2)
    a, b = rng.integers(-1, 2, 25), rng.integers(-1, 2, 25)
    resamples = resample_indices(25, 50, seed=3)
    got = bootstrap_counts(resamples, pair_indicator(a, b))
    expected = np.stack([pair_indicator(a[idx], b[idx]).sum(axis=0) for idx in resamples])
    assert np.array_equal(got, expected)


# Five studies read by four readers; -1 = no read. Hand-made to hold every case.
READS = np.array([
    [1, 1, 0, -1],   # 2 pos, 1 neg -> 1
    [1, 0, -1, -1],  # 1 pos, 1 neg -> tie (-1)
    [0, 0, 0, 1],    # 1 pos, 3 neg -> 0
    [-1, -1, -1, -1],  # nobody read -> -1
    [1, 0, 0, 1],    # 2 pos, 2 neg -> tie (-1)
])  # fmt: skip


def test_majority_by_hand():
    assert majority(READS).tolist() == [1, -1, 0, -1, -1]
    # With a findings axis each finding is voted on its own: the second finding flips every read given.
    flipped = np.where(READS >= 0, 1 - READS, -1)
    assert majority(np.stack([READS, flipped], axis=2)).tolist() == [[1, 0], [-1, -1], [0, 1], [-1, -1], [-1, -1]]


def test_leave_one_out_by_hand():
    expected = np.array([
        # others of r0: (1,0,-1) -> tie; r1: (1,0) -> tie; r2: (1,1) -> 1; r3 did not read.
        [-1, -1, 1, -1],
        # r0: others (0) -> 0; r1: others (1) -> 1; r2 and r3 did not read.
        [0, 1, -1, -1],
        # r0: (0,0,1) -> 0; r1: same -> 0; r2: same -> 0; r3: (0,0,0) -> 0.
        [0, 0, 0, 0],
        [-1, -1, -1, -1],
        # r0: (0,0,1) -> 0; r1: (1,0,1) -> 1; r2: (1,0,1) -> 1; r3: (1,0,0) -> 0.
        [0, 1, 1, 0],
    ])  # fmt: skip
    assert leave_one_out(READS).tolist() == expected.tolist()


def test_votes_reject_codes_other_than_present_absent_blank():
    with pytest.raises(ValueError):
        majority(np.array([[1, 2]]))


def random_reads(n=40, readers=4, findings=3, seed=0):
    rng = np.random.default_rng(seed)
    truth = rng.random((n, 1, findings)) < 0.35
    flips = rng.random((n, readers, findings)) < 0.2
    reads = np.where(flips, ~truth, truth).astype(int)
    reads[rng.random(reads.shape) < 0.15] = -1
    return reads


def pairs(reader_reads: np.ndarray, reference: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    keep = (reader_reads >= 0) & (reference >= 0)
    return reader_reads[keep], reference[keep]


@pytest.fixture(scope="module")
def agreement():
    reads = random_reads()
    resamples = resample_indices(reads.shape[0], 60, seed=7)
    table = reader_agreement(reads, ["r0", "r1", "r2", "r3"], ["a", "b", "c"], resamples)
    return reads, resamples, table


def reference_of(reads: np.ndarray, kind: str) -> np.ndarray:
    """The reference each reader is compared with, built independently of the module's pooling."""
    if kind == "majority":
        return np.broadcast_to(majority(reads)[:, None, :], reads.shape)
    return leave_one_out(reads)


def row(table, reference, reader, finding):
    found = table[(table["reference"] == reference) & (table["reader"] == reader) & (table["finding"] == finding)]
    assert len(found) == 1
    return found.iloc[0]


def test_table_has_every_row(agreement):
    _, _, table = agreement
    assert len(table) == 2 * 5 * 4
    assert set(table["reader"]) == {"r0", "r1", "r2", "r3", ALL_READERS}
    assert set(table["finding"]) == {"a", "b", "c", OVERALL}


@pytest.mark.parametrize("kind", ["majority", "leave-one-out"])
def test_point_kappas_and_intervals_equal_a_naive_loop(agreement, kind):
    reads, resamples, table = agreement
    names = ["a", "b", "c"]

    def stacked(sample: np.ndarray, readers: list[int], findings: list[int]):
        ref = reference_of(sample, kind)
        got = [pairs(sample[:, r, k], ref[:, r, k]) for r in readers for k in findings]
        return np.concatenate([g[0] for g in got]), np.concatenate([g[1] for g in got])

    for r_name, readers in [*((f"r{r}", [r]) for r in range(4)), (ALL_READERS, [0, 1, 2, 3])]:
        for f_name, findings in [*((names[k], [k]) for k in range(3)), (OVERALL, [0, 1, 2])]:
            got = row(table, kind, r_name, f_name)
            a, b = stacked(reads, readers, findings)
            assert got["n"] == a.size
            assert got["kappa"] == pytest.approx(sk_kappa(a, b), nan_ok=True)
            replicates = [sk_kappa(*stacked(reads[idx], readers, findings)) for idx in resamples]
            low, high = percentile_ci(np.array(replicates), 0.95)
            assert (got["ci_low"], got["ci_high"]) == pytest.approx((low, high), nan_ok=True)


def test_blank_and_tie_counts_by_hand():
    reads = READS[:, :, None]
    table = reader_agreement(reads, ["r0", "r1", "r2", "r3"], ["x"], None)
    # Full majority [1, -1, 0, -1, -1]: reader r3 is blank on studies 0 and 1, of which only study 0 has a
    # majority -> n_blank 1; it read studies 2 and 4, and study 4 ties -> n_tie 1.
    r3 = row(table, "majority", "r3", "x")
    assert (r3["n_blank"], r3["n_tie"], r3["n"]) == (1, 1, 1)
    # r2 (majority): blank on study 1 (tie: not counted) and 3 (nobody) -> 0; read 0, 2, 4; 4 ties -> 1.
    r2 = row(table, "majority", "r2", "x")
    assert (r2["n_blank"], r2["n_tie"], r2["n"]) == (0, 1, 2)
    # Leave-one-out, r2: others' vote on study 1 is (1, 0) -> tie, so its blank there does not count -> 0;
    # others of r2 on studies 0, 2, 4 are 1, 0, 1 -> no tie.
    r2 = row(table, "leave-one-out", "r2", "x")
    assert (r2["n_blank"], r2["n_tie"], r2["n"]) == (0, 0, 3)
    # Leave-one-out, r3: blank on 0 (others 1, 1, 0 -> 1: counted), 1 (others tie) and 3 (nobody) -> 1;
    # read 2 (others 0) and 4 (others 1, 0, 0 -> 0), both defined -> no tie.
    r3 = row(table, "leave-one-out", "r3", "x")
    assert (r3["n_blank"], r3["n_tie"], r3["n"]) == (1, 0, 2)
    # Leave-one-out, r1: read 0 (others tie), 1 (others: r0 = 1 -> 1), 2, 4 -> one tie; no blank.
    r1 = row(table, "leave-one-out", "r1", "x")
    assert (r1["n_blank"], r1["n_tie"], r1["n"]) == (0, 1, 3)
    pooled = row(table, "leave-one-out", ALL_READERS, "x")
    per_reader = table[(table["reference"] == "leave-one-out") & (table["reader"] != ALL_READERS)]
    per_reader = per_reader[per_reader["finding"] == "x"]
    assert pooled["n_tie"] == per_reader["n_tie"].sum() and pooled["n"] == per_reader["n"].sum()
    assert np.isnan(row(table, "majority", "r0", "x")["ci_low"])  # no resamples, no interval


def test_model_is_scored_like_a_reader(agreement):
    reads, resamples, table = agreement
    # A "model" that copies reader r1 (blank where r1 is) scores r1's kappa against the same reference.
    reference = leave_one_out(reads)[:, 1, :]
    model = model_agreement(reads[:, 1, :], reference, resamples, ["a", "b", "c"])
    assert list(model["finding"]) == ["a", "b", "c", OVERALL]
    for finding in ["a", "b", "c", OVERALL]:
        got = model.set_index("finding").loc[finding]
        expected = row(table, "leave-one-out", "r1", finding)
        for column in ["n", "kappa", "ci_low", "ci_high", "n_tie"]:
            assert got[column] == pytest.approx(expected[column], nan_ok=True)


def test_verdicts_by_hand():
    readers = pd.DataFrame({
        "reference": "leave-one-out",
        "reader": ["r0", "r1", ALL_READERS] * 4 + ["r0"],
        "finding": ["a"] * 3 + ["b"] * 3 + ["c"] * 3 + ["d"] * 3 + ["a"],
        "kappa": [0.4, 0.6, 0.9, 0.4, 0.6, 0.5, 0.4, 0.6, 0.5, np.nan, np.nan, 0.5, 0.7],
    })  # fmt: skip
    readers.loc[len(readers) - 1, "reference"] = "majority"  # another reference's kappa must not widen the range
    model = pd.Series({"a": 0.5, "b": 0.3, "c": 0.8, "d": 0.5, "e": 0.5})
    got = verdicts(model, readers).set_index("finding")
    # a: readers 0.4 and 0.6 (the pool's 0.9 and the majority row's 0.7 are not readers' leave-one-out kappas).
    assert (got.loc["a", "reader_min"], got.loc["a", "reader_max"]) == (0.4, 0.6)
    assert got.loc["a", "verdict"] == "within the readers' range"
    for bound in (0.4, 0.6):  # the readers' extremes are inside their range
        assert verdicts(pd.Series({"a": bound}), readers).loc[0, "verdict"] == "within the readers' range"
    assert verdicts(pd.Series({"a": 0.65}), readers).loc[0, "verdict"] == "above the readers' range"
    assert got.loc["b", "verdict"] == "below the readers' range"
    assert got.loc["c", "verdict"] == "above the readers' range"
    assert got.loc["d", "verdict"] == "n/a"  # no reader has a defined kappa
    assert got.loc["e", "verdict"] == "n/a"  # no reader row at all
    assert got.loc["b", "n_readers"] == 2 and got.loc["d", "n_readers"] == 0


def test_plot_has_one_row_per_finding_and_overall(agreement):
    reads, resamples, table = agreement
    model = model_agreement(majority(reads), majority(reads), resamples, ["a", "b", "c"])
    fig = agreement_plot(table, model, "leave-one-out")
    assert isinstance(fig, Figure) and len(fig.axes) == 1
    assert [t.get_text() for t in fig.axes[0].get_yticklabels()] == ["a", "b", "c", OVERALL]
    assert "leave-one-out" in fig.axes[0].get_xlabel()
    fig.savefig(io.BytesIO(), format="png")  # renders without a display


# --- the readers' rating kappa (Agree all / Agree mostly / Disagree vs the majority rating) ----------------------
# ``THREE`` is the platform's three-level scale; the default, the paper's binary scale, has its own tests below.

# Five studies rated by three readers: 0 = Agree all, 1 = Agree mostly, 2 = Disagree. Study 4 has no majority.
RATED = np.array([[0, 0, 0], [0, 0, 1], [1, 1, 2], [2, 2, 0], [0, 1, 2]])
THREE = "three-level"
CARRIES = np.array([[False], [True], [True], [False], [True]])  # the studies that carry finding "x"


def sk_rating_kappa(ratings: np.ndarray, reference: np.ndarray, weights=None, sample_weight=None) -> float:
    """sklearn's kappa of every (rating, reference) pair with both present, NaN where it is undefined."""
    pairs = np.broadcast_to(reference[:, None], ratings.shape)
    keep = (ratings >= 0) & (pairs >= 0)
    if not keep.any():
        return float("nan")
    w = None if sample_weight is None else np.broadcast_to(sample_weight[:, None], ratings.shape)[keep]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return float(cohen_kappa_score(ratings[keep], pairs[keep], labels=[0, 1, 2], weights=weights,
                                       sample_weight=w))  # fmt: skip


def pooled_row(table: pd.DataFrame, finding: str, reference: str = "majority") -> pd.Series:
    return row(table, reference, ALL_READERS, finding)


def test_majority_and_others_rating_by_hand():
    assert majority_rating(RATED).tolist() == [0, 0, 1, 2, -1]
    # Study 1 (0, 0, 1): reader 0's others are (0, 1), a tie; reader 2's are (0, 0) -> 0. Study 4: always a tie.
    assert others_rating(RATED)[1].tolist() == [-1, -1, 0] and others_rating(RATED)[4].tolist() == [-1, -1, -1]
    # A blank rating neither votes nor is scored: (0, blank, 1) has no majority; (0, 0, blank) has 0.
    assert majority_rating(np.array([[0, -1, 1], [0, 0, -1]])).tolist() == [-1, 0]


def test_rating_kappa_by_hand_and_with_scikit_learn():
    table = rating_agreement(RATED, ["a", "b", "c"], CARRIES, ["x"], None, THREE)
    # Studies 0-3 against their majority (0, 0, 1, 2), all readers pooled: 12 pairs; study 4 (tie) is left out.
    # Confusion (rows reader, columns majority): [[5, 0, 1], [1, 2, 0], [0, 1, 2]]; margins r = c = (6, 3, 3).
    # po = 9/12 = 0.75; pe = (36 + 9 + 9) / 144 = 0.375; kappa = (0.75 - 0.375) / 0.625 = 0.6.
    overall = pooled_row(table, OVERALL)
    assert (overall["n"], overall["n_tie"]) == (12, 3)
    assert overall["kappa"] == pytest.approx(0.6)
    # Finding x (studies 1, 2; study 4 ties): confusion [[2, 0, 0], [1, 2, 0], [0, 1, 0]], r = (2, 3, 1),
    # c = (3, 3, 0); po = 4/6, pe = (6 + 9 + 0) / 36 = 15/36; kappa = (24 - 15) / (36 - 15) = 3/7.
    assert pooled_row(table, "x")["kappa"] == pytest.approx(3 / 7) and pooled_row(table, "x")["n"] == 6
    # Linear weights |i - j|: weighted disagreement 2 + 1 + 1 = 4; sum_ij |i - j| r_i c_j / n = 126 / 12 = 10.5;
    # kappa = 1 - 4 / 10.5 = 13/21.
    linear = rating_agreement(RATED, ["a", "b", "c"], CARRIES, ["x"], None, THREE, weights="linear")
    assert pooled_row(linear, OVERALL)["kappa"] == pytest.approx(13 / 21)
    reference = majority_rating(RATED)
    for weights, got in ((None, table), ("linear", linear)):
        assert pooled_row(got, OVERALL)["kappa"] == pytest.approx(sk_rating_kappa(RATED, reference, weights))
        assert pooled_row(got, "x")["kappa"] == pytest.approx(
            sk_rating_kappa(RATED[CARRIES[:, 0]], reference[CARRIES[:, 0]], weights))  # fmt: skip
    # The paper's binary scale: RATED becomes [[0,0,0], [0,0,1], [1,1,1], [1,1,0], [0,1,1]], majority (0,0,1,1,1),
    # no tie. Confusion [[5, 2], [1, 7]]: po = 12/15; r = (7, 8), c = (6, 9), pe = 114/225;
    # kappa = (180 - 114) / (225 - 114) = 22/37.
    binary = pooled_row(rating_agreement(RATED, ["a", "b", "c"], CARRIES, ["x"], None), OVERALL)
    assert (binary["n"], binary["n_tie"], binary["kappa"]) == (15, 0, pytest.approx(22 / 37))
    # One reader: reader c rates (0, 1, 2, 0) against (0, 0, 1, 2) -> sklearn's kappa of those four pairs.
    assert row(table, "majority", "c", OVERALL)["kappa"] == pytest.approx(
        cohen_kappa_score([0, 1, 2, 0], [0, 0, 1, 2], labels=[0, 1, 2]))  # fmt: skip


@pytest.mark.parametrize("weights", [None, "linear", "quadratic"])
def test_confusion_kappa_equals_scikit_learn_on_random_weighted_data(weights):
    rng = np.random.default_rng(5)
    for _ in range(100):
        n = int(rng.integers(2, 30))
        a = rng.integers(0, 3, n)
        b = np.where(rng.random(n) < 0.6, a, rng.integers(0, 3, n))
        w = rng.integers(0, 4, n).astype(float)
        w[0] = 1.0  # sklearn refuses all-zero weights
        counts = np.zeros((3, 3))
        np.add.at(counts, (a, b), w)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            expected = cohen_kappa_score(a, b, labels=[0, 1, 2], weights=weights, sample_weight=w)
        assert kappa_from_confusion(counts, weights) == pytest.approx(expected, nan_ok=True, abs=1e-12)
    assert np.isnan(kappa_from_confusion(np.diag([4.0, 0, 0])))  # both raters constant and identical
    assert np.isnan(kappa_from_confusion(np.zeros((3, 3))))
    with pytest.raises(ValueError, match="weights must be one of"):
        kappa_from_confusion(np.eye(3), "cubic")


def random_ratings(n=60, readers=3, findings=2, seed=0):
    rng = np.random.default_rng(seed)
    truth = rng.integers(0, 3, (n, 1))
    ratings = np.where(rng.random((n, readers)) < 0.7, truth, rng.integers(0, 3, (n, readers)))
    ratings[rng.random(ratings.shape) < 0.05] = -1
    return ratings, rng.random((n, findings)) < 0.4


def test_rating_kappa_intervals_contain_the_estimate_are_seeded_and_equal_a_naive_loop():
    ratings, carries = random_ratings()
    resamples = resample_indices(len(ratings), 200, seed=11)
    table = rating_agreement(ratings, ["a", "b", "c"], carries, ["f", "g"], resamples, THREE)
    again = rating_agreement(ratings, ["a", "b", "c"], carries, ["f", "g"], resample_indices(len(ratings), 200, 11),
                             THREE)  # fmt: skip
    pd.testing.assert_frame_equal(table, again)  # the same seed gives the same intervals
    other = rating_agreement(ratings, ["a", "b", "c"], carries, ["f", "g"], resample_indices(len(ratings), 200, 12),
                             THREE)  # fmt: skip
    assert not np.allclose(other["ci_low"], table["ci_low"], equal_nan=True)  # and another seed other intervals
    reference = majority_rating(ratings)
    for k, finding in enumerate(["f", "g", OVERALL]):
        got = pooled_row(table, finding)
        assert got["ci_low"] <= got["kappa"] <= got["ci_high"]
        keep = carries[:, k] if k < 2 else np.ones(len(ratings), bool)
        # each resample scored from scratch: the resampled studies with their (whole-sample) majority rating
        replicates = [sk_rating_kappa(ratings[idx][keep[idx]], reference[idx][keep[idx]]) for idx in resamples]
        assert (got["ci_low"], got["ci_high"]) == pytest.approx(percentile_ci(np.array(replicates), 0.95))
        multiplicity = np.bincount(resamples[0], minlength=len(ratings)).astype(float)
        first = rating_agreement(ratings, ["a", "b", "c"], carries, ["f", "g"], resamples[:1], THREE)
        assert pooled_row(first, finding)["ci_low"] == pytest.approx(
            sk_rating_kappa(ratings[keep], reference[keep], sample_weight=multiplicity[keep]))  # fmt: skip


def test_a_constant_majority_rating_gives_kappa_zero_by_construction():
    # Every study with at least two "Agree all" (how REVEAL-CXR kept its 200): the majority is always Agree all.
    kept = np.array([[0, 0, 0], [0, 0, 1], [0, 2, 0], [1, 0, 0], [0, 0, 0]])
    assert constant_majority(kept) == "agree all" and constant_majority(RATED) is None
    assert constant_majority(kept, THREE) == "agree all"
    for scale in ("binary", THREE):
        table = rating_agreement(kept, ["a", "b", "c"], np.ones((5, 1), bool), ["x"], None, scale)
        assert pooled_row(table, OVERALL)["kappa"] == pytest.approx(0.0)
        assert pooled_row(table, OVERALL)["kappa"] == pytest.approx(
            sk_rating_kappa(on_scale(kept, scale), majority_rating(kept, scale)))  # fmt: skip


def test_ratings_reject_codes_and_shapes_they_do_not_know():
    with pytest.raises(ValueError, match="coded 0..2"):
        majority_rating(np.array([[0, 3]]))
    with pytest.raises(ValueError, match="carries must be"):
        rating_agreement(RATED, ["a", "b", "c"], CARRIES[:3], ["x"], None)
    with pytest.raises(ValueError, match="scale must be one of"):
        rating_agreement(RATED, ["a", "b", "c"], CARRIES, ["x"], None, "five-level")


def swap_mostly_and_disagree(ratings: np.ndarray, readers: list[int]) -> np.ndarray:
    """``ratings`` with "Agree mostly" (1) and "Disagree" (2) exchanged in the columns of ``readers``."""
    swapped = ratings.copy()
    for r in readers:
        swapped[:, r] = np.select([ratings[:, r] == 1, ratings[:, r] == 2], [2, 1], ratings[:, r])
    return swapped


def test_the_binary_kappa_is_scikit_learns_on_the_merged_ratings_and_blind_to_a_mostly_disagree_swap():
    ratings, carries = random_ratings(n=80, seed=3)
    swapped = swap_mostly_and_disagree(ratings, [0, 2])
    assert (swapped != ratings).any()
    merged = np.where(ratings >= 0, np.minimum(ratings, 1), -1)  # Agree all = 0; Agree mostly, Disagree = 1
    assert np.array_equal(on_scale(ratings, "binary"), merged) and np.array_equal(on_scale(swapped, "binary"), merged)
    # the reference is the majority of the merged ratings: more than half of a study's raters on one side
    votes = np.stack([(merged == 0).sum(1), (merged == 1).sum(1)], axis=1)
    reference = np.where(2 * votes.max(1) > votes.sum(1), votes.argmax(1), -1)
    binary = {name: rating_agreement(r, ["a", "b", "c"], carries, ["f", "g"], None)
              for name, r in (("as rated", ratings), ("swapped", swapped))}  # fmt: skip
    for table in binary.values():
        assert pooled_row(table, OVERALL)["kappa"] == pytest.approx(sk_kappa(*pairs_of(merged, reference)))
        for r, reader in enumerate(["a", "b", "c"]):
            keep = (merged[:, r] >= 0) & (reference >= 0)
            assert row(table, "majority", reader, OVERALL)["kappa"] == pytest.approx(
                cohen_kappa_score(merged[keep, r], reference[keep]))  # fmt: skip
        keep_f = carries[:, 0]
        assert pooled_row(table, "f")["kappa"] == pytest.approx(sk_kappa(*pairs_of(merged[keep_f], reference[keep_f])))
    pd.testing.assert_frame_equal(binary["as rated"], binary["swapped"])
    three = {name: pooled_row(rating_agreement(r, ["a", "b", "c"], carries, ["f", "g"], None, THREE), OVERALL)["kappa"]
             for name, r in (("as rated", ratings), ("swapped", swapped))}  # fmt: skip
    assert three["as rated"] != pytest.approx(three["swapped"], abs=1e-3)  # the platform's scale sees the swap


def pairs_of(levels: np.ndarray, reference: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Every (rating, reference) pair with both present, all readers pooled."""
    wide = np.broadcast_to(reference[:, None], levels.shape)
    keep = (levels >= 0) & (wide >= 0)
    return levels[keep], wide[keep]
