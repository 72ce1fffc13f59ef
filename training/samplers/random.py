"""Uniform random sampling over images (the default)."""

from __future__ import annotations

from training.samplers.base import SamplingStrategy


class RandomSampling(SamplingStrategy):
    """Every image once per epoch in a shuffled order: the natural, long-tailed label distribution."""

    def build(self, targets, seed):
        return None
