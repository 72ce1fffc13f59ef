"""Case-level bootstrap: reproducible resamples as count vectors, processed in memory-bounded chunks.

A resample of ``N`` images drawn with replacement is fully described by how many times each image was drawn, so
the metrics code never materialises resampled arrays: it weights the original images by these counts (see
``evaluation.ranking``). Each resample ``b`` draws its indices from its own generator,
``np.random.default_rng(SeedSequence(seed, spawn_key=(b,)))`` -- the ``b``-th child of
``np.random.default_rng(seed).spawn(B)`` -- so any resample can be regenerated on its own and the result does not
depend on how resamples are split into chunks.

With ``strata`` (one label per image, e.g. its source hospital) every resample draws each stratum's images from
that stratum only, so each resample keeps every stratum's count: the CI of a pooled test set made of two fixed-size
test sets then reflects the sampling of each set, not a reshuffled mix of the two. One stratum gives exactly the
unstratified draws.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np

CHUNK_BYTES = 8 * 2**20
"""Target size of one ``(N, chunk)`` float64 count array: small enough that the sparse products of
``evaluation.ranking`` read it from cache, and it bounds memory: a chunk holds a few arrays
of this size whatever ``n_boot`` is."""


def resample_generator(seed: int, b: int) -> np.random.Generator:
    """Generator of resample ``b``: the ``b``-th child of ``default_rng(seed)``, built without spawning the others."""
    return np.random.default_rng(np.random.SeedSequence(int(seed), spawn_key=(int(b),)))


def strata_members(strata: Sequence | np.ndarray | None, n_items: int) -> list[np.ndarray] | None:
    """Image indices of each stratum, strata in sorted order (so the draws do not depend on row order of labels)."""
    if strata is None:
        return None
    labels = np.asarray(strata)
    if labels.shape != (n_items,):
        raise ValueError(f"strata must hold one label per item: shape {labels.shape}, expected ({n_items},)")
    _, codes = np.unique(labels.astype(str), return_inverse=True)
    return [np.flatnonzero(codes == k) for k in range(codes.max() + 1)] if n_items else []


def _draw(generator: np.random.Generator, n_items: int, members: list[np.ndarray] | None) -> np.ndarray:
    """One resample's indices: with replacement over all items, or within each stratum."""
    if members is None:
        return generator.integers(0, n_items, size=n_items)
    return np.concatenate([m[generator.integers(0, m.size, size=m.size)] for m in members])


def _check_range(n_items: int, n_boot: int, start: int, stop: int | None) -> int:
    if n_items < 1:
        raise ValueError(f"need at least one item to resample, got n_items={n_items}")
    stop = n_boot if stop is None else stop
    if not 0 <= start <= stop <= n_boot:
        raise ValueError(f"resample range [{start}, {stop}) is not inside [0, {n_boot})")
    return stop


def resample_indices(n_items: int, n_boot: int, seed: int, *, start: int = 0, stop: int | None = None,
                     strata: Sequence | np.ndarray | None = None) -> np.ndarray:  # fmt: skip
    """Image indices of resamples ``start..stop-1``: row ``b`` is resample ``start + b`` drawn with replacement.

    Args:
        n_items: number of images ``N`` (whole images are resampled, all classes of an image together).
        n_boot: total number of resamples ``B`` (only used to check the range).
        seed: integer seed; the same seed always gives the same resamples.
        start: first resample to return.
        stop: one past the last resample to return (default ``n_boot``).
        strata: ``(N,)`` label per image; each resample then draws every stratum within itself (module docstring).

    Returns:
        ``(stop - start, N)`` int64 indices (with strata: grouped by stratum, strata in sorted order).
    """
    stop = _check_range(n_items, n_boot, start, stop)
    members = strata_members(strata, n_items)
    out = np.empty((stop - start, n_items), dtype=np.int64)  # (b, N)
    for row, b in enumerate(range(start, stop)):
        out[row] = _draw(resample_generator(seed, b), n_items, members)
    return out


def count_rows(n_items: int, seed: int, start: int, stop: int, members: list[np.ndarray] | None) -> np.ndarray:
    """``(stop - start, N)`` float64 counts of resamples ``start..stop-1``, strata given as ``strata_members``.

    The same draws as :func:`resample_indices`; separate from it because ``iter_count_chunks`` calls it once per
    chunk with the strata resolved once (sorting string labels per chunk would cost more than drawing). A stratum's draws are counted into its own images
    (``bincount`` of the within-stratum indices), which gives the same counts as counting ``_draw``'s image indices.
    """
    out = np.zeros((stop - start, n_items))  # (b, N)
    for row, b in enumerate(range(start, stop)):
        generator = resample_generator(seed, b)
        if members is None:
            out[row] = np.bincount(generator.integers(0, n_items, size=n_items), minlength=n_items)
            continue
        for m in members:  # same generator calls, same order as _draw
            out[row, m] = np.bincount(generator.integers(0, m.size, size=m.size), minlength=m.size)
    return out


def auto_chunk(n_items: int, n_boot: int, chunk_bytes: int = CHUNK_BYTES) -> int:
    """Resamples per chunk so that one ``(N, chunk)`` float64 array takes about ``chunk_bytes``; in ``[1, n_boot]``."""
    return int(max(1, min(max(int(n_boot), 1), chunk_bytes // (8 * max(int(n_items), 1)))))


def iter_count_chunks(n_items: int, n_boot: int, seed: int, chunk: int,
                      strata: Sequence | np.ndarray | None = None) -> Iterator[tuple[slice, np.ndarray]]:  # fmt: skip
    """Yield ``(rows, counts)`` for consecutive chunks of resamples; ``counts`` is ``(len(rows), N)``.

    Memory is bounded by one chunk whatever ``n_boot`` is. ``strata`` as in :func:`resample_indices` (resolved once
    for all chunks). Float64 counts, so they feed the sparse products directly.
    """
    if chunk < 1:
        raise ValueError(f"chunk must be >= 1, got {chunk}")
    if n_boot:
        _check_range(n_items, n_boot, 0, None)
    members = strata_members(strata, n_items)
    for start in range(0, n_boot, chunk):
        stop = min(start + chunk, n_boot)
        yield slice(start, stop), count_rows(n_items, seed, start, stop, members)


def percentile_ci(samples: np.ndarray, ci: float = 0.95) -> tuple[float, float]:
    """Percentile interval of bootstrap replicates: the ``(1-ci)/2`` and ``(1+ci)/2`` quantiles.

    Replicates that are NaN (the statistic was undefined in that resample, e.g. no class had a positive) are
    dropped rather than counted, since an undefined value is not a low or high value. Quantiles use numpy's
    default linear interpolation.

    Args:
        samples: ``(B,)`` replicates of one statistic.
        ci: coverage in (0, 1), 0.95 for the 2.5th and 97.5th percentiles.

    Returns:
        ``(low, high)``; ``(nan, nan)`` when no replicate is defined.
    """
    if not 0.0 < ci < 1.0:
        raise ValueError(f"ci must be in (0, 1), got {ci}")
    values = np.asarray(samples, dtype=np.float64).ravel()
    values = values[np.isfinite(values)]
    if values.size == 0:
        return float("nan"), float("nan")
    low, high = np.percentile(values, [50.0 * (1.0 - ci), 50.0 * (1.0 + ci)])
    return float(low), float(high)
