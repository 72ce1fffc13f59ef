"""One Optuna trial = one ordinary tracked training run, nested under the study's parent run.

Parameters become Hydra overrides (so ``loss=asl`` swaps the group as on the command line) and the trial runs
:func:`training.pipeline.run_training`: nothing about training is duplicated here.

A pruned trial's run ends **KILLED**, not FINISHED, because a FINISHED run on this platform is tested with a best
checkpoint; ``make register`` therefore never picks one, and its working checkpoints are deleted. With several
objectives every one is read at the epoch the first objective kept, so a trial's Pareto point is one model's (the
one ``make register`` would register), not the best epochs of each metric pieced together; no pruning then.
"""

from __future__ import annotations

import json
import logging
import math
import shutil
from collections.abc import Callable, Sequence
from pathlib import Path

import lightning.pytorch as L
import optuna
from mlflow import MlflowClient
from omegaconf import DictConfig, OmegaConf
from optuna_integration import PyTorchLightningPruningCallback

from training.pipeline import error_status, run_training
from training.tracking.redaction import redact_text
from training.tracking.session import tracking_uri
from training.tracking.tracked_run import TrackedRun
from training.tracking.uri import tracking_client
from training.tuning.goals import Goal
from training.tuning.heartbeat import TrialTakenOver, ensure_running
from training.tuning.space import SearchSpace, to_overrides

log = logging.getLogger(__name__)

#: Root-config keys that configure the study, not the training; a trial's run never sees them.
TUNE_KEYS = ("tune", "hparams_search", "pruner")
#: Optuna direction -> Lightning ``ModelCheckpoint`` mode, so the kept checkpoint is the one the trial scores.
CHECKPOINT_MODE = {"maximize": "max", "minimize": "min"}
#: How the best of a trial's per-epoch values is taken, per direction.
BEST = {"maximize": max, "minimize": min}

STATE_TAG = "optuna.state"
TRIAL_TAG = "optuna.trial_number"
STUDY_TAG = "optuna.study_name"
WORKER_TAG = "optuna.worker"
RUN_ATTR = "mlflow_run_id"
#: User attribute of a trial: the ``tune.worker`` that ran it, so the study alone says which worker ended which trial.
WORKER_ATTR = "cxrlt.worker"


class TrialRecorder(L.Callback):
    """Notes the MLflow run a trial writes to, and the objective's value after every validation.

    The run id goes into the trial's user attributes as soon as fitting starts, so even a trial whose worker is
    killed can be traced to (and closed in) MLflow later.
    """

    def __init__(self, trial: optuna.Trial, metric: str, others: Sequence[str] = ()):
        self.trial = trial
        self.metric = metric
        self.others = tuple(others)
        self.run_id: str | None = None
        self.values: dict[int, float] = {}
        self.other_values: dict[int, dict[str, float]] = {}  # epoch -> the other objectives' values
        self.logged: set[str] = set()  # every validation key seen, to name what a missing objective could be

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.run_id = trainer.logger.run_id
        ensure_running(self.trial)
        self.trial.set_user_attr(RUN_ATTR, self.run_id)

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.sanity_checking:
            return
        ensure_running(self.trial)  # before the pruning callback reports to a trial another worker may have failed
        metrics = trainer.callback_metrics
        self.logged.update(key for key in metrics if key.startswith("val/"))
        value = metrics.get(self.metric)
        if value is not None:
            self.values[pl_module.current_epoch] = float(value)
        others = {key: float(metrics[key]) for key in self.others if key in metrics}
        if others:
            self.other_values[pl_module.current_epoch] = others

    def kept_epoch(self, direction: str) -> int | None:
        """The epoch whose checkpoint is kept: the first with the best value (Lightning keeps a later epoch only
        when it is strictly better), or None when the metric was never logged."""
        best = BEST[direction](self.values.values(), default=None)
        return None if best is None else min(e for e, v in self.values.items() if v == best)


