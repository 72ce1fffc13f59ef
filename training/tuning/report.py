"""What a study's parent run shows: best value and params, the trials table, and Optuna's plots.

Written by every worker after each of its trials and again when it stops; several workers write into the one
parent run at once, in any order, and a worker may write what it read a moment before another worker's newer
state. So every write is a function of the Optuna storage alone, never of what this worker did:

* ``best/<metric>`` and ``best/trial`` hold one point per finished trial, stepped by the order in which trials
  finished (1, 2, ...), the value being the best of the trials finished up to that step. Each point carries the
  finishing trial's completion time as its timestamp, so two workers writing the same step write the same
  record, which the tracking store keeps once; steps the run already holds are not sent again.
* ``study/n_<state>`` for every state, zeros included (a count that dropped to zero must say so), stamped with
  the storage's latest event: the newest state wins whichever worker writes last.
* ``best.<key>`` tags are exactly the best trial's params: tags of an earlier best are deleted. A worker checks
  the tags against the storage after writing and writes again if a newer best arrived meanwhile, so the last
  check of all leaves them right.

The artifacts (``trials.csv``, ``best.json``, plots) are simply overwritten; the last worker to stop writes the
complete picture.
"""

from __future__ import annotations

import json
import logging
import tempfile
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import optuna
from mlflow import MlflowClient
from mlflow.entities import Metric, RunTag
from mlflow.exceptions import MlflowException
from mlflow.protos.databricks_pb2 import RESOURCE_DOES_NOT_EXIST, ErrorCode
from optuna.study import StudyDirection
from optuna.trial import FrozenTrial, TrialState

from training.tracking.run_logger import send_metrics
from training.tracking.tracked_run import TrackedRun
from training.tuning.plots import write_plots_page
from training.tuning.trial_run import RUN_ATTR

log = logging.getLogger(__name__)

#: Every state a trial can be counted in; all are logged, zeros included.
STATES = ("COMPLETE", "PRUNED", "FAIL", "RUNNING", "WAITING")
BEST_TAG = "best."
#: Rounds of write-then-check for the ``best.*`` tags; more than two only when the best changes that often.
TAG_ROUNDS = 5


def _ms(moment: datetime | None) -> int:
    return int(moment.timestamp() * 1000) if moment is not None else 0


@dataclass(frozen=True)
class StudyState:
    """One read of the study's trials from storage; everything reported at once is derived from the same read.

    Reading the storage once per report, not once per figure, keeps a report consistent (a value with its own
    trial number and params) while other workers finish trials in between.
    """

    trials: tuple[FrozenTrial, ...]
    direction: StudyDirection

    @classmethod
    def read(cls, study: optuna.Study) -> StudyState:
        return cls(tuple(study.get_trials(deepcopy=False)), study.directions[0])  # a multi-objective study: counts only

    def counts(self, zeros: bool = False) -> dict[str, int]:
        """Trials per state name."""
        counts = dict.fromkeys(STATES, 0) if zeros else {}
        for trial in self.trials:
            counts[trial.state.name] = counts.get(trial.state.name, 0) + 1
        return counts

    def _better(self, trial: FrozenTrial, than: FrozenTrial | None) -> bool:
        if than is None:
            return True
        if trial.value == than.value:
            return trial.number < than.number  # ties go to the earlier trial, whatever order trials are read in
        return (trial.value > than.value) == (self.direction == StudyDirection.MAXIMIZE)

    @property
    def best(self) -> FrozenTrial | None:
        """The best complete trial (ties: the lower number), or None before the first one."""
        best = None
        for trial in self.trials:
            if trial.state == TrialState.COMPLETE and self._better(trial, best):
                best = trial
        return best

    @property
    def finished(self) -> list[FrozenTrial]:
        """Trials that ended, in the order they ended (number breaks a tie)."""
        ended = [t for t in self.trials if t.state.is_finished()]
        return sorted(ended, key=lambda t: (t.datetime_complete or datetime.min, t.number))

    @property
    def running(self) -> int:
        return sum(t.state == TrialState.RUNNING for t in self.trials)

    @property
    def latest_event_ms(self) -> int:
        """When the storage last changed (a trial started or ended), as the timestamp of the counts."""
        return max((_ms(m) for t in self.trials for m in (t.datetime_start, t.datetime_complete)), default=0)

    def history(self, metric: str) -> list[Metric]:
        """``best/<metric>`` and ``best/trial`` at every step: the best of the first ``step`` finished trials."""
        points, best = [], None
        for step, trial in enumerate(self.finished, start=1):
            if trial.state == TrialState.COMPLETE and self._better(trial, best):
                best = trial
            if best is not None:
                stamp = _ms(trial.datetime_complete)
                points += [Metric(f"best/{metric}", best.value, stamp, step),
                           Metric("best/trial", float(best.number), stamp, step)]  # fmt: skip
        return points

    def best_tags(self) -> dict[str, str]:
        """The ``best.*`` tags the parent run must hold now: the best trial's params and MLflow run, or none."""
        best = self.best
        if best is None:
            return {}
        tags = {f"{BEST_TAG}{key}": str(value) for key, value in best.params.items()}
        tags[f"{BEST_TAG}mlflow_run_id"] = str(best.user_attrs.get(RUN_ATTR, ""))
        return tags

    def describe_best(self, metric: str) -> str | None:
        """The best line a worker prints; says so when other workers' trials may still change it."""
        best = self.best
        if best is None:
            return None
        pending = self.running + self.counts().get("WAITING", 0)
        standing = f" so far, {pending} trial{'s' * (pending != 1)} still running" if pending else ""
        return f"best {metric} {best.value:.4f} (trial {best.number}){standing}: {best.params}"


