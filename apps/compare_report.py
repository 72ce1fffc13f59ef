"""What a comparison leaves behind: CSV tables, the per-class heatmap and one self-contained HTML report.

The files go into a folder that ``apps.compare`` logs as the comparison run's artifacts; the HTML page
embeds its figure as a data URI, so the artifact opens alone (in MLflow's artifact viewer, a mail, a browser).
"""

from __future__ import annotations

import base64
import html
from pathlib import Path

import numpy as np
import pandas as pd

from evaluation.comparison import CORRECTION, P_VALUE, Comparison
from evaluation.groups import GROUPS
from evaluation.report import STYLE

PAIRS_CSV, VALUES_CSV, PER_CLASS_CSV = "pairs.csv", "values.csv", "per_class_ap.csv"
HEATMAP, REPORT, VERDICT = "per_class_ap.png", "report.html", "verdict.txt"
MARKS = {"better": "▲", "worse": "▼"}


def class_order(per_class: pd.DataFrame) -> pd.DataFrame:
    """Classes head to tail (the groups' order, then falling support), so the tail sits at the right end."""
    rank = {group: i for i, group in enumerate(GROUPS)}
    keyed = per_class.assign(_g=per_class["group"].map(lambda g: rank.get(g, len(rank))), _s=-per_class["support"])
    return keyed.sort_values(["_g", "_s", "class"], kind="stable").drop(columns=["_g", "_s"])


def heatmap(comparison: Comparison, path: Path) -> Path:
    """Entries x classes, colour = AP; ▲/▼ where an entry is significantly better/worse than the reference."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    table = class_order(comparison.per_class)
    names = comparison.entries
    values = table[names].to_numpy(dtype=float).T  # (entries, classes)
    # Rows 0.55 in each, plus 2.8 in for the title and the rotated two-line class labels, which would otherwise
    # squeeze two rows into a strip.
    fig, ax = plt.subplots(figsize=(max(6.0, 0.42 * len(table) + 2.5), 2.8 + 0.55 * len(names)), dpi=110)
    image = ax.imshow(np.ma.masked_invalid(values), aspect="auto", cmap="viridis", vmin=0.0, vmax=1.0)
    for row, name in enumerate(names):
        marks = table[f"{name} mark"] if row else pd.Series([""] * len(table), index=table.index)
        for col, (value, mark) in enumerate(zip(values[row], marks, strict=True)):
            text = "n/a" if not np.isfinite(value) else f"{value:.2f}{MARKS.get(mark, '')}"
            ax.text(col, row, text, ha="center", va="center", fontsize=6.5,
                    color="black" if np.isfinite(value) and value > 0.6 else "white")  # fmt: skip
    ax.set_yticks(range(len(names)), [f"{n} (reference)" if i == 0 else n for i, n in enumerate(names)], fontsize=8)
    ax.set_xticks(range(len(table)), [f"{c}\n{g or '?'} n={s}" for c, g, s in
                                      zip(table["class"], table["group"], table["support"], strict=True)],
                  rotation=90, fontsize=6.5)  # fmt: skip
    fig.colorbar(image, ax=ax, fraction=0.025, pad=0.01, label="test AP")
    ax.set_title(f"Per-class test AP; ▲/▼ significantly better/worse than {names[0]}\n({CORRECTION}-adjusted "
                 f"p < {comparison.settings.alpha} over each row's classes)", fontsize=8)  # fmt: skip
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def _table_html(frame: pd.DataFrame) -> str:
    return frame.to_html(index=False, float_format=lambda v: f"{v:.4f}", na_rep="n/a", border=0)


def write_html(comparison: Comparison, runs: dict[str, list[str]], figure: Path, path: Path) -> Path:
    """The whole comparison on one page: verdict, settings, entry values, pairs, the heatmap and per-class table."""
    settings = comparison.settings
    figure_uri = "data:image/png;base64," + base64.b64encode(figure.read_bytes()).decode("ascii")
    verdict = "".join(f"<li>{html.escape(line)}</li>" for line in comparison.verdict())
    notes = "".join(f"<li>{html.escape(note)}</li>" for note in comparison.notes)
    members = "".join(f"<li><b>{html.escape(name)}</b>: {len(ids)} run(s) {html.escape(', '.join(ids))}</li>"
                      for name, ids in runs.items())  # fmt: skip
    per_class = class_order(comparison.per_class)
    per_class = per_class[[c for c in per_class.columns if not c.endswith((" ci_low", " ci_high"))]]
    values = comparison.values.assign(cell=comparison.values.apply(
        lambda r: f"{r.value:.4f} [{r.ci_low:.4f}, {r.ci_high:.4f}]", axis=1))  # fmt: skip
    values = values.pivot(index=["entry", "seeds"], columns="metric", values="cell").reset_index()
    values = values[["entry", "seeds", *comparison.values["metric"].drop_duplicates()]]
    values["entry"] = pd.Categorical(values["entry"], comparison.entries)
    values.columns.name = None
    body = f"""
<h1>Which run is really better</h1>
<h2>Verdict</h2><ul>{verdict}</ul>
<p>A difference is called significant when its {CORRECTION}-adjusted p is below {settings.alpha}; otherwise the
runs are tied on that metric (docs/compare.md says how to read it).</p>
<h2>Entries: mean over seeds [95 % CI: test-set resampling plus seed spread]</h2><ul>{members}</ul>
{_table_html(values.sort_values("entry"))}
<h2>Per class</h2>
<img alt="per-class AP heatmap" src="{figure_uri}" style="max-width:100%">
<h2>Pairs (difference = b - a, its 95 % CI, raw and {CORRECTION} p)</h2>
{_table_html(comparison.verdict_table())}
<h2>How it was computed</h2>
<ul><li>paired bootstrap on the stored test predictions: {settings.n_boot} case-level resamples, seed
{settings.seed}, the same images for every run, {html.escape(comparison.strata)} (docs/rules.md §3)</li>
<li>95 % interval: percentile interval of the per-resample differences</li>
<li>p-value: {html.escape(P_VALUE)} over the n defined resamples</li>
<li>multiple comparisons: {CORRECTION}, per ranking-chain metric over its pairs; per class over an entry's classes
against the reference {html.escape(comparison.entries[0])}</li>
<li>an entry with several seeds: mean over seeds in every resample plus a between-seed normal term of variance
s²/S (s² the seeds' sample variance)</li>{notes}</ul>
<h2>Per-class table</h2>
{_table_html(per_class)}
"""
    path.write_text(f"<!doctype html><html><head><meta charset='utf-8'><title>Comparison</title>"
                    f"<style>{STYLE}</style></head><body>{body}</body></html>\n", encoding="utf-8")  # fmt: skip
    return path


def write_all(comparison: Comparison, runs: dict[str, list[str]], folder: Path) -> list[Path]:
    """Every file of the comparison into ``folder``; returns their paths."""
    folder.mkdir(parents=True, exist_ok=True)
    comparison.pairs.to_csv(folder / PAIRS_CSV, index=False)
    comparison.values.to_csv(folder / VALUES_CSV, index=False)
    class_order(comparison.per_class).to_csv(folder / PER_CLASS_CSV, index=False)
    (folder / VERDICT).write_text("\n".join(comparison.verdict()) + "\n")
    figure = heatmap(comparison, folder / HEATMAP)
    write_html(comparison, runs, figure, folder / REPORT)
    return sorted(folder.iterdir())
