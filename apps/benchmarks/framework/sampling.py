"""Reproducible stratified draws: largest-remainder quotas, seeded hash ranking, subset fingerprints.

A benchmark subset must be the same for every user, machine and library version, and must not shift when an
unrelated image is added to or removed from a stratum. So no pseudo-random generator is involved: within its
stratum an item is ranked by ``sha256(f"{seed}:{item_id}")`` (the id breaks ties) and the first ``quota`` are
drawn; the quotas split the draw size over strata by the largest-remainder (Hamilton) method, so they always
add up exactly (docs/benchmarks.md, "Pediatric pneumonia").
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Hashable, Mapping, Sequence

import pandas as pd


def largest_remainder_quotas(counts: Mapping[Hashable, int], total: int) -> dict[Hashable, int]:
    """Split ``total`` draws over strata in proportion to their sizes, summing to ``total`` exactly.

    Ties in the remainder go to the larger stratum, then to the stratum whose ``str`` sorts first, so the result
    never depends on the order of ``counts``. Remainders are compared as exact fractions, never as floats.

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

    ``id_column`` must be unique; ``size=None`` keeps every row. The drawn rows are sorted by ``id_column`` (a
    canonical order: the draw is a set), index reset.
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
