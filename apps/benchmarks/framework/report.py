"""The benchmark's printed report (also logged as ``table.md``): what was measured on which items, the table of
every method's metrics with intervals (or the protocol's own layout of it), the notes a reader needs to trust it,
and the protocol's extra sections."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pandas as pd

from apps.benchmarks.framework.protocol import BOOTSTRAPS
from apps.benchmarks.framework.runner import BenchmarkResult


def format_table(table: pd.DataFrame, methods: Mapping[str, str], metrics: Mapping[str, str], digits: int = 3) -> str:
    """Markdown table: one row per metric, one column per method, ``value [low, high]`` (``n/a`` if missing)."""

    def cell(row) -> str:
        if not np.isfinite(row.value):
            return "n/a"
        if not (np.isfinite(row.ci_low) and np.isfinite(row.ci_high)):
            return f"{row.value:.{digits}f}"
        return f"{row.value:.{digits}f} [{row.ci_low:.{digits}f}, {row.ci_high:.{digits}f}]"

    cells = {(row.protocol, row.metric): cell(row) for row in table.itertuples()}
    header = "| metric (95% CI) | " + " | ".join(methods.values()) + " |"
    lines = [header, "|---" * (len(methods) + 1) + "|"]
    for metric, title in metrics.items():
        lines.append(f"| {title} | " + " | ".join(cells.get((m, metric), "n/a") for m in methods) + " |")
    return "\n".join(lines)


def render_report(result: BenchmarkResult) -> str:
    protocol, draw = result.protocol, result.draw
    table = protocol.report_table(result)
    if table is None:
        table = format_table(result.table, protocol.methods, protocol.metrics)
    lines = [
        f"# Benchmark {protocol.name} ({draw.version})",
        "",
        f"- model: {result.encoder.description}",
        *[f"- {line}" for line in draw.description],
        f"- draw seed {protocol.seed}; {result.n_boot} bootstrap resamples {BOOTSTRAPS[protocol.bootstrap][0]}, "
        "95% percentile CI",
        "",
        table,
        "",
        *[f"- {note}" for note in result.notes],
    ]
    for section in result.extras.sections:
        lines += ["", section.rstrip("\n")]
    return "\n".join(lines) + "\n"
