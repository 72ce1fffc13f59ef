"""Acquisition balance between benchmark subsets: DICOM header characteristics and Pearson's chi-square.

A released part and a held-out part are only comparable if they come from the same scanners and techniques;
otherwise a model's holdout score measures that shift, not the finding. The REVEAL-CXR paper compared the
subsets on a fixed list of DICOM tags with Pearson's chi-square (no continuity correction): :data:`FIELDS` and
:func:`balance`. Only headers are read. A missing tag is a category of its own: which sites fill a tag is itself
an acquisition characteristic. Continuous tags are cut into quantile bins of the pooled values (the same for
every subset), since one category per value is too sparse for the chi-square approximation.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import pandas as pd
from scipy.stats import chi2_contingency

from apps.benchmarks.framework.markdown import markdown_table

__all__ = ["FIELDS", "MISSING", "balance", "counts", "format_balance", "read_characteristics"]

FIELDS: tuple[str, ...] = (
    "Manufacturer",
    "ManufacturerModelName",
    "DetectorType",
    "ViewPosition",
    "KVP",
    "Exposure",
    "PixelSpacing",
)
"""DICOM keywords compared between subsets, those of the REVEAL-CXR paper."""

NUMERIC: frozenset[str] = frozenset({"KVP", "Exposure", "PixelSpacing"})
"""Fields read as numbers (PixelSpacing only when its row and column spacings agree)."""

MISSING = "missing"
"""Category of a value the file does not have."""

BALANCE_COLUMNS = ["field", "categories", "chi2", "dof", "p_value", "n", "note"]


def _number(value: object) -> float | str:
    try:
        return float(value)
    except (TypeError, ValueError):  # a malformed DS/IS string stays as written rather than vanishing
        return str(value).strip()


def _text(value: float | str) -> str:
    return f"{value:g}" if isinstance(value, float) else value


def _value(dataset, keyword: str) -> object:
    """One header value as a table cell: NaN when absent or empty, numbers for numeric tags, text otherwise."""
    value = dataset.get(keyword)
    multiple = isinstance(value, Sequence) and not isinstance(value, str)
    values = [v for v in (value if multiple else [value]) if v is not None and str(v).strip() != ""]
    if not values:
        return np.nan
    values = [_number(v) if keyword in NUMERIC else str(v).strip() for v in values]
    if keyword == "PixelSpacing" and all(isinstance(v, float) for v in values):
        row, *others = (round(v, 3) for v in values)
        # Anisotropic pixels are a different kind of image, not a rounding of the row spacing.
        return row if all(v == row for v in others) else " x ".join(_text(v) for v in (row, *others))
    if len(values) == 1:
        return values[0]
    return "\\".join(_text(v) for v in values)  # DICOM's own separator of multiple values


def read_characteristics(paths: Sequence[str | Path]) -> pd.DataFrame:
    """The :data:`FIELDS` of each file's header, one row per file indexed by path; a missing tag is NaN.

    Raises:
        ValueError: a file is not DICOM (or its header cannot be parsed); the message names the file.
        OSError: a file cannot be opened at all (missing, unreadable), as raised.
    """
    import pydicom

    rows = []
    for path in paths:
        try:
            dataset = pydicom.dcmread(str(path), stop_before_pixels=True)
        except OSError:
            raise
        except Exception as error:  # pydicom raises many types for a file it cannot parse; all mean "not DICOM"
            raise ValueError(f"{path} is not a readable DICOM file: {error}") from error
        rows.append({keyword: _value(dataset, keyword) for keyword in FIELDS})
    index = pd.Index([str(path) for path in paths], name="path")
    return pd.DataFrame(rows, index=index, columns=list(FIELDS))


def _is_number(value: object) -> bool:
    return isinstance(value, int | float | np.integer | np.floating) and not isinstance(value, bool | np.bool_)


def _categories(values: pd.Series, numeric_bins: int) -> tuple[pd.Series, str]:
    """Category of each value (positional) and a note on how numbers were grouped."""
    values = values.reset_index(drop=True)  # positional, whatever the frame's index (paths may repeat)
    present = values.dropna()
    if len(present) and all(_is_number(v) for v in present):
        numbers = present.astype(float)
        if numbers.nunique() > numeric_bins:
            bins = pd.qcut(numbers, numeric_bins, duplicates="drop")
            order = [str(interval) for interval in bins.cat.categories]
            labels = bins.astype(str).reindex(values.index)
            note = f"binned into {len(order)} quantile bins of the pooled values"
        else:
            order = [f"{v:g}" for v in sorted(numbers.unique())]
            labels = numbers.map(lambda v: f"{v:g}").reindex(values.index)
            note = ""
    else:
        labels = present.astype(str).reindex(values.index)
        order = sorted(labels.dropna().unique())
        note = ""
    labels = labels.fillna(MISSING)
    order = [c for c in order if c != MISSING] + [MISSING]
    return pd.Series(pd.Categorical(labels, categories=order), name=values.name), note


def _table(frame: pd.DataFrame, group_column: str, field: str, numeric_bins: int) -> tuple[pd.DataFrame, str]:
    if group_column not in frame.columns:
        raise KeyError(f"group column {group_column!r} not in the frame")
    if field not in frame.columns:
        raise KeyError(f"field {field!r} not in the frame")
    rows = frame[frame[group_column].notna()]
    categories, note = _categories(rows[field], numeric_bins)
    groups = rows[group_column].reset_index(drop=True)
    table = pd.crosstab(categories, groups, dropna=False)
    # Bins or groups nobody falls in carry no information and would give zero expected counts.
    table = table.loc[table.sum(axis=1) > 0, table.sum(axis=0) > 0]
    table.index.name, table.columns.name = field, group_column
    return table, note


def counts(frame: pd.DataFrame, group_column: str, field: str, numeric_bins: int = 4) -> pd.DataFrame:
    """Contingency table of ``field`` (rows: categories as :func:`balance` forms them) x groups (columns).

    Rows whose group is missing are left out; categories and groups with no file are dropped.
    """
    return _table(frame, group_column, field, numeric_bins)[0]


def balance(
    frame: pd.DataFrame, group_column: str, fields: Sequence[str] = FIELDS, numeric_bins: int = 4
) -> pd.DataFrame:
    """Pearson's chi-square test of independence between each field and the group (e.g. released / holdout).

    ``numeric_bins``: numeric fields with more distinct values than this are cut into this many quantile bins.
    Returns one row per field (``scipy.stats.chi2_contingency`` without continuity correction); ``note`` says why
    the test was not run when ``chi2`` and ``p_value`` are NaN.
    """
    rows = []
    for field in fields:
        table, note = _table(frame, group_column, field, numeric_bins)
        notes = [note] if note else []
        chi2 = p_value = np.nan
        dof = 0
        if table.shape[0] < 2:
            notes.append("fewer than 2 categories: nothing to compare")
        elif table.shape[1] < 2:
            notes.append("fewer than 2 groups: nothing to compare")
        else:
            result = chi2_contingency(table.to_numpy(), correction=False)
            chi2, p_value, dof = float(result.statistic), float(result.pvalue), int(result.dof)
            sparse = float((result.expected_freq < 5).mean())
            if sparse > 0:  # Cochran: the chi-square approximation is doubtful when many cells expect < 5
                notes.append(f"{sparse:.0%} of expected counts < 5")
        rows.append({
            "field": field, "categories": int(table.shape[0]), "chi2": chi2, "dof": dof, "p_value": p_value,
            "n": int(table.to_numpy().sum()), "note": "; ".join(notes),
        })  # fmt: skip
    return pd.DataFrame(rows, columns=BALANCE_COLUMNS)


def _float(value: float, digits: str) -> str:
    return "n/a" if not np.isfinite(value) else format(value, digits)


def format_balance(table: pd.DataFrame, contingencies: Mapping[str, pd.DataFrame]) -> str:
    """Markdown report: the summary of :func:`balance`, then each field's counts with per-group totals.

    Args:
        table: :func:`balance` output.
        contingencies: field -> :func:`counts` table (fields without one get no count table).
    """
    summary = [
        (r.field, r.categories, _float(r.chi2, ".2f"), r.dof, _float(r.p_value, ".3g"), r.n, r.note or "")
        for r in table.itertuples(index=False)
    ]
    lines = ["## Acquisition balance (Pearson's chi-square, no continuity correction)", ""]
    lines += markdown_table(["field", "categories", "chi2", "dof", "p", "n", "note"], summary).split("\n")
    for field in table["field"]:
        if field not in contingencies:
            continue
        counts_table = contingencies[field]
        groups = [str(g) for g in counts_table.columns]
        rows = [[category, *map(int, values)] for category, values in counts_table.iterrows()]
        rows.append(["total", *map(int, counts_table.sum(axis=0).to_numpy())])
        lines += ["", f"### {field}", ""] + markdown_table([field, *groups], rows).split("\n")
    return "\n".join(lines) + "\n"


def balance_report(
    paths: Sequence[str | Path], groups: Sequence[object], by: str
) -> tuple[pd.DataFrame, pd.DataFrame, str]:
    """Characteristics of the files ``paths`` with their group, the chi-square summary and its markdown, in one go
    for the benchmark report and ``make dicom-balance`` alike. Returns ``(characteristics, summary, markdown)``."""
    frame = read_characteristics(paths).reset_index(drop=True)
    frame.insert(0, by, list(groups))
    summary = balance(frame, by)
    contingencies = {field: counts(frame, by, field) for field in summary["field"]}
    return frame, summary, format_balance(summary, contingencies)
