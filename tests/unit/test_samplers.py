"""Samplers: class balance, hand-computed repeat factors, seeded determinism, disjoint DDP shares."""

import numpy as np
import pytest
from lightning.fabric.utilities.distributed import DistributedSamplerWrapper
from scipy.stats import chisquare

from training.samplers.class_aware import ClassAwareSampler, ClassAwareSampling
from training.samplers.repeat_factor import RepeatFactorSampler, repeat_factors


@pytest.fixture
def long_tailed():
    """Single-label-per-image targets with counts 500, 50, 5, 1 and one class never positive."""
    counts = [500, 50, 5, 1]
    rows = [np.eye(5)[c] for c, n in enumerate(counts) for _ in range(n)]
    return np.array(rows, dtype=np.float32)


def test_class_aware_draws_each_class_equally_often(long_tailed):
    sampler = ClassAwareSampler(long_tailed, num_samples=20_000, seed=0)
    drawn = np.array(list(sampler))
    per_class = long_tailed[drawn, :4].sum(axis=0)
    assert per_class.sum() == 20_000
    assert chisquare(per_class).pvalue > 0.001  # uniform over the four classes that have positives
    assert long_tailed[drawn, 4].sum() == 0


def test_class_aware_is_seeded_and_changes_each_epoch(long_tailed):
    a, b = ClassAwareSampler(long_tailed, 300, seed=1), ClassAwareSampler(long_tailed, 300, seed=1)
    first = list(a)
    assert first == list(b)
    assert list(a) != first  # next epoch draws anew
    a.set_epoch(0)
    assert list(a) == first  # ...and epoch 0 is reproducible (resume)


def test_class_aware_epoch_length_from_config(long_tailed):
    assert len(ClassAwareSampling(epoch_multiplier=2).build(long_tailed, 0)) == 2 * len(long_tailed)
    assert len(ClassAwareSampling(epoch_length=77).build(long_tailed, 0)) == 77


def test_repeat_factors_match_hand_computation():
    targets = np.array([[1, 0, 0], [1, 0, 0], [1, 1, 0], [1, 0, 0], [0, 0, 0], [1, 0, 0], [1, 0, 0], [1, 0, 0],
                        [1, 0, 0], [1, 0, -1]], dtype=np.float32)  # fmt: skip
    # f = (0.9, 0.1, 0.0); t = 0.4: class factors max(1, sqrt(0.4/f)) = (1, 2, capped huge but class 2 unused)
    factors = repeat_factors(targets, threshold=0.4)
    expected = np.ones(10)
    expected[2] = np.sqrt(0.4 / 0.1)
    np.testing.assert_allclose(factors, expected)


def test_repeat_factor_sampler_repeats_in_expectation():
    targets = np.array([[1, 0]] * 90 + [[0, 1]] * 10, dtype=np.float32)
    sampler = RepeatFactorSampler(targets, threshold=0.25, seed=0)  # rare factor sqrt(2.5) = 1.58
    counts = np.zeros(100)
    for _ in range(400):
        np.add.at(counts, list(sampler), 1)
    assert counts[:90].mean() / 400 == pytest.approx(1.0, rel=0.01)
    assert counts[90:].mean() / 400 == pytest.approx(np.sqrt(2.5), rel=0.03)
    twin = RepeatFactorSampler(targets, threshold=0.25, seed=0)
    twin.set_epoch(3)
    sampler.set_epoch(3)
    assert list(twin) == list(sampler)


@pytest.mark.parametrize("make", [lambda t: ClassAwareSampler(t, 401, seed=3),
                                  lambda t: RepeatFactorSampler(t, threshold=0.3, seed=3)])  # fmt: skip
def test_ranks_get_disjoint_shares_of_one_draw(long_tailed, make):
    """Under DDP Lightning wraps a custom sampler in DistributedSamplerWrapper; each rank builds its own copy."""
    world = 2
    ranks = [DistributedSamplerWrapper(make(long_tailed), num_replicas=world, rank=r, shuffle=True, seed=7)
             for r in range(world)]  # fmt: skip
    reference = make(long_tailed)
    for epoch in range(3):
        reference.set_epoch(epoch)
        draw = list(reference)
        shares = []
        for wrapped in ranks:
            wrapped.set_epoch(epoch)
            shares.append(list(wrapped))
        assert len(shares[0]) == len(shares[1]) == -(-len(draw) // world)
        # Together the ranks cover the epoch's draw exactly once (DistributedSampler pads odd lengths by one).
        combined = sorted(shares[0] + shares[1])
        assert len(combined) - len(draw) == len(draw) % world
        remaining = list(combined)
        for index in draw:
            remaining.remove(index)
        assert len(remaining) == len(draw) % world


def test_repeat_factor_epoch_length_is_fixed():
    targets = np.array([[1, 0]] * 90 + [[0, 1]] * 10, dtype=np.float32)
    sampler = RepeatFactorSampler(targets, threshold=0.25, seed=0)
    assert {len(list(sampler)) for _ in range(20)} == {len(sampler)}
