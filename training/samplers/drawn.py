"""Shared machinery of samplers that draw a fresh index list every epoch."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
from torch.utils.data import Sampler


class EpochDrawSampler(Sampler[int]):
    """A sampler whose epoch is a seeded draw: ``draw(rng)`` returns this epoch's global index list.

    Epoch ``e``'s draw depends only on ``(seed, e)``, so a resumed run repeats its draws and every DDP rank draws the
    same list. The data module sets the epoch before each pass (Lightning's :meth:`set_epoch` comes too late in the
    first epoch of a resumed fit); each iteration also advances the epoch itself, so a caller that never sets it
    still gets a fresh draw per pass.
    """

    def __init__(self, seed: int):
        self.seed = int(seed)
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def draw(self, rng: np.random.Generator) -> np.ndarray:  # pragma: no cover - abstract
        raise NotImplementedError

    def __iter__(self) -> Iterator[int]:
        rng = np.random.default_rng([self.seed, self.epoch])
        indices = self.draw(rng)
        self.epoch += 1
        return iter(indices.tolist())


def positives(targets: np.ndarray) -> np.ndarray:
    """``(N, C)`` bool: labelled positive (missing labels, -1, count as not positive)."""
    return np.asarray(targets) == 1
