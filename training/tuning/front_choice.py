"""Which trial of a Pareto front to register: the one nearest the utopia point, objectives normalised over the front.

Why this rule: every front trial is optimal for some weighting, and a rule with a knob (a floor, a weight) needs
the team to set it per task; distance to (1, ..., 1) after min-max rescaling over the front needs none, picks the
most balanced trade-off (the knee of a convex front), and is blind to units and to a constant objective. Ties
(a two-trial front always ties) and where the front comes from: docs/tuning-registry-submission.md,
"Multi-objective tuning". Only MLflow is read, never the Optuna storage, so ``make register`` works wherever the
tracking store is; no torch, no Optuna, since the registry's ranking imports this.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass

from mlflow import MlflowClient

from training.errors import UserError
from training.tracking.run_context import DEBUG_TAG
from training.tuning.goals import OBJECTIVES_ATTR, Goal, stored_goals

FRONT_TAG = "cxrlt.pareto_front"
STUDY_KIND = ("cxrlt.kind", "tuning-study")
RULE = ("utopia distance: each objective min-max normalised over the front (1 = the front's best, 0 its worst), "
        "the trial nearest (1, ..., 1) wins; ties: the better {tie}, then the earlier trial")  # fmt: skip
TIE = 1e-12


class NoFront(UserError, LookupError):
    """No multi-objective study in the experiment, or none of its front's runs can be registered."""


@dataclass(frozen=True)
class FrontRun:
    """A front trial as the rule sees it: its run, trial number and objective values in the goals' order."""

    run_id: str
    trial: int
    values: tuple[float, ...]


@dataclass(frozen=True)
class Choice:
    """The trial the rule picked, and every candidate's normalised values and distance (by run id)."""

    picked: FrontRun
    candidates: tuple[FrontRun, ...]
    normalised: dict[str, tuple[float, ...]]
    distance: dict[str, float]
    tie_metric: str

    def lines(self, goals: Sequence[Goal]) -> list[str]:
        """The rule, then every candidate nearest first: values, normalised values, distance, the one picked."""
        out = [f"rule: {RULE.format(tie=self.tie_metric)}",
               f"  trial  run id  {'  '.join(g.metric for g in goals)}  (normalised)  distance"]  # fmt: skip
        for run in sorted(self.candidates, key=lambda r: (self.distance[r.run_id], r.trial)):
            raw = "  ".join(f"{v:.4f}" for v in run.values)
            norm = ", ".join(f"{v:.2f}" for v in self.normalised[run.run_id])
            mark = "  <- picked" if run == self.picked else ""
            out.append(f"  {run.trial:>5}  {run.run_id}  {raw}  ({norm})  {self.distance[run.run_id]:.3f}{mark}")
        return out


def utopia_choice(runs: Sequence[FrontRun], goals: Sequence[Goal], tie_metric: str | None = None) -> Choice:
    """The rule of the module docstring on ``runs`` (a front: none dominates another; not checked here)."""
    if not runs:
        raise NoFront("the Pareto front is empty: no complete trial")
    metrics = [g.metric for g in goals]
    tie = tie_metric if tie_metric in metrics else metrics[0]
    t = metrics.index(tie)
    sign = [1.0 if g.higher_is_better else -1.0 for g in goals]
    normalised = {}
    for run in runs:
        parts = []
        for j, value in enumerate(run.values):
            column = [sign[j] * r.values[j] for r in runs]
            low, high = min(column), max(column)
            parts.append(1.0 if high == low else (sign[j] * value - low) / (high - low))
        normalised[run.run_id] = tuple(parts)
    distance = {r: math.sqrt(sum((1.0 - v) ** 2 for v in norm)) for r, norm in normalised.items()}
    nearest = min(distance.values())
    tied = [r for r in runs if distance[r.run_id] <= nearest + TIE]
    picked = min(tied, key=lambda r: (-sign[t] * r.values[t], r.trial))
    return Choice(picked, tuple(runs), normalised, distance, tie)


def latest_study(client: MlflowClient, experiment: str):
    """The newest tuning-study parent run of ``experiment`` that recorded objectives, or None."""
    found = client.get_experiment_by_name(experiment)
    if found is None:
        return None
    parents = client.search_runs([found.experiment_id], filter_string=f"tags.`{STUDY_KIND[0]}` = '{STUDY_KIND[1]}'",
                                 order_by=["attributes.start_time DESC"], max_results=1000)  # fmt: skip
    return next((run for run in parents if run.data.tags.get(OBJECTIVES_ATTR)), None)


def front_runs(
    client: MlflowClient, parent, goals: Sequence[Goal], include_debug: bool
) -> tuple[list[FrontRun], list[str]]:
    """The parent's front trials that can be registered, and a line for each one left out (and why)."""
    runs = client.search_runs([parent.info.experiment_id], max_results=10000,
                              filter_string=f"tags.`mlflow.parentRunId` = '{parent.info.run_id}' and "
                                            f"tags.`{FRONT_TAG}` = 'true'")  # fmt: skip
    kept, left = [], []
    for run in sorted(runs, key=lambda r: int(r.data.tags.get("optuna.trial_number", -1))):
        metrics = run.data.metrics
        values = tuple(metrics.get(f"{g.metric}_best", math.nan) for g in goals)
        if run.info.status != "FINISHED":
            left.append(f"{run.info.run_id}: not finished ({run.info.status})")
        elif not all(math.isfinite(v) for v in values):
            left.append(f"{run.info.run_id}: lacks {', '.join(f'{g.metric}_best' for g in goals)}")
        elif run.data.tags.get(DEBUG_TAG) == "true" and not include_debug:
            left.append(f"{run.info.run_id}: a debug run (ARGS=--include-debug ranks them)")
        else:
            kept.append(FrontRun(run.info.run_id, int(run.data.tags.get("optuna.trial_number", -1)), values))
    return kept, left


def choose_from_front(client: MlflowClient, experiment: str, selection_metric: str, include_debug: bool = False,
                      say=print) -> str:  # fmt: skip
    """The run id the rule picks from the newest multi-objective study of ``experiment``, saying which and why."""
    parent = latest_study(client, experiment)
    if parent is None:
        raise NoFront(f'no multi-objective study in experiment {experiment!r}: run make tune OBJECTIVES="..." first')
    goals = stored_goals(json.loads(parent.data.tags[OBJECTIVES_ATTR]))
    runs, left = front_runs(client, parent, goals, include_debug)
    study = parent.data.tags.get("optuna.study_name", parent.info.run_name)
    say(f"choosing from the Pareto front of study {study} (parent run {parent.info.run_id}, newest multi-objective "
        f"study of {experiment!r}): {len(runs)} front trial(s) on {', '.join(f'{g.metric} ({g.direction})' for g in goals)}")  # fmt: skip
    for line in left:
        say(f"  left out {line}")
    if not runs:
        raise NoFront(f"no registrable trial on the Pareto front of study {study} ({len(left)} left out, listed above)")
    choice = utopia_choice(runs, goals, selection_metric)
    for line in choice.lines(goals):
        say(line)
    picked = choice.picked
    why = "the only front trial" if len(runs) == 1 else f"the smallest distance, {choice.distance[picked.run_id]:.3f}"
    ties = [r for r, d in choice.distance.items() if d <= choice.distance[picked.run_id] + TIE]
    if len(ties) > 1:
        why += f", tied with {len(ties) - 1} other(s) and broken by {choice.tie_metric}"
    say(f"picked trial {picked.trial} (run {picked.run_id}): {why}")
    return picked.run_id
