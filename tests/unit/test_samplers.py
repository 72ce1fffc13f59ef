"""Samplers: class balance, hand-computed repeat factors, seeded determinism, disjoint DDP shares."""

import numpy as np
import pytest
from scipy.stats import chisquare
from torch.utils.data import DistributedSampler

from training.samplers.class_aware import ClassAwareSampler, ClassAwareSampling
from training.samplers.distributed import EvalShardSampler, TrainShardSampler
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


@pytest.mark.parametrize("make", [lambda t: None,
                                  lambda t: ClassAwareSampler(t, 401, seed=3),
                                  lambda t: RepeatFactorSampler(t, threshold=0.3, seed=3)])  # fmt: skip
def test_ranks_get_disjoint_shares_of_one_draw(long_tailed, make):
    """Each rank builds its own sampler (as each DDP process does); together they deal out one epoch's draw."""
    world = 2
    length = len(make(long_tailed) or long_tailed)
    ranks = [TrainShardSampler(make(long_tailed), length, world, rank, seed=7) for rank in range(world)]
    draws = []
    for epoch in range(3):
        shares = []
        for sampler in ranks:
            sampler.set_epoch(epoch)
            shares.append(list(sampler))
        reference = ranks[0].epoch_order()  # the whole draw, as any rank computes it
        assert len(shares[0]) == len(shares[1]) == len(ranks[0]) == length // world  # same step count per rank
        # Interleaving the shares gives back the draw position by position: disjoint, nothing repeated, and only
        # the odd last draw is left out.
        dealt = [index for pair in zip(*shares, strict=True) for index in pair]
        assert dealt == reference[: length - length % world]
        draws.append(reference)
    assert draws[0] != draws[1] != draws[2]  # a fresh draw each epoch
    if make(long_tailed) is None:  # plain shuffling: a permutation, so the shares are disjoint sets of images
        assert sorted(draws[0]) == list(range(length))
        assert not set(shares[0]) & set(shares[1])


@pytest.mark.parametrize("make", [lambda t: ClassAwareSampler(t, 401, seed=3),
                                  lambda t: RepeatFactorSampler(t, threshold=0.3, seed=3)])  # fmt: skip
def test_shared_draw_is_the_single_process_draw(long_tailed, make):
    """Sharding changes who sees a draw, not the draw: the epoch order is the sampler's own."""
    single = make(long_tailed)
    sharded = TrainShardSampler(make(long_tailed), len(single), 2, 1, seed=0)
    for epoch in (0, 4):
        single.set_epoch(epoch)
        sharded.set_epoch(epoch)
        assert list(sharded) == list(single)[1 : len(single) - len(single) % 2 : 2]


@pytest.mark.parametrize("length", [1, 2, 7, 81, 160])
@pytest.mark.parametrize("world", [1, 2, 3])
def test_eval_shards_cover_every_image_exactly_once(length, world):
    if length < world:
        with pytest.raises(ValueError, match="cannot be shared"):
            EvalShardSampler(length, world, 0)
        return
    shares = [list(EvalShardSampler(length, world, rank)) for rank in range(world)]
    assert sorted(index for share in shares for index in share) == list(range(length))  # no padding, no drop
    assert [len(EvalShardSampler(length, world, rank)) for rank in range(world)] == [len(s) for s in shares]
    assert max(map(len, shares)) - min(map(len, shares)) <= 1


def test_shard_samplers_reject_a_rank_outside_the_world():
    with pytest.raises(ValueError, match="rank 2 is not one of 2"):
        EvalShardSampler(10, 2, 2)
    with pytest.raises(ValueError, match="rank -1 is not one of 2"):
        TrainShardSampler(None, 10, 2, -1)
    with pytest.raises(ValueError, match="cannot be shared by 4"):
        TrainShardSampler(None, 3, 4, 0)


def test_lightning_leaves_the_shard_samplers_in_place():
    """Lightning only injects its (padding) DistributedSampler where a loader's sampler is not one already."""
    assert isinstance(EvalShardSampler(5, 2, 0), DistributedSampler)
    assert isinstance(TrainShardSampler(None, 5, 2, 0), DistributedSampler)


def test_repeat_factor_epoch_length_is_fixed():
    targets = np.array([[1, 0]] * 90 + [[0, 1]] * 10, dtype=np.float32)
    sampler = RepeatFactorSampler(targets, threshold=0.25, seed=0)
    assert {len(list(sampler)) for _ in range(20)} == {len(sampler)}
