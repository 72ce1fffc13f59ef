"""The contract a sampling strategy follows, so the data module never branches on its name."""

from __future__ import annotations

import numpy as np
from torch.utils.data import Sampler


class SamplingStrategy:
    """Builds the training sampler from the training labels.

    Returning ``None`` means plain shuffling. Under DDP the data module shares either out between ranks
    (:class:`training.samplers.distributed.TrainShardSampler`), so a strategy only has to draw the same list on
    every rank for the same ``(seed, epoch)`` and report its length.
    """

    def build(self, targets: np.ndarray, seed: int) -> Sampler | None:
        """Return the sampler for ``(N, C)`` targets (-1 = not labelled), or None for plain shuffling."""
        raise NotImplementedError
