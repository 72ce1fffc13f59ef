"""Who is in a reader study: age, sex, race and patient class by subset (REVEAL-CXR: released / holdout).

A released/holdout split is only fair if the two halves hold the same kind of patients. A characteristic whose
column the data does not have is one row saying so, never an error: releases differ in what they publish, and
the rest of the table still stands. The table is tidy (one row per characteristic, level and subset) so it is
logged as it is and checked against a plain count.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd

__all__ = ["ABSENT", "ALL", "MISSING_LEVEL", "NUMERIC_LEVELS", "demographics", "demographics_markdown"]

ABSENT = "not in this release"
"""The level of the one row a characteristic without a column gets."""

ALL = "all"
"""The subset of every study, always the last column."""

MISSING_LEVEL = "missing"
"""The level of blank cells of a categorical characteristic (and the count of blanks of a numeric one)."""

NUMERIC_LEVELS = ("n", "mean", "sd", "median", "q1", "q3", "min", "max", MISSING_LEVEL)
"""The rows of a numeric characteristic, in order: studies with a value, summaries of the values, blanks."""

COLUMNS = ["characteristic", "level", "subset", "value", "percent", "note"]


def _categorical(name: str, values: pd.Series, groups: dict[str, np.ndarray]) -> list[dict]:
    text = values.astype(str).str.strip().replace("", MISSING_LEVEL)
    found = sorted(set(text) - {MISSING_LEVEL})
    levels = found + ([MISSING_LEVEL] if (text == MISSING_LEVEL).any() else [])
    rows = []
    for level in levels:
        for subset, rows_in in groups.items():
            count = int((text[rows_in] == level).sum())
            rows.append({"characteristic": name, "level": level, "subset": subset, "value": float(count),
                         "percent": 100.0 * count / rows_in.sum() if rows_in.any() else np.nan, "note": ""})  # fmt: skip
    return rows


def _numeric(name: str, numbers: pd.Series, groups: dict[str, np.ndarray]) -> list[dict]:
    rows = []
    for subset, rows_in in groups.items():
        values = numbers[rows_in].dropna().to_numpy(dtype=float)
        summary = dict.fromkeys(NUMERIC_LEVELS, np.nan)
        summary["n"], summary[MISSING_LEVEL] = float(values.size), float(rows_in.sum() - values.size)
        if values.size:
            q1, median, q3 = np.percentile(values, [25, 50, 75])
            summary.update(mean=values.mean(), median=median, q1=q1, q3=q3, min=values.min(), max=values.max(),
                           sd=values.std(ddof=1) if values.size > 1 else np.nan)  # fmt: skip
        rows += [{"characteristic": name, "level": level, "subset": subset, "value": float(summary[level]),
                  "percent": np.nan, "note": ""} for level in NUMERIC_LEVELS]  # fmt: skip
    return rows


def demographics(
    table: pd.DataFrame,
    columns: Mapping[str, str | None],
    numeric: Sequence[str] = (),
    by: str | None = None,
    source: str = "the study table",
) -> pd.DataFrame:
    """The characteristics of the studies of ``table`` per subset of column ``by`` and for all studies.

    Args:
        columns: characteristic (``"age"``) -> its column in ``table``, or ``None`` when the data records none.
        numeric: characteristics summarised as numbers; one whose values are not all numbers (an age such as
            ``>89``) is counted by value instead, with a note.

    Returns:
        Rows ``characteristic``, ``level``, ``subset``, ``value``, ``percent``, ``note``. An absent characteristic
        is one row: level :data:`ABSENT`, subset :data:`ALL`, the reason in ``note``.
    """
    unknown = [name for name in numeric if name not in columns]
    if unknown:
        raise ValueError(f"demographics.numeric: {', '.join(unknown)} not among the characteristics {list(columns)}")
    subsets = sorted(set(table[by].astype(str))) if by is not None and by in table.columns else []
    groups = {subset: (table[by].astype(str) == subset).to_numpy() for subset in subsets}
    groups[ALL] = np.ones(len(table), dtype=bool)
    rows: list[dict] = []
    for name, column in columns.items():
        if column is None or column not in table.columns:
            why = f"no column configured (demographics.columns.{name}: null)" if column is None else (
                f"no column {column!r} in {source}")  # fmt: skip
            rows.append({"characteristic": name, "level": ABSENT, "subset": ALL, "value": np.nan, "percent": np.nan,
                         "note": why})  # fmt: skip
            continue
        values = table[column].astype(str).str.strip()
        numbers = pd.to_numeric(values.replace("", np.nan), errors="coerce")
        not_numbers = values[(values != "") & numbers.isna()]
        if name in numeric and not_numbers.empty:
            rows += _numeric(name, numbers, groups)
            continue
        found = _categorical(name, values, groups)
        if name in numeric:
            note = f"{column} is not numeric everywhere (e.g. {not_numbers.iloc[0]!r}): counted by value"
            found = [{**row, "note": note} for row in found]
        rows += found
    return pd.DataFrame(rows, columns=COLUMNS)


def _cell(row: pd.Series) -> str:
    if row["level"] == ABSENT:
        return ""
    if np.isfinite(row["percent"]):
        return f"{int(row['value'])} ({row['percent']:.1f}%)"
    if not np.isfinite(row["value"]):
        return "n/a"
    return f"{int(row['value'])}" if row["level"] in ("n", MISSING_LEVEL) else f"{row['value']:.1f}"


def demographics_markdown(frame: pd.DataFrame) -> str:
    """Markdown: one row per (characteristic, level), one column per subset; absent characteristics by name."""
    subsets = list(dict.fromkeys(frame["subset"]))
    subsets = [s for s in subsets if s != ALL] + [ALL]
    lines = ["| characteristic | level | " + " | ".join(subsets) + " |", "|---|---|" + "---|" * len(subsets)]
    absent = []
    for (name, level), rows in frame.groupby(["characteristic", "level"], sort=False):
        if level == ABSENT:
            absent.append(f"{name} ({rows['note'].iloc[0]})")
            lines.append(f"| {name} | {ABSENT} |" + " |" * len(subsets))
            continue
        cells = rows.set_index("subset")
        lines.append(f"| {name} | {level} | " + " | ".join(
            _cell(cells.loc[s]) if s in cells.index else "" for s in subsets) + " |")  # fmt: skip
    notes = sorted(set(frame.loc[frame["level"] != ABSENT, "note"]) - {""})
    tail = [f"Not in this release: {'; '.join(absent)}."] if absent else []
    return "\n".join(lines + ([""] + tail if tail else []) + [f"Note: {n}." for n in notes])
