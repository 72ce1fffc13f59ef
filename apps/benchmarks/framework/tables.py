"""Benchmark tables read under a contract: every refusal names the file, the line, the column and the value.

Shared by the protocols that read CSV tables of their own (CheXTemporal's pairs, the NIH and pair box tables), so a
bad cell is reported the same way whichever benchmark reads it.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from training.data.label_names import canonical_name


def find_table(root: Path, name: str) -> Path | None:
    """``name`` or its gzipped copy under ``root``."""
    for candidate in (root / name, root / f"{name}.gz"):
        if candidate.is_file():
            return candidate
    return None


class DataContractError(ValueError):
    """A table or image folder breaks what a benchmark relies on; the message names file, line, column and value.

    A ``ValueError`` so that layers above (the benchmark runner) can wrap it into their own user-facing error without
    importing from here.
    """


def line_of(table: pd.DataFrame, position: int) -> int:
    """The 1-based file line of a row: its index + 2 for a table read from a CSV with a header (the index survives
    filtering, so the line stays right), its position + 2 for a table with a non-integer index."""
    label = table.index[position]
    return int(label) + 2 if isinstance(label, (int, np.integer)) else position + 2


def where(source: str, table: pd.DataFrame, position: int, column: str) -> str:
    return f"{source} line {line_of(table, position)}, column {column}"


def first_bad(source: str, table: pd.DataFrame, bad: np.ndarray | pd.Series, column: str, problem: str) -> None:
    """Raise for the first row flagged in ``bad``: ``problem`` is formatted with ``value`` (the cell's repr)."""
    flags = np.asarray(bad, dtype=bool)
    if not flags.any():
        return
    position = int(np.flatnonzero(flags)[0])
    value = cell(table, column, position)
    more = f" ({int(flags.sum())} such rows)" if flags.sum() > 1 else ""
    raise DataContractError(f"{where(source, table, position, column)}: {problem.format(value=repr(value))}{more}")


def cell(table: pd.DataFrame, column: str, position: int) -> str:
    """One cell as the text a user sees in the file (``20``, not ``np.int64(20)``)."""
    return as_text(table[column].iloc[[position]]).iloc[0]


def as_text(values: pd.Series) -> pd.Series:
    """Cells as stripped text, empty for a missing cell; a whole float (``42.0`` from a numeric read) as ``42``."""

    def one(value) -> str:
        if value is None or (not isinstance(value, str) and pd.isna(value)):
            return ""
        if isinstance(value, float) and value.is_integer():
            return str(int(value))
        return str(value).strip()

    return values.map(one).astype(object)


def read_text_csv(path: Path) -> pd.DataFrame:
    """A CSV with every cell as text (empty cell = ``""``), or a named error."""
    path = Path(path)
    if not path.is_file():
        raise DataContractError(f"{path}: file not found")
    try:
        return pd.read_csv(path, dtype=str, keep_default_na=False)
    except (pd.errors.ParserError, UnicodeDecodeError, pd.errors.EmptyDataError) as error:
        raise DataContractError(f"{path}: not a readable CSV table ({error})") from error


def require_columns(source: str, table: pd.DataFrame, columns: Sequence[str]) -> None:
    missing = [c for c in columns if c not in table.columns]
    if missing:
        raise DataContractError(f"{source}: no column(s) {', '.join(missing)} "
                                f"(columns: {', '.join(map(str, table.columns))})")  # fmt: skip


def parse_numbers(source: str, table: pd.DataFrame, column: str, label: str | None = None) -> np.ndarray:
    """A column as float, NaN for an empty cell; any other non-number is an error naming its cell.

    ``label`` is the column's name in the file when it differs from the table's (a renamed header).
    """
    text = as_text(table[column])
    numbers = pd.to_numeric(text.where(text != "", None), errors="coerce").to_numpy(dtype=float)
    bad = ((text != "") & ~np.isfinite(numbers)).to_numpy()
    if bad.any():
        position = int(np.flatnonzero(bad)[0])
        raise DataContractError(f"{where(source, table, position, label or column)}: {text.iloc[position]!r} is not "
                                f"a number ({int(bad.sum())} such cell(s))")  # fmt: skip
    return numbers


def match_vocabulary(source: str, table: pd.DataFrame, column: str, vocabulary: Sequence[str], what: str) -> pd.Series:
    """The column in the vocabulary's spelling (see :func:`canonical_name`); an unknown name is a named error."""
    vocabulary = tuple(vocabulary)
    mapping = {name: canonical_name(name, vocabulary) for name in table[column].unique()}
    spelled = table[column].map(mapping)
    first_bad(source, table, spelled.isna(), column,
              f"{{value}} is not a {what} this benchmark knows ({', '.join(vocabulary)})")  # fmt: skip
    return spelled.astype(object)
