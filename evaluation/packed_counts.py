"""Bootstrap count vectors packed several resamples to an int64, so one sparse product sums three resamples at once.

Why: the suite's cost at scale is the per-class sparse product mapping image counts to segment weights
(``evaluation.ranking``): ``N x C`` random reads of a count row per chunk of resamples. Every quantity it needs
from the counts -- a segment's weight, a prefix sum of segments -- is a sum of counts of one resample, at most the
``N`` draws of that resample. With ``bits`` such that ``2**bits > N``, resamples ``r`` can share one int64 as
``sum_l count_l << (l * bits)``: integer sums of packed values never carry from one lane into the next, so the
product, the prefix sums and the unpacking are exact, bit for bit the integers a float64 product gives, with a third
of the reads and multiply-adds (three lanes of 21 bits or fewer for ``N < 2**21``).

Column ``j``, lane ``l`` of a packed ``(N, width)`` array holds resample ``j * lanes + l`` of the chunk, so unpacking
writes each resample back in order.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

INT_BITS = 63  # an int64 holds sums below 2**63 without the sign bit


@dataclass(frozen=True)
class Packing:
    """How ``n`` resamples of sums up to ``max_sum`` share int64 lanes."""

    n: int  # resamples in the chunk
    bits: int  # lane width: 2**bits > every sum
    lanes: int  # resamples per int64
    width: int  # packed columns, ceil(n / lanes)

    @classmethod
    def for_sums(cls, n: int, max_sum: int) -> Packing:
        bits = max(int(max_sum).bit_length(), 1)
        if bits > INT_BITS:
            raise ValueError(f"sums up to {max_sum} do not fit an int64 lane")
        lanes = max(1, min(INT_BITS // bits, int(n)))
        return cls(n=int(n), bits=bits, lanes=lanes, width=-(-int(n) // lanes))

    def pack(self, counts: np.ndarray) -> np.ndarray:
        """``(n, N)`` non-negative integer counts -> ``(N, width)`` C-contiguous int64 (resample last)."""
        counts = np.asarray(counts)
        if counts.shape[0] != self.n:
            raise ValueError(f"expected {self.n} resamples, got counts of shape {counts.shape}")
        out = np.zeros((counts.shape[1], self.width), dtype=np.int64)  # (N, width)
        for lane in range(self.lanes):
            rows = counts[lane :: self.lanes]  # resamples lane, lane + lanes, ... -> columns 0, 1, ...
            out[:, : len(rows)] |= rows.T.astype(np.int64) << (lane * self.bits)
        return out

    def unpack(self, packed: np.ndarray) -> np.ndarray:
        """``(K, width)`` int64 sums -> ``(K, n)`` float64 (exact: each lane is an integer below ``2**bits``)."""
        out = np.empty((packed.shape[0], self.width, self.lanes))  # (K, width, lanes)
        lane_bits = np.empty(packed.shape, dtype=np.int64)  # (K, width)
        for lane in range(self.lanes):
            np.right_shift(packed, lane * self.bits, out=lane_bits)
            if lane + 1 < self.lanes:  # the top lane has nothing above it
                np.bitwise_and(lane_bits, (1 << self.bits) - 1, out=lane_bits)
            out[:, :, lane] = lane_bits
        out = out.reshape(packed.shape[0], self.width * self.lanes)
        return out[:, : self.n] if self.n < out.shape[1] else out
