"""What a multi-objective study's parent run shows: the Pareto front as a table, a figure and tags on its trials.

The front is Optuna's own (``study.best_trials``: the complete trials no other complete trial dominates), read
from the storage at each report, so several workers writing into one parent run write the same thing whichever
writes last (the same contract as :mod:`training.tuning.report`). After every trial the counts are logged and
every complete trial's run carries ``cxrlt.pareto_front`` = ``true`` or ``false`` (a trial once on the front
is set back to ``false`` when a later one dominates it); when the worker stops it also writes

* ``pareto_front.csv`` (and the same rows as the MLflow table ``pareto_front.json``, which the UI's artifact
  view shows as a table): one row per front trial, its trial number, MLflow run id, each objective's value and
  its params;
* ``pareto_front.png``: every complete trial on the first two objectives, the front's trials marked and numbered.
  With more than two objectives the figure still shows the first two, and says so in its title: a trial can sit
  on the front for a third objective while looking dominated in this plane;
* ``trials.csv`` and ``plots.html`` (with Optuna's interactive front for two or three objectives).

``make register ARGS=--pareto-front`` then picks among these trials (:mod:`training.tuning.front_choice`).
"""

from __future__ import annotations

import json
import logging
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import optuna
import pandas as pd
from mlflow import MlflowClient
from mlflow.entities import Metric
from optuna.trial import FrozenTrial, TrialState

from training.tracking.run_logger import send_metrics
from training.tracking.tracked_run import TrackedRun
from training.tuning.front_choice import FRONT_TAG
from training.tuning.goals import Goal
from training.tuning.plots import write_plots_page
from training.tuning.report import StudyState, count_metrics
from training.tuning.trial_run import RUN_ATTR

log = logging.getLogger(__name__)

SHOWN = 10  # front trials printed at the end of a study


@dataclass(frozen=True)
class FrontTrial:
    """One trial of the front: its number, MLflow run, objective values (in the goals' order) and params."""

    number: int
    run_id: str
    values: tuple[float, ...]
    params: dict


def front(study: optuna.Study) -> list[FrontTrial]:
    """The study's Pareto front (Optuna's ``best_trials``), by trial number."""
    return [FrontTrial(t.number, str(t.user_attrs.get(RUN_ATTR, "")), tuple(t.values), dict(t.params))
            for t in sorted(study.best_trials, key=lambda t: t.number)]  # fmt: skip


def front_table(rows: Sequence[FrontTrial], goals: Sequence[Goal]) -> pd.DataFrame:
    """The front as ``pareto_front.csv`` holds it: trial, mlflow_run_id, one column per objective, params."""
    records = [{"trial": r.number, "mlflow_run_id": r.run_id, **{g.metric: v for g, v in zip(goals, r.values, strict=True)},
                "params": json.dumps(r.params, sort_keys=True, default=str)} for r in rows]  # fmt: skip
    return pd.DataFrame(records, columns=["trial", "mlflow_run_id", *(g.metric for g in goals), "params"])


def _complete(study: optuna.Study) -> list[FrozenTrial]:
    return study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))


def plot_front(study: optuna.Study, goals: Sequence[Goal], path: Path) -> Path:
    """Every complete trial on the first two objectives, the front's marked and numbered (see module)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    on_front = {r.number for r in front(study)}
    trials = _complete(study)
    x, y = goals[0], goals[1]
    figure, axes = plt.subplots(figsize=(6, 4.5))
    rest = [t for t in trials if t.number not in on_front]
    best = sorted((t for t in trials if t.number in on_front), key=lambda t: t.values[0])
    axes.scatter([t.values[0] for t in rest], [t.values[1] for t in rest], c="0.6", label="dominated")
    axes.plot([t.values[0] for t in best], [t.values[1] for t in best], "o-", c="tab:red", label="Pareto front")
    for trial in best:
        axes.annotate(str(trial.number), (trial.values[0], trial.values[1]), textcoords="offset points", xytext=(4, 4))
    arrow = {"maximize": "higher is better", "minimize": "lower is better"}
    axes.set_xlabel(f"{x.metric} ({arrow[x.direction]})")
    axes.set_ylabel(f"{y.metric} ({arrow[y.direction]})")
    plane = "" if len(goals) == 2 else f"\nfirst two of {len(goals)} objectives; the front is over all {len(goals)}"
    axes.set_title(f"Study {study.study_name}: {len(best)} of {len(trials)} complete trials on the front{plane}",
                   fontsize=9)  # fmt: skip
    axes.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path


def sync_front_tags(study: optuna.Study, client: MlflowClient) -> None:
    """``cxrlt.pareto_front`` on every complete trial's run, rewritten only where it changed."""
    on_front = {r.number for r in front(study)}
    for trial in _complete(study):
        run_id = trial.user_attrs.get(RUN_ATTR)
        if not run_id:
            continue
        want = "true" if trial.number in on_front else "false"
        if client.get_run(run_id).data.tags.get(FRONT_TAG) != want:
            client.set_tag(run_id, FRONT_TAG, want)


def log_front(study: optuna.Study, client: MlflowClient, run_id: str) -> list[FrontTrial]:
    """After each trial: the counts and ``pareto/n_front`` into the parent run, the front tags on the trials."""
    state = StudyState.read(study)
    rows = front(study)
    counts = count_metrics(state)
    stamp, step = counts[0].timestamp, counts[0].step
    send_metrics(client, run_id, [*counts, Metric("pareto/n_front", float(len(rows)), stamp, step)])
    sync_front_tags(study, client)
    return rows


def write_front_report(
    study: optuna.Study, client: MlflowClient, run_id: str, goals: Sequence[Goal]
) -> list[FrontTrial]:
    """When a worker stops: :func:`log_front`, then the front table, its figure, ``trials.csv`` and the plots."""
    rows = log_front(study, client, run_id)
    table = front_table(rows, goals)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        study.trials_dataframe().to_csv(folder / "trials.csv", index=False)
        table.to_csv(folder / "pareto_front.csv", index=False)
        if len(_complete(study)) > 0:
            plot_front(study, goals, folder / "pareto_front.png")
        write_plots_page(study, folder / "plots.html")
        TrackedRun(client, run_id).log_artifacts(folder)
    if rows:
        client.log_table(run_id, data=table, artifact_file="pareto_front.json")
    return rows


def describe_front(rows: Sequence[FrontTrial], goals: Sequence[Goal]) -> list[str]:
    """The lines a worker prints at the end: the front's trials with their values (first ten)."""
    if not rows:
        return []
    names = ", ".join(f"{g.metric} ({g.direction})" for g in goals)
    out = [f"Pareto front: {len(rows)} trial(s) on {names}:"]
    for row in rows[:SHOWN]:
        values = "  ".join(f"{v:.4f}" for v in row.values)
        out.append(f"  trial {row.number:>3}  {values}  run {row.run_id}")
    if len(rows) > SHOWN:
        out.append(f"  ... and {len(rows) - SHOWN} more (pareto_front.csv in the parent run)")
    return out
