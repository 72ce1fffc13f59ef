"""The contract a sampling strategy follows, so the data module never branches on its name."""

from __future__ import annotations

import numpy as np
from torch.utils.data import Sampler


class SamplingStrategy:
    """Builds the training sampler from the training labels.

    Returning ``None`` means plain shuffling, which Lightning turns into a ``DistributedSampler`` under DDP by
    itself; strategies that return a sampler must give each rank a disjoint share themselves.
    """

    def build(self, targets: np.ndarray, seed: int) -> Sampler | None:
        """Return the sampler for ``(N, C)`` targets (-1 = not labelled), or None for plain shuffling."""
        raise NotImplementedError
