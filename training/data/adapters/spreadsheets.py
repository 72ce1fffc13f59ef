"""Reading label tables the way spreadsheets leave them: ids as text, every problem named by line and column."""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping
from pathlib import Path

import numpy as np
import pandas as pd

from training.data.adapters.base import AdapterError
from training.data.label_names import canonical_name
from training.data.manifest import NOT_A_LABEL, csv_line, listed, mangled_id_problem, mangled_ids, parse_labels


def read_table(path: Path) -> pd.DataFrame:
    """Every cell as text, nothing converted: ids such as ``00012`` or long PadChest numbers stay intact."""
    if not path.is_file():
        raise AdapterError(f"label table not found: {path}")
    separator = "\t" if path.suffix.lower() in (".tsv", ".tab") else ","
    try:
        table = pd.read_csv(path, dtype=str, keep_default_na=False, sep=separator)
    except pd.errors.EmptyDataError:
        raise AdapterError(f"{path}: empty file, not even a header line") from None
    except (pd.errors.ParserError, UnicodeDecodeError) as error:
        raise AdapterError(f"{path}: not a readable table: {error}") from None
    table.columns = [str(c).strip() for c in table.columns]
    return table


def require_columns(table: pd.DataFrame, columns: Iterable[str], path: Path) -> None:
    missing = [c for c in columns if c not in table.columns]
    if missing:
        raise AdapterError(f"{path}: missing column(s) {missing}; the table has {list(table.columns)}")


def id_problems(table: pd.DataFrame, column: str, path: Path, unique: bool = True) -> list[str]:
    """Empty ids, ids mangled into scientific notation, and (when ``unique``) duplicated ids."""
    values = table[column].str.strip()
    problems = listed(f"empty {column}", [f"{path}, line {csv_line(i)}, column {column!r}: empty"
                                          for i in values.index[values == ""]])  # fmt: skip
    problems += listed(f"mangled {column}", [mangled_id_problem(f"{path}, line {csv_line(i)}, column {column!r}",
                                                                values[i]) for i in mangled_ids(values)])  # fmt: skip
    if unique:
        dup = values[values.duplicated(keep=False) & (values != "")]
        problems += listed(
            f"duplicated {column}",
            [f"{path}, column {column!r}: {value!r} duplicated on lines {[csv_line(i) for i in rows.index]}"
             for value, rows in dup.groupby(dup, sort=False)],
        )  # fmt: skip
    return problems


def match_label_columns(
    columns: Iterable[str],
    vocabulary: Iterable[str],
    path: Path,
    explicit: Mapping[str, str] | None = None,
    ignore: Iterable[str] = (),
) -> dict[str, str]:
    """Map each label column of a table to the platform's finding name.

    ``explicit`` (table column -> finding) wins; otherwise :func:`canonical_name` matches case, spacing and
    known aliases. Columns in ``ignore`` are skipped.

    Raises:
        AdapterError: a column that is none of these, with the closest known name, so a misspelt class never
            becomes a silently missing one.
    """
    vocabulary = tuple(vocabulary)
    explicit = dict(explicit or {})
    mapping, unknown = {}, []
    for column in columns:
        if column in ignore:
            continue
        name = explicit.get(column) or canonical_name(column, vocabulary)
        if name is None:
            close = difflib.get_close_matches(column, vocabulary, n=1, cutoff=0.6)
            unknown.append(f"{path}, column {column!r}: unknown class name" + (f" (did you mean {close[0]!r}?)" if close
                           else "") + "; map it in the data config's label_map or list it in ignore_columns")  # fmt: skip
        elif name in mapping.values():
            unknown.append(f"{path}, column {column!r}: a second column for {name!r}")
        else:
            mapping[column] = name
    if unknown:
        raise AdapterError(f"{len(unknown)} problem(s) with label columns:\n  " + "\n  ".join(unknown))
    return mapping


def label_values(table: pd.DataFrame, column: str, path: Path) -> tuple[np.ndarray, list[str]]:
    """A label column as float (1, 0, NaN for empty), with every other value reported by line.

    The spellings are the manifest's own (:func:`training.data.manifest.parse_labels`): a value this adapter
    accepts is one a hand-written manifest may hold too.
    """
    values, bad = parse_labels(table[column])
    problems = [f"{path}, line {csv_line(i)}, column {column!r}: {table.at[i, column]!r} {NOT_A_LABEL}" for i in bad]
    return values, listed(f"bad values in {column!r}", problems)


def raise_if(problems: list[str], what: str) -> None:
    if problems:
        raise AdapterError(f"{what}: {len(problems)} problem(s), no manifest written:\n  " + "\n  ".join(problems))