def trial_status(error: BaseException) -> str:
    """MLflow status of a trial run ended by ``error``: pruning ends it KILLED (see module docstring), and so does a
    trial another worker failed under this one (as that worker closed it)."""
    return "KILLED" if isinstance(error, (optuna.TrialPruned, TrialTakenOver)) else error_status(error)


def merge_overrides(base: Sequence[str], trial: Sequence[str]) -> list[str]:
    """The command line's overrides with the trial's appended; a key the trial sets replaces the command line's.

    Hydra refuses two values for one group, so a ``loss=bce`` typed by the user is dropped when the search space
    draws ``loss``; the user is told once per trial.
    """

    def key(override: str) -> str:
        return override.split("=", 1)[0].lstrip("+~")

    drawn = {key(o) for o in trial}
    replaced = [o for o in base if key(o) in drawn]
    if replaced:
        log.warning("the search space sets %s; ignoring the command line's %s", sorted(drawn), replaced)
    return [o for o in base if key(o) not in drawn] + list(trial)


def train_config(cfg: DictConfig, metric: str, direction: str, run_name: str) -> DictConfig:
    """The trial's ``train`` config: resolved, without the study's keys, checkpointing on the objective."""
    plain = OmegaConf.to_container(cfg, resolve=True)
    for key in TUNE_KEYS:
        plain.pop(key, None)
    plain["checkpoint"] = {"monitor": metric, "mode": CHECKPOINT_MODE[direction]}
    plain["run_name"] = run_name
    return OmegaConf.create(plain)


