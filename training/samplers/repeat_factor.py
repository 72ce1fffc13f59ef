"""Repeat-factor sampling (Gupta et al., LVIS 2019): oversample images that hold rare classes."""

from __future__ import annotations

import numpy as np

from training.samplers.base import SamplingStrategy
from training.samplers.drawn import EpochDrawSampler, positives


def repeat_factors(targets: np.ndarray, threshold: float, max_repeat: float | None = None) -> np.ndarray:
    """Per-image factor ``r_i = max over its classes of max(1, sqrt(t / f_c))``; 1 for images with no positive.

    ``max_repeat`` caps ``r_i``: a class in a handful of images would otherwise be repeated hundreds of times with a
    large ``t``, and an epoch would be mostly copies of the same few images.
    """
    pos = positives(targets)
    frequency = pos.mean(axis=0)  # (C,)
    class_factor = np.maximum(1.0, np.sqrt(threshold / np.maximum(frequency, 1e-12)))
    factors = np.where(pos, class_factor[None, :], 1.0).max(axis=1, initial=1.0)
    return factors if max_repeat is None else np.minimum(factors, float(max_repeat))


class RepeatFactorSampler(EpochDrawSampler):
    """Each epoch, image ``i`` appears ``floor(r_i)`` times plus once more with probability ``frac(r_i)``.

    The epoch length is fixed at ``round(sum(r_i))`` (a few draws trimmed or re-drawn) because DDP sharding needs
    every rank to agree on it in advance.
    """

    def __init__(self, targets: np.ndarray, threshold: float, seed: int, max_repeat: float | None = None):
        super().__init__(seed)
        self.factors = repeat_factors(targets, threshold, max_repeat)
        self.expected_length = int(round(self.factors.sum()))

    def __len__(self) -> int:
        return self.expected_length

    def draw(self, rng):
        whole = np.floor(self.factors)
        repeats = (whole + (rng.random(len(self.factors)) < self.factors - whole)).astype(np.int64)
        indices = rng.permutation(np.repeat(np.arange(len(self.factors)), repeats))
        deficit = self.expected_length - len(indices)
        if deficit > 0:
            indices = np.concatenate([indices, rng.choice(indices, deficit)])
        return indices[: self.expected_length]


class RepeatFactorSampling(SamplingStrategy):
    """Config entry point. ``threshold`` is LVIS's ``t``: classes rarer than it get oversampled; ``max_repeat``
    (``null``: no cap) the most times an image is expected to appear in an epoch."""

    def __init__(self, threshold: float = 0.1, max_repeat: float | None = None):
        if max_repeat is not None and max_repeat < 1:
            raise ValueError(f"sampler.max_repeat must be >= 1 or null, got {max_repeat}")
        self.threshold = threshold
        self.max_repeat = max_repeat

    def build(self, targets, seed):
        return RepeatFactorSampler(targets, self.threshold, seed, self.max_repeat)
