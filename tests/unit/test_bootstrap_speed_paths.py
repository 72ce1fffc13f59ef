"""The packed-count bootstrap path of compute_suite gives the landed path's replicates (issue 31)."""

from __future__ import annotations

import numpy as np
import pytest

from evaluation.packed_counts import Packing
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
@pytest.mark.parametrize("stratified", [False, True])
def test_packed_path_equals_the_landed_path(seed, stratified):
    targets, probs, labels, strata = _data(seed)
    kwargs = dict(n_boot=37, seed=seed, val_thresholds=[0.3] * len(labels), strata=strata if stratified else None)
    _assert_same(
        compute_suite(targets, probs, labels, **kwargs), legacy_compute_suite(targets, probs, labels, **kwargs)
    )


@pytest.mark.parametrize("chunk", [1, 2, 5, 12, 37, 100])
def test_replicates_do_not_depend_on_the_chunk_size(chunk):
    targets, probs, labels, strata = _data(3)
    reference = legacy_compute_suite(targets, probs, labels, n_boot=37, strata=strata, chunk=7)
    _assert_same(compute_suite(targets, probs, labels, n_boot=37, strata=strata, chunk=chunk), reference)


@pytest.mark.parametrize(("n", "max_sum"), [(12, 150_000), (7, 10), (1, 5), (5, 2**25), (4, 2**40), (3, 2**62)])
def test_packing_round_trips_sums_at_the_lane_limit(n, max_sum):
    packing = Packing.for_sums(n, max_sum)
    assert 2**packing.bits > max_sum and packing.lanes * packing.bits <= 63
    rng = np.random.default_rng(n)
    counts = rng.integers(0, 4, size=(n, 30))
    counts[:, 0] = max_sum // 2  # two such rows summed reach max_sum - 1 or max_sum: no carry into the next lane
    packed = packing.pack(counts)
    np.testing.assert_array_equal(packing.unpack(packed), counts.T)
    np.testing.assert_array_equal(packing.unpack(packed[:2].sum(axis=0, keepdims=True)), counts[:, :2].sum(1)[None])
