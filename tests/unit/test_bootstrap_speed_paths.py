"""The packed-count bootstrap path of compute_suite gives the landed path's replicates (issue 31)."""

from __future__ import annotations

import numpy as np
import pytest

from evaluation.packed_counts import CLIP, NARROW_BITS, ROW_IMAGES, LanePacking
from evaluation.ranking import ClassPlan, SuiteRanking, ap_auroc
from evaluation.suite import compute_suite
from tests.bench.legacy_suite import legacy_compute_suite


def _data(seed: int, n: int = 240, n_classes: int = 6):
    rng = np.random.default_rng(seed)
    targets = (rng.random((n, n_classes)) < np.linspace(0.02, 0.4, n_classes)).astype(np.int8)
    targets[rng.random((n, n_classes)) < 0.1] = -1  # unlabelled entries
    targets[:, 0] = np.where(targets[:, 0] == 1, 0, targets[:, 0])  # a class without a positive
    probs = np.round(rng.random((n, n_classes)), 2)  # ties
    strata = rng.choice(["nih", "padchest", "x"], size=n)
    return targets, probs, [f"c{c}" for c in range(n_classes)], strata


def _assert_same(new, old):
    assert set(new.replicates) == set(old.replicates)
    for key in old.replicates:
        np.testing.assert_allclose(new.replicates[key], old.replicates[key], rtol=0, atol=1e-12, equal_nan=True)
    for key in old.pooled_replicates:
        np.testing.assert_allclose(new.pooled_replicates[key], old.pooled_replicates[key], atol=1e-12, equal_nan=True)
    assert set(new.metrics) == set(old.metrics)
    for key, value in old.metrics.items():
        assert new.metrics[key] == pytest.approx(value, abs=1e-12, nan_ok=True), key


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("stratified", [False, True, "in image order"])
def test_packed_path_equals_the_landed_path(seed, stratified):
    targets, probs, labels, strata = _data(seed)
    if stratified == "in image order":  # one source after the other: columns are the images, nothing reordered
        strata = np.sort(strata)
    kwargs = dict(n_boot=37, seed=seed, val_thresholds=[0.3] * len(labels), strata=strata if stratified else None)
    _assert_same(
        compute_suite(targets, probs, labels, **kwargs), legacy_compute_suite(targets, probs, labels, **kwargs)
    )


@pytest.mark.parametrize("chunk", [1, 2, 5, 12, 37, 100])
def test_replicates_do_not_depend_on_the_chunk_size(chunk):
    targets, probs, labels, strata = _data(3)
    reference = legacy_compute_suite(targets, probs, labels, n_boot=37, strata=strata, chunk=7)
    _assert_same(compute_suite(targets, probs, labels, n_boot=37, strata=strata, chunk=chunk), reference)


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_replicates_do_not_depend_on_the_threads(threads):
    """Chunks evaluated on several threads at once (clipped counts included) give the landed replicates."""
    targets, probs, labels, strata = _data(4, n=90)
    reference = legacy_compute_suite(targets, probs, labels, n_boot=41, strata=strata, chunk=7)
    result = compute_suite(targets, probs, labels, n_boot=41, strata=strata, chunk=3, threads=threads)
    _assert_same(result, reference)


def test_threads_must_be_positive():
    targets, probs, labels, _ = _data(0, n=20)
    with pytest.raises(ValueError, match="threads must be a positive integer"):
        compute_suite(targets, probs, labels, n_boot=5, threads=0)


