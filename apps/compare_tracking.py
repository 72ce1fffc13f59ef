"""A comparison as a run of its own, in experiment ``compare-<task>``, linked from every run it compared.

The comparison run holds the tables (CSV, and as MLflow tables the UI shows), the heatmap, ``report.html`` and the
verdict; its params say how it was computed. Each compared run gets the tag ``cxrlt.compared_in`` = the latest
comparison run that included it, so the way from a training run to the verdict about it is one click.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
from mlflow import MlflowClient

from apps.compare_report import PAIRS_CSV, PER_CLASS_CSV
from evaluation.comparison import CORRECTION, P_VALUE, Comparison
from evaluation.tables import logged_tables_tag, write_table

ARTIFACT_ROOT = "mlruns/artifacts"  # configs/tracking/mlflow.yaml, for an experiment this command creates
COMPARED_IN = "cxrlt.compared_in"
KIND_TAG = ("cxrlt.kind", "comparison")
FOLDER = "compare"


def experiment_name(task: str) -> str:
    return f"compare-{task}"


def log_comparison(client: MlflowClient, uri: str, task: str, comparison: Comparison, runs: dict[str, list[str]],
                   folder: Path) -> str:  # fmt: skip
    """Log ``folder`` (``apps.compare_report.write_all``'s files) as a new run; returns its id."""
    from training.tracking.tracked_run import TrackedRun, ensure_experiment  # lightning: only when logging

    experiment = ensure_experiment(client, experiment_name(task), uri, ARTIFACT_ROOT)
    settings = comparison.settings
    compared = [run_id for ids in runs.values() for run_id in ids]
    for name in (PAIRS_CSV, PER_CLASS_CSV):  # the UI shows JSON tables as tables
        write_table(pd.read_csv(folder / name), folder / f"{Path(name).stem}.json")
    params = {"entries": " | ".join(comparison.entries), "n_boot": settings.n_boot, "seed": settings.seed,
              "alpha": settings.alpha, "correction": CORRECTION, "p_value": P_VALUE, "strata": comparison.strata,
              "runs": " ".join(compared)}  # fmt: skip
    pairs = comparison.pairs
    metrics = {"significant_pairs": float(pairs["significant"].sum()), "tests": float(len(pairs))}
    tags = {KIND_TAG[0]: KIND_TAG[1], "task": task, "cxrlt.compared_runs": " ".join(compared),
            "mlflow.note.content": "\n".join(comparison.verdict()),
            **logged_tables_tag([f"{FOLDER}/{Path(PAIRS_CSV).stem}.json", f"{FOLDER}/{Path(PER_CLASS_CSV).stem}.json"])}  # fmt: skip
    with TrackedRun.start(client, experiment, f"compare-{len(comparison.entries)}-{task}", tags) as run:
        run.log(params=params, metrics=metrics)
        run.log_artifacts(folder, FOLDER)
    for run_id in compared:
        client.set_tag(run_id, COMPARED_IN, run.run_id)
    return run.run_id
