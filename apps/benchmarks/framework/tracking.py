"""One finished MLflow run per benchmark result, in experiment ``benchmark-<name>``.

Params: the model, version, seed, bootstrap size, data root, each subset's fingerprint, size and pool, and the
protocol's own facts (draw and methods). Tags: the benchmark, version and fingerprints (searchable), the model's
kind and identity. Metrics: ``<method>/<metric>`` with ``_ci_low`` / ``_ci_high``. Artifacts: ``table.csv``,
``table.md`` (the printed report), ``scores.csv`` (per test item) and ``subsets/<name>.csv``. A protocol's extras
add their metrics and params, ``<name>.csv`` per table and ``<name>.png`` per figure. The run is created only
once everything is computed, so a failure never leaves a half-filled run behind.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from mlflow import MlflowClient

from apps.benchmarks.framework.models import model_kind
from apps.benchmarks.framework.protocol import Extras
from apps.benchmarks.framework.runner import BenchmarkResult
from training.tracking.run_context import EXPERIMENT_KIND
from training.tracking.session import git_commit
from training.tracking.tracked_run import TrackedRun, ensure_experiment


def experiment_id(client: MlflowClient, name: str, uri: str, artifact_root: str) -> str:
    """The experiment's id, created like a training run's (artifacts under ``artifact_root`` on a local store)."""
    return ensure_experiment(client, name, uri, artifact_root, tags=dict([EXPERIMENT_KIND]))


def zero_shot_kind(result: BenchmarkResult) -> str:
    """The model's zero-shot score kind, ``n/a`` when it scores none of the targets."""
    return result.encoder.zero_shot_kind if result.encoder.any_zero_shot else "n/a"


def run_params(result: BenchmarkResult, model: str, data_root: str) -> dict[str, object]:
    draw = result.draw
    params: dict[str, object] = {"model": model, "version": draw.version, "seed": result.protocol.seed,
                                 "n_boot": result.n_boot, "data_root": str(Path(data_root).resolve())}  # fmt: skip
    for name, subset in draw.subsets.items():
        params.update({f"{name}_fingerprint": subset.fingerprint, f"n_{name}": len(subset)})
        if subset.pool is not None:
            params[f"{name}_pool"] = subset.pool
    return {**params, **result.params, **result.extras.params, "zero_shot": zero_shot_kind(result)}


def run_tags(result: BenchmarkResult, model: str) -> dict[str, str]:
    draw = result.draw
    return {
        "benchmark": result.protocol.name,
        "benchmark.version": draw.version,
        **{f"benchmark.{name}_fingerprint": fingerprint for name, fingerprint in draw.fingerprints.items()},
        "model_kind": model_kind(model),
        "model_identity": result.encoder.identity[:5000],
        "zero_shot_available": str(result.encoder.any_zero_shot).lower(),
        "mlflow.source.git.commit": git_commit(),
    }


def write_extras(extras: Extras, folder: Path) -> None:
    """The protocol's extra tables (``<name>.csv``) and figures (``<name>.png``, each closed once written)."""
    for name, table in extras.tables.items():
        (folder / f"{name}.csv").parent.mkdir(parents=True, exist_ok=True)
        table.to_csv(folder / f"{name}.csv", index=False)
    if not extras.figures:
        return
    import matplotlib.pyplot as plt  # only protocols with figures pay for matplotlib

    for name, figure in extras.figures.items():
        try:
            (folder / f"{name}.png").parent.mkdir(parents=True, exist_ok=True)
            figure.savefig(folder / f"{name}.png", dpi=120, bbox_inches="tight")
        finally:
            plt.close(figure)


def log_run(client: MlflowClient, experiment: str, result: BenchmarkResult, model: str, data_root: str,
            report: str) -> str:  # fmt: skip
    """Log ``result`` as one finished run of ``experiment``; returns the run id."""
    run_name = f"{result.protocol.name}-{result.draw.version}-{model}"[:250]
    with TrackedRun.start(client, experiment, run_name, run_tags(result, model)) as run:
        run.log(params=run_params(result, model, data_root), metrics=result.metrics())
        with tempfile.TemporaryDirectory() as tmp:
            folder = Path(tmp)
            (folder / "subsets").mkdir()
            result.table.to_csv(folder / "table.csv", index=False)
            (folder / "table.md").write_text(report)
            result.scores.to_csv(folder / "scores.csv", index=False)
            for name, subset in result.draw.subsets.items():
                subset.table.to_csv(folder / "subsets" / f"{name}.csv", index=False)
            write_extras(result.extras, folder)
            run.log_artifacts(folder)
    return run.run_id