def log_best(study: optuna.Study, client: MlflowClient, run_id: str, metric: str) -> StudyState:
    """Bring the parent run's best history, counts and ``best.*`` tags up to the storage's state (see module).

    Returns the state it was written from, so a caller reporting more (``best.json``) uses the same read.
    """
    state = StudyState.read(study)
    held = {(m.key, m.step) for key in (f"best/{metric}", "best/trial") for m in client.get_metric_history(run_id, key)}
    points = [m for m in state.history(metric) if (m.key, m.step) not in held]
    send_metrics(client, run_id, points + count_metrics(state))
    return _sync_best_tags(study, state, client, run_id)


def count_metrics(state: StudyState) -> list[Metric]:
    """``study/n_<state>`` (zeros included) and ``study/n_trials``, stamped and stepped as the module says."""
    stamp, step = state.latest_event_ms, len(state.finished)
    counts = {f"study/n_{name.lower()}": n for name, n in state.counts(zeros=True).items()}
    counts["study/n_trials"] = len(state.trials)
    return [Metric(key, float(n), stamp, step) for key, n in counts.items()]


def _sync_best_tags(study: optuna.Study, state: StudyState, client: MlflowClient, run_id: str) -> StudyState:
    """Write the best trial's params as ``best.*`` tags, deleting an earlier best's; check and repeat (see module)."""
    for _ in range(TAG_ROUNDS):
        want = state.best_tags()
        held = {k: v for k, v in client.get_run(run_id).data.tags.items() if k.startswith(BEST_TAG)}
        if held == want:
            break
        for key in held.keys() - want.keys():
            _delete_tag(client, run_id, key)
        changed = [RunTag(k, v) for k, v in want.items() if held.get(k) != v]
        if changed:
            client.log_batch(run_id, tags=changed)
        state = StudyState.read(study)  # another worker may have found a new best while this one wrote
    else:
        log.warning("best.* tags of run %s still changing after %d rounds; the next report sets them", run_id,
                    TAG_ROUNDS)  # fmt: skip
    return state


def _delete_tag(client: MlflowClient, run_id: str, key: str) -> None:
    """Delete ``key``; already gone is fine: another worker syncing the same parent run got there first."""
    try:
        client.delete_tag(run_id, key)
    except MlflowException as error:
        if error.error_code != ErrorCode.Name(RESOURCE_DOES_NOT_EXIST):
            raise


def write_report(study: optuna.Study, client: MlflowClient, run_id: str, metric: str) -> list[str]:
    """Log the best value and params, ``trials.csv`` and the plots into the parent run; returns the plot files."""
    state = log_best(study, client, run_id, metric)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        study.trials_dataframe().to_csv(folder / "trials.csv", index=False)
        best = state.best  # the summary and the tags come from one read of the storage
        if best is not None:
            summary = {"metric": metric, "direction": study.direction.name.lower(), "best_value": best.value,
                       "best_trial": best.number, "best_params": best.params,
                       "best_mlflow_run_id": best.user_attrs.get(RUN_ATTR), "states": state.counts()}  # fmt: skip
            (folder / "best.json").write_text(json.dumps(summary, indent=1, default=str))
        written = write_plots_page(study, folder / "plots.html")
        TrackedRun(client, run_id).log_artifacts(folder)
    return written
