"""Reader agreement on a multi-reader benchmark (REVEAL-CXR): Cohen's kappa against the readers' majority.

Reads are coded 1 = present, 0 = absent, -1 = no read; a pair with a -1 on either side is left out, never
scored as absent. Two references: the full majority (as the REVEAL paper, which flatters every reader through
its own vote) and leave-one-out, the fair yardstick for a model, which never votes (docs/benchmarks.md,
"REVEAL-CXR"). Intervals come from a paired study-level bootstrap, since reads of one study are correlated.
Kappa depends only on the 2x2 counts, so a resample is its per-study multiplicities times the per-study
tables: one matrix product for all readers, findings and resamples.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from evaluation.bootstrap import percentile_ci

__all__ = [
    "ALL_READERS",
    "OVERALL",
    "REFERENCES",
    "VERDICTS",
    "agreement_plot",
    "bootstrap_counts",
    "cohen_kappa",
    "kappa_from_counts",
    "leave_one_out",
    "majority",
    "model_agreement",
    "multiplicity",
    "pair_indicator",
    "reader_agreement",
    "verdicts",
]

OVERALL = "overall"
"""Finding name of the rows pooled over findings (every (study, finding) pair stacked into one 2x2 table)."""

ALL_READERS = "all readers"
"""Reader name of the rows pooled over readers (every (study, reader) pair stacked into one 2x2 table)."""

REFERENCES = ("majority", "leave-one-out")
"""The two reference standards, in table order (see the module docstring)."""

VERDICTS = ("within the readers' range", "below the readers' range", "above the readers' range", "n/a")
"""Possible verdicts of :func:`verdicts`."""

COLUMNS = ["reference", "reader", "finding", "n", "kappa", "ci_low", "ci_high", "n_blank", "n_tie"]


def _check_codes(values: np.ndarray, name: str) -> np.ndarray:
    values = np.asarray(values)
    if values.size and not np.isin(values, (-1, 0, 1)).all():
        raise ValueError(f"{name} must be coded 1 = present, 0 = absent, -1 = no read; got {np.unique(values)}")
    return values.astype(np.int64)


def pair_indicator(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """One-hot cell of each pair in the 2x2 table, ``(..., 4)`` float in the order (0,0), (0,1), (1,0), (1,1).

    A pair with -1 on either side is all zeros, so summing indicators counts exactly the scorable pairs and a
    missing read needs no separate mask. Float so it multiplies bootstrap multiplicities directly.
    """
    a, b = np.broadcast_arrays(_check_codes(a, "a"), _check_codes(b, "b"))
    valid = (a >= 0) & (b >= 0)
    cell = np.where(valid, 2 * a + b, 0)
    return np.eye(4)[cell] * valid[..., None]


def kappa_from_counts(counts: np.ndarray) -> np.ndarray:
    """Cohen's kappa of every 2x2 table in ``counts`` ``(..., 4)``: (0,0), (0,1), (1,0), (1,1), possibly weighted.

    Uses ``2 (ad - bc) / ((a + b)(b + d) + (a + c)(c + d))``, algebraically ``(po - pe) / (1 - pe)``: on integer
    counts its denominator is exactly zero when, and only when, kappa is undefined, so that test needs no
    floating-point tolerance. Those tables give NaN.
    """
    counts = np.asarray(counts, dtype=np.float64)
    if counts.shape[-1:] != (4,):
        raise ValueError(f"counts must end in an axis of 4 cells, got shape {counts.shape}")
    a, b, c, d = np.moveaxis(counts, -1, 0)
    denominator = (a + b) * (b + d) + (a + c) * (c + d)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(denominator > 0, 2.0 * (a * d - b * c) / denominator, np.nan)


def cohen_kappa(a: np.ndarray, b: np.ndarray) -> float:
    """Cohen's kappa of two raters' 0/1 calls on the same items; NaN when it is undefined.

    Equal to ``sklearn.metrics.cohen_kappa_score`` wherever that is defined; here the undefined cases (no items,
    or both raters constant and identical) are NaN rather than a warning.
    """
    a, b = np.asarray(a), np.asarray(b)
    if a.shape != b.shape or a.ndim != 1:
        raise ValueError(f"a and b must be 1-D and of equal length, got shapes {a.shape} and {b.shape}")
    if not (np.isin(a, (0, 1)).all() and np.isin(b, (0, 1)).all()):
        raise ValueError("cohen_kappa takes 0/1 calls only; drop pairs with a missing read first")
    return float(kappa_from_counts(pair_indicator(a, b).sum(axis=0)))


def multiplicity(resamples: np.ndarray, n_items: int) -> np.ndarray:
    """``(B, N)`` float: how many times each item is drawn in each resample of ``resamples`` ``(B, N')``.

    One ``bincount`` over row-offset indices, so the cost does not grow with a Python loop over resamples.
    """
    resamples = np.asarray(resamples, dtype=np.int64)
    if resamples.ndim != 2:
        raise ValueError(f"resamples must be (n_boot, n) indices, got shape {resamples.shape}")
    if resamples.size and (resamples.min() < 0 or resamples.max() >= n_items):
        raise ValueError(f"resample indices must lie in [0, {n_items})")
    n_boot = resamples.shape[0]
    offsets = (np.arange(n_boot, dtype=np.int64) * n_items)[:, None]
    flat = np.bincount((resamples + offsets).ravel(), minlength=n_boot * n_items)
    return flat.reshape(n_boot, n_items).astype(np.float64)


def bootstrap_counts(resamples: np.ndarray, indicator: np.ndarray) -> np.ndarray:
    """2x2 counts of every resample: ``multiplicity (B, N) @ indicator (N, ..., 4)`` -> ``(B, ..., 4)``.

    An item drawn ``m`` times contributes its pairs ``m`` times, which is what scoring the explicitly resampled
    items would count.
    """
    indicator = np.asarray(indicator, dtype=np.float64)
    weights = multiplicity(resamples, indicator.shape[0])
    flat = weights @ indicator.reshape(indicator.shape[0], -1)
    return flat.reshape((weights.shape[0],) + indicator.shape[1:])


def _votes(reads: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Positive and negative reads per item (and finding), summed over the reader axis 1."""
    return (reads == 1).sum(axis=1), (reads == 0).sum(axis=1)


def _vote(positives: np.ndarray, negatives: np.ndarray) -> np.ndarray:
    # More positives than negatives is more than half of the reads given; a tie (or no read) decides nothing.
    return np.where(positives > negatives, 1, np.where(negatives > positives, 0, -1)).astype(np.int64)


def _check_reads(reads: np.ndarray) -> np.ndarray:
    reads = _check_codes(reads, "reads")
    if reads.ndim not in (2, 3):
        raise ValueError(f"reads must be (items, readers) or (items, readers, findings), got shape {reads.shape}")
    return reads


def majority(reads: np.ndarray) -> np.ndarray:
    """Majority vote over readers: ``(N, R)`` -> ``(N,)``, ``(N, R, K)`` -> ``(N, K)``; -1 on a tie or no read.

    Only the reads given count: a reader who left a study blank neither supports nor opposes the finding.
    """
    return _vote(*_votes(_check_reads(reads)))


def _others(reads: np.ndarray) -> np.ndarray:
    """For each reader, the vote of the other readers, also where the reader itself did not read."""
    positives, negatives = _votes(reads)
    return _vote(positives[:, None] - (reads == 1), negatives[:, None] - (reads == 0))


def leave_one_out(reads: np.ndarray) -> np.ndarray:
    """Same shape as ``reads``: for reader ``r``, the majority of the other readers' reads of that item.

    -1 where the others tie or none of them read, and where ``r`` itself did not read (nothing to compare).
    """
    reads = _check_reads(reads)
    return np.where(reads >= 0, _others(reads), -1)


def _agreement_counts(
    reads: np.ndarray, reference: np.ndarray, available: np.ndarray, resamples: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Point-and-bootstrap 2x2 counts ``(1 + B, R + 1, K + 1, 4)`` plus blank and tie counts ``(R + 1, K + 1)``.

    Index 0 of the first axis is the full sample; the last reader and finding slots hold the pools. ``available``
    is the reference a reader would have been compared with had it read (it differs from ``reference`` only for
    leave-one-out), so ``n_blank`` counts the reads that were missing, not the ones that could not have counted.
    """
    indicator = pair_indicator(reads, reference)  # (N, R, K, 4)
    counts = np.concatenate([indicator.sum(axis=0)[None], bootstrap_counts(resamples, indicator)])
    blank = ((reads < 0) & (available >= 0)).sum(axis=0)
    tie = ((reads >= 0) & (reference < 0)).sum(axis=0)

    def pool(values: np.ndarray, reader_axis: int) -> np.ndarray:
        values = np.concatenate([values, values.sum(axis=reader_axis, keepdims=True)], axis=reader_axis)
        return np.concatenate([values, values.sum(axis=reader_axis + 1, keepdims=True)], axis=reader_axis + 1)

    return pool(counts, 1), pool(blank, 0), pool(tie, 0)


def _rows(
    counts: np.ndarray, blank: np.ndarray, tie: np.ndarray, readers: Sequence[str], findings: Sequence[str], ci: float
) -> list[dict]:
    kappas = kappa_from_counts(counts)  # (1 + B, R', K')
    rows = []
    for r, reader in enumerate(readers):
        for k, finding in enumerate(findings):
            low, high = percentile_ci(kappas[1:, r, k], ci) if kappas.shape[0] > 1 else (np.nan, np.nan)
            rows.append({
                "reader": reader, "finding": finding, "n": int(round(counts[0, r, k].sum())),
                "kappa": float(kappas[0, r, k]), "ci_low": low, "ci_high": high,
                "n_blank": int(blank[r, k]), "n_tie": int(tie[r, k]),
            })  # fmt: skip
    return rows


def _names(names: Sequence[str], size: int, what: str, reserved: str) -> list[str]:
    names = [str(name) for name in names]
    if len(names) != size:
        raise ValueError(f"{size} {what} in the reads but {len(names)} {what} names")
    if reserved in names:
        raise ValueError(f"{reserved!r} is reserved for the pooled rows; rename that {what[:-1]}")
    return names


def _check_resamples(resamples: np.ndarray | None, n_items: int) -> np.ndarray:
    if resamples is None:
        return np.empty((0, n_items), dtype=np.int64)
    resamples = np.asarray(resamples, dtype=np.int64)
    if resamples.ndim != 2 or resamples.shape[1] != n_items:
        raise ValueError(f"resamples must be (n_boot, {n_items}) item indices, got shape {resamples.shape}")
    return resamples


def reader_agreement(
    reads: np.ndarray,
    readers: Sequence[str],
    findings: Sequence[str],
    resamples: np.ndarray | None,
    ci: float = 0.95,
) -> pd.DataFrame:
    """Kappa of every reader with both references, per finding and pooled, with paired bootstrap intervals.

    Args:
        reads: ``(N, R, K)`` reads of ``N`` studies by ``R`` readers for ``K`` findings (1 / 0 / -1).
        resamples: ``(B, N)`` study indices; ``None`` or ``B = 0`` for no intervals.

    Returns:
        One row per reference x (readers + ``"all readers"``) x (findings + ``"overall"``), with ``n`` (pairs
        scored), ``kappa``, ``ci_low``/``ci_high`` (undefined resamples dropped), ``n_blank`` (reference exists, no
        read) and ``n_tie`` (read, but the reference is a tie or missing).
    """
    reads = _check_reads(reads)
    if reads.ndim != 3:
        raise ValueError(f"reads must be (items, readers, findings), got shape {reads.shape}")
    n_items, n_readers, n_findings = reads.shape
    readers = _names(readers, n_readers, "readers", ALL_READERS) + [ALL_READERS]
    findings = _names(findings, n_findings, "findings", OVERALL) + [OVERALL]
    resamples = _check_resamples(resamples, n_items)
    full = np.broadcast_to(majority(reads)[:, None, :], reads.shape)
    others = _others(reads)
    references = {"majority": (full, full), "leave-one-out": (np.where(reads >= 0, others, -1), others)}
    rows = []
    for name, (reference, available) in references.items():
        counts, blank, tie = _agreement_counts(reads, reference, available, resamples)
        rows += [{"reference": name, **row} for row in _rows(counts, blank, tie, readers, findings, ci)]
    return pd.DataFrame(rows, columns=COLUMNS)


def model_agreement(
    calls: np.ndarray,
    reference: np.ndarray,
    resamples: np.ndarray | None,
    findings: Sequence[str],
    ci: float = 0.95,
) -> pd.DataFrame:
    """A model's kappa with a reference, per finding and overall, computed exactly as a reader's is.

    Args:
        calls: ``(N, K)`` the model's 1 / 0 calls (-1 where it gives none, counted in ``n_blank``).
        reference: ``(N, K)``, -1 where there is none. The model never votes, so :func:`majority` of all readers
            is the reference to set against the readers' leave-one-out kappas.
        resamples: the same ``(B, N)`` given to :func:`reader_agreement`, so the intervals are paired.
    """
    calls, reference = _check_codes(calls, "calls"), _check_codes(reference, "reference")
    if calls.ndim != 2 or calls.shape != reference.shape:
        raise ValueError(f"calls and reference must both be (items, findings), got {calls.shape}, {reference.shape}")
    findings = _names(findings, calls.shape[1], "findings", OVERALL) + [OVERALL]
    resamples = _check_resamples(resamples, calls.shape[0])
    counts, blank, tie = _agreement_counts(calls[:, None], reference[:, None], reference[:, None], resamples)
    # Slot 0 is the model; slot 1 would be the pool over "readers", identical with one reader.
    rows = _rows(counts[:, :1], blank[:1], tie[:1], ["model"], findings, ci)
    return pd.DataFrame(rows).drop(columns="reader")[[c for c in COLUMNS if c not in ("reference", "reader")]]


def verdicts(model_kappa: pd.Series, readers: pd.DataFrame, reference: str = "leave-one-out") -> pd.DataFrame:
    """Whether the model's kappa falls within the individual readers' range, per finding (and overall).

    The range is that of individual readers only (the pooled ``"all readers"`` row is an average, not a reader);
    readers whose kappa is undefined are ignored. The default reference is leave-one-out because the model never
    votes. ``verdict`` is one of :data:`VERDICTS`, ``"n/a"`` when the model's kappa or every reader's is undefined.
    """
    if reference not in REFERENCES:
        raise ValueError(f"reference must be one of {REFERENCES}, got {reference!r}")
    individual = readers[(readers["reference"] == reference) & (readers["reader"] != ALL_READERS)]
    kappas = individual.assign(kappa=individual["kappa"].where(np.isfinite(individual["kappa"])))
    spread = kappas.groupby("finding", sort=False)["kappa"].agg(["count", "min", "max"])
    order = list(spread.index) + [f for f in model_kappa.index if f not in spread.index]
    rows = []
    for finding in order:
        n, low, high = spread.loc[finding] if finding in spread.index else (0, np.nan, np.nan)
        model = float(model_kappa.get(finding, np.nan))
        if not (n and np.isfinite(model)):
            verdict = VERDICTS[3]
        elif model < low:
            verdict = VERDICTS[1]
        elif model > high:
            verdict = VERDICTS[2]
        else:
            verdict = VERDICTS[0]
        rows.append({
            "finding": finding, "n_readers": int(n), "reader_min": float(low), "reader_max": float(high),
            "model": model, "verdict": verdict,
        })  # fmt: skip
    return pd.DataFrame(rows, columns=["finding", "n_readers", "reader_min", "reader_max", "model", "verdict"])


def agreement_plot(
    readers_df: pd.DataFrame,
    model_df: pd.DataFrame | None,
    reference: str = "leave-one-out",
    model_label: str = "model",
):
    """Forest plot of kappa per finding: each reader with its interval, the readers' pool, and the model.

    The model is drawn as a vertical segment across its finding's row so the eye reads at once whether it falls
    inside the cloud of reader points. Built on an Agg canvas without pyplot, so no global figure state or
    display is involved. ``model_df`` may be ``None`` to plot the readers alone.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    if reference not in REFERENCES:
        raise ValueError(f"reference must be one of {REFERENCES}, got {reference!r}")
    rows = readers_df[readers_df["reference"] == reference]
    findings = [f for f in dict.fromkeys(rows["finding"]) if f != OVERALL] + [OVERALL]
    names = [r for r in dict.fromkeys(rows["reader"]) if r != ALL_READERS]
    position = {finding: i for i, finding in enumerate(findings)}
    # One vertical slot per reader plus the middle one for the pool, so no reader hides behind the pooled marker.
    slots = np.linspace(-0.36, 0.36, len(names) + 1)
    middle = len(names) // 2
    offsets, centre = np.delete(slots, middle), slots[middle]
    colours = [f"C{i % 10}" for i in range(len(names))]

    fig = Figure(figsize=(8, 1.0 + 0.45 * len(findings)), layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.subplots()
    for reader, offset, colour in zip(names, offsets, colours, strict=True):
        mine = rows[rows["reader"] == reader]
        y = mine["finding"].map(position).to_numpy(dtype=float) + offset
        ax.hlines(y, mine["ci_low"], mine["ci_high"], color=colour, linewidth=1, alpha=0.7)
        ax.scatter(mine["kappa"], y, color=colour, s=14, zorder=3)
    pooled = rows[rows["reader"] == ALL_READERS]
    y = pooled["finding"].map(position).to_numpy(dtype=float) + centre
    ax.hlines(y, pooled["ci_low"], pooled["ci_high"], color="black", linewidth=2.5, zorder=4)
    ax.scatter(pooled["kappa"], y, color="black", marker="D", s=40, zorder=5)
    if len(names) <= 10:  # beyond ten the colours repeat and a legend entry per reader says nothing
        handles = [Line2D([], [], color=c, marker="o", markersize=4, linewidth=1, label=r)
                   for r, c in zip(names, colours, strict=True)]  # fmt: skip
    else:
        handles = [Line2D([], [], color="grey", marker="o", markersize=4, linewidth=1, label="individual readers")]
    handles.append(Line2D([], [], color="black", marker="D", markersize=6, linewidth=2.5, label=ALL_READERS))
    if model_df is not None:
        for finding, kappa, low, high in model_df[["finding", "kappa", "ci_low", "ci_high"]].itertuples(index=False):
            if finding not in position:
                continue
            y = position[finding]
            if np.isfinite(low) and np.isfinite(high):
                ax.fill_betweenx([y - 0.42, y + 0.42], low, high, color="tab:red", alpha=0.15, linewidth=0)
            if np.isfinite(kappa):
                ax.vlines(kappa, y - 0.42, y + 0.42, color="tab:red", linewidth=2.5, zorder=6)
        handles += [
            Line2D([], [], color="tab:red", linewidth=2.5, label=model_label),
            Patch(color="tab:red", alpha=0.15, label=f"{model_label} CI"),
        ]
    for boundary in np.arange(len(findings) - 1) + 0.5:
        ax.axhline(boundary, color="0.9", linewidth=0.8, zorder=0)
    ax.axvline(0, color="0.6", linewidth=0.8, linestyle=":")
    label = "full" if reference == "majority" else reference
    ax.set_yticks(range(len(findings)), findings)
    ax.set(xlim=(-0.2, 1.0), ylim=(len(findings) - 0.5, -0.5), xlabel=f"Label kappa (Cohen's) vs {label} majority")
    ax.set_title(f"Agreement with the {label} majority vote, per finding (lines: bootstrap CIs)")
    fig.legend(handles=handles, fontsize=7, loc="outside lower center", ncols=min(len(handles), 4))
    return fig
