"""Bootstrap count vectors packed several resamples to an int64, so one sparse product sums many resamples at once.

Why: the suite's cost at scale is the sparse product mapping image counts to segment weights
(``evaluation.ranking.SuiteRanking``): ``N x C`` random reads of a count row per chunk of resamples. Every quantity it
needs from the counts is an integer sum of counts of one resample, so resamples can share an int64 as bit fields
(lanes): integer sums never carry from one lane into the next as long as every sum stays below ``2**bits``.

Two lane widths, because the product and the prefix sums have different bounds:

* the product runs on narrow lanes (``NARROW_BITS`` = 7, up to 9 resamples per int64). A product row sums at most
  ``ROW_IMAGES`` images and each count is clipped to ``CLIP`` in the packed copy, so a row's sum is at most
  ``ROW_IMAGES * CLIP`` = 120 < 2**7. The rare counts above ``CLIP`` (Poisson(1) draws: about one image in 10^8
  per resample) are added back exactly afterwards (``SuiteRanking``), so nothing is lost.
* prefix sums over a class reach the resample's ``N`` draws, so after the product the lanes are spread apart
  (``LanePacking.widen``: a shift and a mask per int64) into wide lanes of ``group * 7`` bits with ``2**bits > N``.

Both steps are exact integer arithmetic, so unpacking gives bit for bit the integers a float64 product gives. Lane
``l`` of packed column ``j`` holds resample ``j * lanes + l``; narrow lane ``l`` lands in wide plane ``l % group``,
wide lane ``l // group``; ``unpack`` writes the lanes in the column order ``column_resamples`` names (sums over rows
do not care), and the suite puts its per-resample results back in resample order.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

INT_BITS = 63  # an int64 holds sums below 2**63 without the sign bit
NARROW_BITS = 7
MAX_NARROW_LANES = INT_BITS // NARROW_BITS  # 9
ROW_IMAGES = 12
"""Most images one product row sums (longer segments are cut into several rows). Measured at 150,000 x 30: 18
images per row (counts clipped at 7) make 14% fewer rows, but then about 50 counts per chunk exceed the clip and
finding them costs a pass over the counts; with 12 (clip 10) a chunk of 36 resamples has one with probability 5%."""
CLIP = (2**NARROW_BITS - 1) // ROW_IMAGES
"""Largest count stored in a narrow lane (10): ``ROW_IMAGES * CLIP`` stays below ``2**NARROW_BITS``."""


@dataclass(frozen=True)
class LanePacking:
    """Narrow lanes for the product, wide lanes for prefix sums up to ``max_sum``.

    Attributes:
        bits: bits a wide lane needs (``2**bits > max_sum``).
        group: narrow lanes per wide lane spacing (wide lanes are ``group * NARROW_BITS`` bits apart).
        per_group: wide lanes per int64 (``per_group - 1`` full spacings plus ``bits`` fit 63 bits).
        lanes: resamples per packed int64, ``group * per_group``.
    """

    bits: int
    group: int
    per_group: int

    @classmethod
    def for_sums(cls, max_sum: int) -> LanePacking:
        bits = max(int(max_sum).bit_length(), 1)
        if bits > INT_BITS:
            raise ValueError(f"sums up to {max_sum} do not fit an int64 lane")
        group = -(-bits // NARROW_BITS)
        spacing = group * NARROW_BITS
        per_group = min((INT_BITS - bits) // spacing + 1, MAX_NARROW_LANES // group)
        return cls(bits=bits, group=group, per_group=max(per_group, 1))

    @property
    def lanes(self) -> int:
        return self.group * self.per_group

    @property
    def spacing(self) -> int:
        return self.group * NARROW_BITS

    def width(self, n: int) -> int:
        """Packed columns for ``n`` resamples (the last one padded with empty resamples)."""
        return -(-int(n) // self.lanes)

    def pack(self, counts: np.ndarray, out: np.ndarray | None = None, scratch: np.ndarray | None = None) -> np.ndarray:
        """``(n, N)`` counts in ``[0, CLIP]`` -> ``(N, width)`` C-contiguous int64 narrow lanes (resample last).

        ``out`` (``(N, width)``) and ``scratch`` (``(width + 1, N)``) int64 arrays are reused when given: fresh
        arrays of this size cost page faults every chunk.
        """
        n, n_items = counts.shape
        width = self.width(n)
        if scratch is None:
            scratch = np.empty((width + 1, n_items), dtype=np.int64)
        packed, shifted = scratch[:width], scratch[width]  # packed column j is row j here, transposed at the end
        packed[:] = 0
        for r in range(n):
            np.left_shift(counts[r], (r % self.lanes) * NARROW_BITS, out=shifted, dtype=np.int64)  # int32 counts too
            np.bitwise_or(packed[r // self.lanes], shifted, out=packed[r // self.lanes])
        if out is None:
            return np.ascontiguousarray(packed.T)
        np.copyto(out, packed.T)
        return out

    def widen(self, narrow: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """``(K, width)`` narrow-lane sums -> ``(group, K, width)`` int64 wide lanes, one plane per group.

        Group ``r`` keeps narrow lanes ``r, r + group, ...``: shifted down by ``r * 7`` bits they sit ``spacing``
        bits apart, each below ``2**7``, the rest masked off. Why planes: each group is then one contiguous pass,
        and prefix sums down a plane run on contiguous rows (measured twice as fast as interleaved groups at
        150,000 x 30). ``out``: a ``(group, K, width)`` int64 array (or view with contiguous planes) to write into.
        """
        mask = sum(((1 << NARROW_BITS) - 1) << (q * self.spacing) for q in range(self.per_group))
        out = np.empty((self.group, *narrow.shape), dtype=np.int64) if out is None else out
        for r in range(self.group):
            if r:
                np.right_shift(narrow, r * NARROW_BITS, out=out[r])
                np.bitwise_and(out[r], mask, out=out[r])
            else:
                np.bitwise_and(narrow, mask, out=out[r])
        return out

    @staticmethod
    def rows(planes: np.ndarray, index: np.ndarray | slice, out: np.ndarray | None = None) -> np.ndarray:
        """Rows ``index`` of ``(group, K, width)`` planes as ``(n, group * width)`` int64 (column ``r * width + j``),
        the input ``unpack`` takes."""
        picked = planes[:, index] if isinstance(index, slice) else np.take(planes, index, axis=1, mode="clip")
        n = picked.shape[1]
        out = np.empty((n, picked.shape[0] * picked.shape[2]), dtype=np.int64) if out is None else out
        out.reshape(n, picked.shape[0], picked.shape[2])[:] = picked.transpose(1, 0, 2)
        return out

    def column_resamples(self, width: int) -> np.ndarray:
        """Resample held by each column of ``unpack(rows(...))``: column ``(r * width + j) * per_group + q`` is wide
        lane ``q`` of plane ``r``, packed column ``j``, i.e. narrow lane ``q * group + r`` of packed column ``j``.
        """
        r, j, q = np.meshgrid(np.arange(self.group), np.arange(width), np.arange(self.per_group), indexing="ij")
        return (j * self.lanes + q * self.group + r).ravel()

    def unpack(self, wide: np.ndarray, out: np.ndarray | None = None, work: np.ndarray | None = None) -> np.ndarray:
        """``(K, group * width)`` wide-lane integers -> ``(K, width * lanes)`` float64, columns as ``column_resamples``
        (exact; order does not matter to sums over rows). ``out``: a ``(K, width * lanes)`` float64 array (or a
        view with contiguous rows) to write into; ``work``: at least ``K * width * group`` int64 for one lane (fresh
        ones of this size cost page faults, measured 15% of the unpacking)."""
        k, columns = wide.shape
        out = np.empty((k, self.per_group * columns)) if out is None else out
        lanes = out.reshape(k * columns, self.per_group)  # one long strided loop per lane
        source = wide.reshape(k * columns)
        lane_mask = (1 << self.spacing) - 1
        if self.per_group == 1:
            lane = source
        else:
            lane = np.empty_like(source) if work is None else work.reshape(-1)[: source.size]
        for q in range(self.per_group):
            if q:
                np.right_shift(source, q * self.spacing, out=lane)
            if q + 1 < self.per_group:  # the top lane has nothing above it
                np.bitwise_and(lane if q else source, lane_mask, out=lane)
            lanes[:, q] = lane
        return out
