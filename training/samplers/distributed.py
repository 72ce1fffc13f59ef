"""Per-rank samplers for DDP: disjoint training shares and evaluation shares without padding.

Both subclass ``DistributedSampler`` only so that Lightning recognises them as already distributed and leaves them
alone; Lightning's own replacement pads evaluation splits with repeated images (biasing validation metrics) and
wraps training samplers with padding too.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch.utils.data import DistributedSampler, Sampler


def _check_rank(num_replicas: int, rank: int) -> None:
    if num_replicas < 1 or not 0 <= rank < num_replicas:
        raise ValueError(f"rank {rank} is not one of {num_replicas} processes")


class EvalShardSampler(DistributedSampler):
    """Rank ``r`` of ``W`` reads positions ``r, r + W, r + 2W, ...``: every image exactly once over all ranks.

    A rank may get one image more than others, which is safe in validation: DDP syncs buffers in the first forward
    only, and torchmetrics gathers states of unequal length. Fewer images than processes is refused (a rank with
    nothing to validate would block the buffer sync).
    """

    def __init__(self, length: int, num_replicas: int, rank: int):
        _check_rank(num_replicas, rank)
        if length < num_replicas:
            raise ValueError(f"an evaluation split of {length} images cannot be shared by {num_replicas} processes")
        super().__init__(range(length), num_replicas=num_replicas, rank=rank, shuffle=False)
        self.total_size = length
        self.num_samples = len(range(rank, length, num_replicas))

    def __iter__(self) -> Iterator[int]:
        return iter(range(self.rank, self.total_size, self.num_replicas))

    def __len__(self) -> int:
        return self.num_samples


class TrainShardSampler(DistributedSampler):
    """Every rank computes the same epoch order, then takes every ``W``-th draw starting at its rank.

    The order is the wrapped sampler's seeded draw, or a permutation seeded by ``seed + epoch``. The last
    ``len % W`` draws are skipped so every rank runs the same number of steps (DDP's all-reduce needs that) without
    repeating a draw.
    """

    def __init__(self, source: Sampler | None, length: int, num_replicas: int, rank: int, seed: int = 0):
        _check_rank(num_replicas, rank)
        if length < num_replicas:
            raise ValueError(f"an epoch of {length} draws cannot be shared by {num_replicas} processes")
        if source is not None and len(source) != length:
            raise ValueError(f"the sampler draws {len(source)} per epoch, not {length}")
        super().__init__(range(length), num_replicas=num_replicas, rank=rank, shuffle=True, seed=seed, drop_last=True)
        self.source = source
        self.length = length
        self.num_samples = length // num_replicas
        self.total_size = self.num_samples * num_replicas

    def epoch_order(self) -> list[int]:
        """This epoch's whole draw, the same on every rank (and on every call: the epoch is set, not advanced)."""
        if self.source is not None:
            if hasattr(self.source, "set_epoch"):
                self.source.set_epoch(self.epoch)
            return list(self.source)
        generator = torch.Generator()
        generator.manual_seed(self.seed + self.epoch)
        return torch.randperm(self.length, generator=generator).tolist()

    def __iter__(self) -> Iterator[int]:
        return iter(self.epoch_order()[self.rank : self.total_size : self.num_replicas])

    def __len__(self) -> int:
        return self.num_samples