@pytest.mark.parametrize(("n", "n_items"), [(36, 150_000), (7, 10), (1, 5), (20, 240), (5, 2**22), (3, 2**40)])
def test_lane_packing_sums_exactly_at_the_lane_limits(n, n_items):
    packing = LanePacking.for_sums(n_items)
    assert 2**packing.bits > n_items and (packing.per_group - 1) * packing.spacing + packing.bits <= 63
    assert packing.lanes * NARROW_BITS <= 63
    rng = np.random.default_rng(n)
    counts = rng.integers(0, CLIP + 1, size=(n, 4 * ROW_IMAGES))
    counts[:, :ROW_IMAGES] = CLIP  # a full row at the narrow limit: ROW_IMAGES * CLIP < 2**7
    rows = np.arange(4 * ROW_IMAGES) // ROW_IMAGES  # four rows of ROW_IMAGES images
    narrow = np.zeros((4, packing.width(n)), dtype=np.int64)
    np.add.at(narrow, rows, packing.pack(counts))  # what the sparse product sums
    order = np.argsort(packing.column_resamples(packing.width(n)))  # column of each resample
    unpacked = packing.unpack(packing.rows(packing.widen(narrow), slice(None)))[:, order]
    np.testing.assert_array_equal(unpacked[:, :n].T, counts.reshape(n, 4, ROW_IMAGES).sum(axis=2))
    # prefix sums up to n_items - 1 (every sum of one resample's counts is at most its n_items draws)
    sums = rng.integers(0, n_items // 4 + 1, size=(n, 4))
    sums[:, 0] = n_items - 1 - sums[:, 1:].sum(axis=1)
    planes = np.zeros((packing.group, 4, packing.width(n)), dtype=np.int64)
    for r in range(n):
        lane = r % packing.lanes
        planes[lane % packing.group, :, r // packing.lanes] += sums[r] << (lane // packing.group * packing.spacing)
    prefix = packing.unpack(packing.rows(np.cumsum(planes, axis=1), slice(None)))[:, order]
    np.testing.assert_array_equal(prefix[:, :n].T, np.cumsum(sums, axis=1))


def test_counts_above_the_clip_are_added_back():
    """A count above CLIP (rare with Poisson(1) draws) is cut in the packed copy and added back exactly."""
    targets, probs, labels, strata = _data(5, n=60)
    counts = np.random.default_rng(0).integers(0, 3, size=(4, 60))
    counts[1, 7], counts[3, 20] = 40, CLIP + 1
    ranking = SuiteRanking(targets, probs, [(0.5,)] * len(labels), np.arange(60))
    chunk = ranking.chunk(counts.copy())  # clips its argument in place
    for c, layout in enumerate(ranking.layouts):
        plan = ClassPlan.build(targets[:, c], probs[:, c], thresholds=(0.5,))
        reference = plan.stats(np.ascontiguousarray(counts.T, dtype=np.float64))
        full = chunk.stats(c, reference.residual)
        np.testing.assert_array_equal(full.neg_cum, reference.neg_cum)
        np.testing.assert_array_equal(full.tp_cum, reference.tp_cum)
        np.testing.assert_array_equal(chunk.positives[c], reference.positives)
        assert layout.n_groups == plan.n_groups and layout.n_segments == plan.n_segments
        for new, old in zip(chunk.ap_auroc(c), ap_auroc(plan, reference), strict=True):  # AP/AUROC see it too
            np.testing.assert_allclose(new, old, rtol=0, atol=1e-12, equal_nan=True)


def test_ap_sums_follow_the_landed_one_resample_chunks(monkeypatch):
    """Above ~0.5M images the landed default chunk held one resample, and einsum sums a (G, 1) pair in another order
    than the columns of a (G, b) pair: the default path then sums each resample alone, and agrees bit for bit."""
    import evaluation.suite as suite
    import tests.bench.legacy_suite as legacy

    targets, probs, labels, strata = _data(4, n=400)
    monkeypatch.setattr(suite, "LANDED_CHUNK_BYTES", 8 * 400)  # as if N were past the landed one-resample limit
    monkeypatch.setattr(legacy, "auto_chunk", lambda n_items, n_boot: 1)
    new = compute_suite(targets, probs, labels, n_boot=20, strata=strata)
    old = legacy_compute_suite(targets, probs, labels, n_boot=20, strata=strata)
    for key in old.replicates:
        np.testing.assert_array_equal(new.replicates[key], old.replicates[key], err_msg=key)
