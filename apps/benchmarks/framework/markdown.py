"""Markdown tables for benchmark reports, without the optional ``tabulate`` that ``DataFrame.to_markdown`` needs."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd


def cell(value: object, digits: int = 3) -> str:
    """A table cell: floats to ``digits`` places, NaN as ``n/a``, ``|`` escaped so a value cannot split a row."""
    if isinstance(value, float | np.floating):
        return "n/a" if not np.isfinite(value) else f"{value:.{digits}f}"
    return str(value).replace("|", "\\|")


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[object]], digits: int = 3) -> str:
    lines = ["| " + " | ".join(cell(h) for h in header) + " |", "|---" * len(header) + "|"]
    lines += ["| " + " | ".join(cell(v, digits) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def frame_markdown(frame: pd.DataFrame, digits: int = 3) -> str:
    """A DataFrame as a markdown table (index dropped)."""
    return markdown_table(list(frame.columns), frame.itertuples(index=False, name=None), digits)