class Objective:
    """Callable handed to ``study.optimize``.

    Args:
        compose: ``overrides -> config``, composing the root ``tune`` config (``hydra.compose`` in the CLI).
        overrides: the command line's overrides, applied to every trial.
        goals: a multi-objective study's objectives (``metric`` and ``direction`` are then its first); the trial
            returns one value per goal, read at the kept epoch (module docstring), and is never pruned.
    """

    def __init__(self, compose: Callable[[list[str]], DictConfig], overrides: Sequence[str], space: SearchSpace,
                 metric: str, direction: str, parent_run_id: str, study_name: str, worker: int = 0,
                 goals: Sequence[Goal] | None = None):  # fmt: skip
        self.goals = tuple(goals) if goals else None
        if self.goals:
            metric, direction = self.goals[0].metric, self.goals[0].direction
        self.compose = compose
        self.overrides = list(overrides)
        self.space = space
        self.metric = metric
        self.direction = direction
        self.parent_run_id = parent_run_id
        self.study_name = study_name
        self.worker = worker

    def __call__(self, trial: optuna.Trial) -> float | tuple[float, ...]:
        trial.set_user_attr(WORKER_ATTR, self.worker)
        values = self.space.sample(trial)
        composed = self.compose(merge_overrides(self.overrides, to_overrides(values)))
        cfg = train_config(composed, self.metric, self.direction, f"{composed.run_name}-t{trial.number}")
        recorder = TrialRecorder(trial, self.metric, [g.metric for g in self.goals[1:]] if self.goals else ())
        # Optuna prunes single-objective trials only (Trial.report refuses a multi-objective one)
        pruning = [] if self.goals else [PyTorchLightningPruningCallback(trial, monitor=self.metric)]
        tags = {"mlflow.parentRunId": self.parent_run_id, STUDY_TAG: self.study_name, TRIAL_TAG: str(trial.number),
                STATE_TAG: "RUNNING", WORKER_TAG: str(self.worker), "optuna.params": json.dumps(values, default=str)[:5000]}  # fmt: skip
        log.info("trial %d: %s", trial.number, values)
        try:
            run_training(cfg, callbacks=[recorder, *pruning], extra_tags=tags, status_on_error=trial_status)
            ensure_running(trial)  # the test phase after the last validation can outlast the grace period too
        except optuna.TrialPruned:
            # the recorder runs before the pruning callback, so it holds the epoch that was pruned
            self._close(cfg, recorder, "PRUNED", {"optuna.pruned_epoch": str(max(recorder.values, default=-1))})
            shutil.rmtree(Path(cfg.tracking.checkpoint_root) / str(recorder.run_id), ignore_errors=True)
            raise
        except BaseException as error:
            self._close(cfg, recorder, "FAIL", {"optuna.error": redact_text(repr(error))[:1000]},
                        status=trial_status(error) if isinstance(error, TrialTakenOver) else None)  # fmt: skip
            raise
        if self.goals:
            return self._values(cfg, recorder)
        value = BEST[self.direction](recorder.values.values()) if recorder.values else math.nan
        # Optuna records a NaN objective (a diverged run) as FAIL; the run's tag says the same.
        self._close(cfg, recorder, "COMPLETE" if math.isfinite(value) else "FAIL", {"optuna.value": repr(value)})
        return value

    def _values(self, cfg: DictConfig, recorder: TrialRecorder) -> tuple[float, ...]:
        """Every goal's value at the kept epoch; a goal the validation never logged there fails the trial (NaN),
        its run tagged with what the validation did log."""
        epoch = recorder.kept_epoch(self.direction)
        at_epoch = {self.metric: recorder.values.get(epoch, math.nan), **recorder.other_values.get(epoch, {})}
        values = tuple(float(at_epoch.get(g.metric, math.nan)) for g in self.goals)
        missing = [g.metric for g, v in zip(self.goals, values, strict=True) if not math.isfinite(v)]
        if missing:
            message = (f"objective(s) {', '.join(missing)} not logged (or not finite) at the kept epoch {epoch}; this "
                       f"training's validation logged {', '.join(sorted(recorder.logged)) or 'nothing'}")  # fmt: skip
            log.warning("trial %d failed: %s", recorder.trial.number, message)
            self._close(cfg, recorder, "FAIL", {"optuna.error": message[:1000]})
            return tuple(math.nan for _ in self.goals)
        client = tracking_client(tracking_uri(cfg))
        TrackedRun(client, recorder.run_id).log_metrics({f"{g.metric}_best": v for g, v in
                                                        zip(self.goals[1:], values[1:], strict=True)})  # fmt: skip
        self._close(cfg, recorder, "COMPLETE", {"optuna.values": json.dumps(dict(zip([g.metric for g in self.goals],
                                                                                     values, strict=True)))})  # fmt: skip
        return values

    def _close(self, cfg: DictConfig, recorder: TrialRecorder, state: str, tags: dict[str, str],
               status: str | None = None) -> None:  # fmt: skip
        """Tag the trial's run with its final Optuna state; the pipeline already set the MLflow status, unless
        ``status`` replaces it (a trial taken over after its run finished).

        A trial that failed before fitting began has no run id in the recorder; its run, if the pipeline got as
        far as creating one, is found by its study and trial-number tags.
        """
        client = tracking_client(tracking_uri(cfg))
        run_id = recorder.run_id or self._find_run(client, cfg, recorder.trial.number)
        if run_id is None:  # failed before a run existed (e.g. a data error): nothing to tag
            return
        run = TrackedRun(client, run_id)
        run.set_tags({STATE_TAG: state, **tags})
        if status is not None:
            run.finish(status)

    def _find_run(self, client: MlflowClient, cfg: DictConfig, number: int) -> str | None:
        experiment = client.get_experiment_by_name(cfg.tracking.experiment)
        if experiment is None:
            return None
        runs = client.search_runs(
            [experiment.experiment_id],
            filter_string=f"tags.`{STUDY_TAG}` = '{self.study_name}' and tags.`{TRIAL_TAG}` = '{number}' "
            f"and tags.`mlflow.parentRunId` = '{self.parent_run_id}'",
        )
        return runs[0].info.run_id if runs else None
