"""What a study's parent run shows: best value and params, the trials table, and Optuna's plots.

Written by every worker when it stops (the last one to stop writes the complete picture; artifacts are simply
overwritten) and, for the best value only, after every trial so the UI follows a running study.
"""

from __future__ import annotations

import json
import logging
import tempfile
import warnings
from collections.abc import Callable
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # headless: plots are files, never windows

import matplotlib.pyplot as plt  # noqa: E402
import optuna  # noqa: E402
from mlflow import MlflowClient  # noqa: E402
from optuna.trial import TrialState  # noqa: E402
from optuna.visualization import matplotlib as optuna_plots  # noqa: E402

from training.tracking.session import log_metric_batch  # noqa: E402
from training.tuning.objective import is_surplus  # noqa: E402

log = logging.getLogger(__name__)

#: Artifact file -> Optuna plot. Importance needs two complete trials with a varying parameter; a plot Optuna
#: cannot draw yet is skipped with a log line, never an error, so a young study still gets its table.
PLOTS: dict[str, Callable[[optuna.Study], object]] = {
    "optimization_history.png": optuna_plots.plot_optimization_history,
    "param_importances.png": optuna_plots.plot_param_importances,
    "parallel_coordinate.png": optuna_plots.plot_parallel_coordinate,
    "intermediate_values.png": optuna_plots.plot_intermediate_values,
}


def state_counts(study: optuna.Study) -> dict[str, int]:
    """Trials per state name, e.g. ``{"COMPLETE": 4, "PRUNED": 2}`` (states with no trial left out).

    A surplus trial (one that lost the race for the last slot and never trained) counts as ``SURPLUS``, not as
    pruned, so the pruner's record stays true.
    """
    counts: dict[str, int] = {}
    for trial in study.get_trials(deepcopy=False):
        state = "SURPLUS" if is_surplus(trial) else trial.state.name
        counts[state] = counts.get(state, 0) + 1
    return counts


def log_best(study: optuna.Study, client: MlflowClient, run_id: str, metric: str) -> None:
    """Best value so far as ``best/<metric>`` (step = finished trials, so the UI draws its history) and counts."""
    finished = [t for t in study.get_trials(deepcopy=False) if t.state.is_finished()]
    metrics = {f"study/n_{state.lower()}": n for state, n in state_counts(study).items()}
    metrics["study/n_trials"] = sum(not is_surplus(t) for t in study.get_trials(deepcopy=False))
    if any(t.state == TrialState.COMPLETE for t in finished):
        best = study.best_trial
        metrics.update({f"best/{metric}": best.value, "best/trial": best.number})
        for key, value in best.params.items():
            client.set_tag(run_id, f"best.{key}", str(value))
        client.set_tag(run_id, "best.mlflow_run_id", str(best.user_attrs.get("mlflow_run_id", "")))
    log_metric_batch(client, run_id, metrics, step=len(finished))


def write_report(study: optuna.Study, client: MlflowClient, run_id: str, metric: str) -> list[str]:
    """Log the best value and params, ``trials.csv`` and the plots into the parent run; returns the plot files."""
    log_best(study, client, run_id, metric)
    written = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        study.trials_dataframe().to_csv(folder / "trials.csv", index=False)
        if any(t.state == TrialState.COMPLETE for t in study.get_trials(deepcopy=False)):
            best = study.best_trial
            summary = {"metric": metric, "direction": study.direction.name.lower(), "best_value": best.value,
                       "best_trial": best.number, "best_params": best.params,
                       "best_mlflow_run_id": best.user_attrs.get("mlflow_run_id"), "states": state_counts(study)}  # fmt: skip
            (folder / "best.json").write_text(json.dumps(summary, indent=1, default=str))
        for name, plot in PLOTS.items():
            if _save_plot(study, plot, folder / "plots" / name):
                written.append(name)
        client.log_artifacts(run_id, str(folder))
    return written


def _save_plot(study: optuna.Study, plot: Callable, path: Path) -> bool:
    path.parent.mkdir(exist_ok=True)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # Optuna marks its matplotlib backend experimental
            axes = plot(study)
        figure = (axes.flat[0] if hasattr(axes, "flat") else axes).figure
        figure.savefig(path, dpi=110, bbox_inches="tight")
        plt.close(figure)
        return True
    except (ValueError, RuntimeError, ZeroDivisionError) as error:
        log.info("plot %s skipped: %s", path.name, error)
        plt.close("all")
        return False
