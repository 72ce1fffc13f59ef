"""Reproducible stratified draws: largest-remainder quotas, seeded hash ranking, subset fingerprints.

A benchmark subset must be the same set of images for every user, every machine and every library version, and
must not shift when an unrelated image is added to or removed from a stratum. So no pseudo-random generator is
involved; each item gets a rank from a cryptographic hash of the seed and its id:

    rank(item) = sha256(f"{seed}:{item_id}".encode("utf-8")).hexdigest()

Items are ordered within their stratum by that hex digest (ascending; the id breaks the astronomically unlikely
tie) and the first ``quota`` are drawn. The quotas split the draw size over strata in proportion to their sizes
by the largest-remainder (Hamilton) method, so they always add up to the draw size exactly.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Hashable, Mapping, Sequence

import pandas as pd


def largest_remainder_quotas(counts: Mapping[Hashable, int], total: int) -> dict[Hashable, int]:
    """Split ``total`` draws over strata in proportion to their sizes, summing to ``total`` exactly.

    Each stratum first gets the floor of its exact share ``total * count / sum(counts)``; the draws left over go,
    one each, to the strata with the largest fractional remainders. Ties in the remainder go to the larger
    stratum, then to the stratum that sorts first (by ``str`` of its key), so the result never depends on the
    order of ``counts``. Remainders are compared as exact fractions (integer arithmetic), never as floats.

    Args:
        counts: stratum -> number of items available.
        total: number of items to draw, at most ``sum(counts)``.

    Returns:
        stratum -> quota, each at most the stratum's count.

    Raises:
        ValueError: a negative count or ``total`` outside ``[0, sum(counts)]``.
    """
    if any(int(count) < 0 for count in counts.values()):
        raise ValueError(f"stratum counts must be non-negative, got {dict(counts)}")
    available = sum(int(count) for count in counts.values())
    if not 0 <= total <= available:
        raise ValueError(f"cannot draw {total} items from {available}")
    if available == 0:
        return {key: 0 for key in counts}
    quotas, remainders = {}, {}
    for key, count in counts.items():
        quotas[key], remainders[key] = divmod(total * int(count), available)  # share = quota + remainder/available
    left = total - sum(quotas.values())
    order = sorted(counts, key=lambda key: (-remainders[key], -int(counts[key]), str(key)))
    for key in order[:left]:
        quotas[key] += 1
    return quotas


def hash_rank(item_id: str, seed: int) -> str:
    """The item's rank key: ``sha256("<seed>:<item_id>")`` as a hex digest (compared as a string, ascending)."""
    return hashlib.sha256(f"{int(seed)}:{item_id}".encode()).hexdigest()


def hash_order(item_ids: Sequence[str], seed: int) -> list[str]:
    """``item_ids`` sorted by their seeded hash rank (ties, which need a sha256 collision, by id)."""
    return sorted(item_ids, key=lambda item: (hash_rank(item, seed), item))


def stratified_draw(table: pd.DataFrame, size: int, stratum: str, id_column: str, seed: int) -> pd.DataFrame:
    """Draw ``size`` rows with largest-remainder quotas per stratum, the lowest hash ranks within each.

    Args:
        table: one row per item; ``id_column`` must be unique.
        size: rows to draw; ``None`` or ``len(table)`` keeps every row.
        stratum: column whose values are the strata (the label).
        id_column: column hashed for the ranking.
        seed: ranking seed.

    Returns:
        The drawn rows, sorted by ``id_column`` (a canonical order: the draw is a set), index reset.
    """
    if table[id_column].duplicated().any():
        duplicated = table.loc[table[id_column].duplicated(), id_column].iloc[0]
        raise ValueError(f"item ids must be unique; {duplicated!r} appears more than once")
    counts = table[stratum].value_counts().to_dict()
    quotas = largest_remainder_quotas(counts, len(table) if size is None else int(size))
    chosen = []
    for key, group in table.groupby(stratum, sort=True):
        chosen += hash_order(group[id_column].tolist(), seed)[: quotas[key]]
    drawn = table[table[id_column].isin(set(chosen))]
    return drawn.sort_values(id_column, kind="stable").reset_index(drop=True)


def fingerprint(ids: Sequence[str], labels: Sequence | None = None) -> str:
    """16-hex-digit identity of a subset: sha256 over its sorted ``id[:label]`` lines.

    Order-free, so two runs that drew the same images with the same labels report the same fingerprint; any
    changed image or label changes it.
    """
    if labels is None:
        lines = sorted(str(item) for item in ids)
    else:
        lines = sorted(f"{item}:{_label_text(label)}" for item, label in zip(ids, labels, strict=True))
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()[:16]


def _label_text(label) -> str:
    """A label as text that does not depend on its dtype (1, 1.0 and True read the same); text stays as it is."""
    if isinstance(label, str):
        return label
    value = float(label)
    return str(int(value)) if math.isfinite(value) and value.is_integer() else repr(value)
