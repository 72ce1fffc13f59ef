"""A readable ``report.md`` with the run's tables, for people who do not want to click through MLflow."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from evaluation.groups import GROUPS
from evaluation.metric_registry import SUITE

HEADLINE = SUITE.headline()
"""Rows of the headline table: the registry's metrics that every metric set has (not the ``*_valthr`` ones)."""


def _ci(metrics: dict, key: str) -> str:
    value = metrics.get(key)
    if value is None or not np.isfinite(value):
        return "-"
    low, high = metrics.get(f"{key}_ci_low"), metrics.get(f"{key}_ci_high")
    return f"{value:.4f} [{low:.4f}, {high:.4f}]" if low is not None else f"{value:.4f}"


def write_report(evaluation, path: Path, plots: list[Path]) -> Path:
    """Headline metrics per metric set, head-to-tail groups, per source, per class; figures linked."""
    m = evaluation.metrics
    sets = list(evaluation.sets)
    lines = ["# Evaluation report", ""]
    lines += [f"Test images: {len(evaluation.predictions['test'])}. Values are point estimates with 95% bootstrap CIs "
              "(1,000 case-level resamples unless configured otherwise).", ""]  # fmt: skip
    baseline = m.get("test/prevalence_baseline_mAP")
    if baseline is not None:
        lines += [f"Prevalence baseline (constant predictor) mAP: {baseline:.4f}.", ""]
    lines += ["## Headline", "", "| metric | " + " | ".join(sets) + " |", "|---" * (len(sets) + 1) + "|"]
    for metric in HEADLINE:
        lines.append(f"| {metric} | " + " | ".join(_ci(m, f"{s}/{metric}") for s in sets) + " |")
    if "test_perturbed/delta/mAP" in m:
        lines += ["", f"Perturbed minus original mAP: {m['test_perturbed/delta/mAP']:+.4f}."]

    lines += ["", "## Head-to-tail (groups by training prevalence)", "",
              "| group | classes | " + " | ".join(f"{s} mAP" for s in sets) + " |", "|---" * (len(sets) + 2) + "|"]  # fmt: skip
    for group in (g for g in GROUPS if g in evaluation.groups):
        members = ", ".join(evaluation.labels[c] for c in evaluation.groups[group])
        cells = " | ".join(_ci(m, f"{s}/group/{group}/mAP") for s in sets)
        lines.append(f"| {group} | {members} | {cells} |")

    if evaluation.sources:
        lines += [
            "",
            "## Per source (bootstrap within each source)",
            "",
            "| source | mAP | mAUROC | mF1 |",
            "|---|---|---|---|",
        ]
        for name, values in evaluation.sources.items():
            lines.append(f"| {name} | {_ci(values, 'mAP')} | {_ci(values, 'mAUROC')} | {_ci(values, 'mF1')} |")

    lines += [
        "",
        "## Per class (test)",
        "",
        "| class | train prevalence | AP | AUROC | F1@0.5 | ECE |",
        "|---|---|---|---|---|---|",
    ]
    for c, name in enumerate(evaluation.labels):
        cells = [f"{m[k]:.4f}" if k in m else "-" for k in (f"test/{x}/{name}" for x in ("ap", "auroc", "f1", "ece"))]
        lines.append(f"| {name} | {evaluation.train_prevalence[c]:.3%} | " + " | ".join(cells) + " |")
    if plots:
        lines += ["", "## Figures", ""] + [f"![{p.stem}]({p.name})" for p in plots]
    path.write_text("\n".join(lines) + "\n")
    return path
