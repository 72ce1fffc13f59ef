"""Class-aware sampling (Shen et al. 2016; the Distribution-Balanced loss paper's sampler)."""

from __future__ import annotations

import numpy as np

from training.samplers.base import SamplingStrategy
from training.samplers.drawn import EpochDrawSampler, positives


class ClassAwareSampler(EpochDrawSampler):
    """Pick a class uniformly, then an image holding it uniformly: every class is seen equally often.

    Multi-label images come along with all their other labels, so head classes still appear more than
    ``1/C`` of the time; that is the method, not a bug.
    """

    def __init__(self, targets: np.ndarray, num_samples: int, seed: int):
        super().__init__(seed)
        pos = positives(targets)
        self.classes = np.flatnonzero(pos.any(axis=0))  # classes with no positive cannot be drawn
        if len(self.classes) == 0:
            raise ValueError("class-aware sampling needs at least one positive label in the training split")
        members = [np.flatnonzero(pos[:, c]) for c in self.classes]
        self.counts = np.array([len(m) for m in members])
        self.starts = np.concatenate([[0], np.cumsum(self.counts)[:-1]])
        self.members = np.concatenate(members)
        self.num_samples = int(num_samples)

    def __len__(self) -> int:
        return self.num_samples

    def draw(self, rng):
        chosen = rng.integers(0, len(self.classes), self.num_samples)  # class slots, uniform
        offsets = np.floor(rng.random(self.num_samples) * self.counts[chosen]).astype(np.int64)
        return self.members[self.starts[chosen] + offsets]


class ClassAwareSampling(SamplingStrategy):
    """Config entry point. ``epoch_length``: draws per epoch, as a number or a multiple of the training set size."""

    def __init__(self, epoch_length: int | None = None, epoch_multiplier: float = 1.0):
        self.epoch_length = epoch_length
        self.epoch_multiplier = epoch_multiplier

    def build(self, targets, seed):
        length = self.epoch_length or int(round(len(targets) * self.epoch_multiplier))
        return ClassAwareSampler(targets, length, seed)
