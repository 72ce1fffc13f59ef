"""The study: storage, sampler and pruner from config, the parent MLflow run, and the shared trial budget.

User-facing rules (budget counting, several workers, dead-worker retries): docs/tuning-registry-submission.md,
"Tuning", and docs/scaling.md, "Tuning on many machines". Design points kept here:

- ``tune.trials=N`` counts trials that did not fail, so a dead worker's trial is replaced by its retry; workers
  count independently, so W workers may end with up to W - 1 trials over N.
- Exactly one parent run per study: the worker whose ``create_study`` inserted the study creates it and stores its
  id in the study's user attributes; the others wait for it (``load_if_exists=True`` unrolled, so the one
  creator is known).
- The PostgreSQL engine checks pooled connections before use, so a database restart does not fail the next trial.
- Several objectives: no pruner (Optuna prunes single-objective trials only; a configured one is replaced by
  ``NopPruner`` with a warning), and the metrics are stored so resuming with other objectives is refused.
"""

from __future__ import annotations

import json
import logging
import time
import warnings
from pathlib import Path
from urllib.parse import urlsplit

import optuna
from hydra.utils import instantiate
from mlflow import MlflowClient
from omegaconf import DictConfig, OmegaConf
from sqlalchemy.exc import SQLAlchemyError

from training.tracking.redaction import redact_text
from training.tracking.session import git_commit, tracking_uri
from training.tracking.tracked_run import TrackedRun, ensure_experiment
from training.tracking.uri import tracking_client
from training.tuning.goals import OBJECTIVES_ATTR, Goal, ObjectiveError, goals_from_config
from training.tuning.heartbeat import SteadyHeartbeatStorage, check_grace_period
from training.tuning.trial_run import RUN_ATTR, STATE_TAG, STUDY_TAG, WORKER_ATTR

log = logging.getLogger(__name__)

RUNNING = optuna.trial.TrialState.RUNNING
#: The states ``tune.trials`` counts, with Optuna's ``MaxTrialsCallback`` (module docstring, Budget).
COUNTED = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED, RUNNING)
PARENT_ATTR = "mlflow_parent_run_id"
KIND_TAG = "cxrlt.kind"
STUDY_KIND = "tuning-study"
#: Extra engine settings per database scheme. SQLite: wait for a writer rather than fail at once when several
#: workers share the file. PostgreSQL: test a pooled connection before use (a restarted database or a dropped
#: idle connection would otherwise fail the next query) and give up connecting after 10 s, not the OS default.
ENGINE_KWARGS = {
    "sqlite": {"connect_args": {"timeout": 60}},
    "postgresql": {"pool_pre_ping": True, "connect_args": {"connect_timeout": 10}},
}
STORAGE_ATTEMPTS = 5
#: How long a write may wait on a database whose driver settings are not set here (MySQL and others).
DEFAULT_WRITE_WAIT_S = 60.0
NO_PRUNING = "none (multi-objective: Optuna prunes single-objective trials only)"


def storage_url(url: str) -> str:
    """The storage URL with a relative SQLite path's folder created (SQLite does not create folders)."""
    parts = urlsplit(url)
    if parts.scheme == "sqlite" and parts.path.startswith("/") and len(parts.path) > 1:
        Path(parts.path[1:]).parent.mkdir(parents=True, exist_ok=True)
    return url


def write_wait(url: str) -> float:
    """The longest one storage write waits before it fails: SQLite's lock timeout, PostgreSQL's connect timeout."""
    args = ENGINE_KWARGS.get(_scheme(url), {}).get("connect_args", {})
    return float(args.get("timeout", args.get("connect_timeout", DEFAULT_WRITE_WAIT_S)))


def _scheme(url: str) -> str:
    """The database of a SQLAlchemy URL: ``postgresql`` for ``postgresql+psycopg://...``."""
    return urlsplit(url).scheme.split("+")[0]


def redacted(url: str) -> str:
    """The URL without a password (or any secret environment value), for tags and logs."""
    return redact_text(url)


def build_storage(cfg: DictConfig) -> optuna.storages.RDBStorage:
    """RDB storage with heartbeats that outlast a failed write; a dead worker's trials are failed, their MLflow runs
    closed, and retried."""
    url = storage_url(str(cfg.tune.storage))
    uri = tracking_uri(cfg)
    max_retry = int(cfg.tune.get("max_retry", 1))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        retry = optuna.storages.RetryHeartbeatStaleTrialCallback(max_retry=max_retry)

    def close_ghost_run(study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
        run_id = trial.user_attrs.get(RUN_ATTR)
        tries = len(trial.system_attrs.get("retry_history", [])) + 1  # counted as the retry callback counts them
        queued = "queued again" if tries <= max_retry else f"not queued again (tune.max_retry={max_retry})"
        log.warning("trial %d (worker %s) stopped beating past tune.grace_period=%s s; marked FAIL, %s", trial.number,
                    trial.user_attrs.get(WORKER_ATTR), cfg.tune.grace_period, queued)  # fmt: skip
        if run_id:
            ghost = TrackedRun(tracking_client(uri), run_id)
            ghost.set_tags({STATE_TAG: "FAIL"})
            ghost.finish("KILLED")
        retry(study, trial)

    check_grace_period(cfg.tune.heartbeat_interval, cfg.tune.get("grace_period"), write_wait(url))
    # Workers started together on a fresh database race to create its tables; the loser sees "table already
    # exists" (or a lock) and simply connects again once the winner is done.
    for attempt in range(STORAGE_ATTEMPTS):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)  # heartbeats
                return SteadyHeartbeatStorage(
                    url,
                    engine_kwargs=ENGINE_KWARGS.get(_scheme(url), {}),
                    heartbeat_interval=cfg.tune.heartbeat_interval,
                    grace_period=cfg.tune.grace_period,
                    heartbeat_stale_trial_callback=close_ghost_run,
                )
        except SQLAlchemyError as error:
            if attempt + 1 == STORAGE_ATTEMPTS:
                raise
            log.info("storage not ready (%s); retrying", redact_text(str(error).splitlines()[0]))
            time.sleep(1.0 + attempt)
    raise AssertionError("unreachable")


def open_study(cfg: DictConfig, storage: optuna.storages.BaseStorage) -> tuple[optuna.Study, bool]:
    """Create the study or load it by name; returns ``(study, created_here)``.

    The sampler seed adds the trials already held and ``tune.worker``, so a restart draws new points instead of
    replaying its first ones, and parallel workers with their own ``tune.worker`` draw different ones.
    """
    name = str(cfg.tune.study)
    goals = study_goals(cfg)
    pruner = instantiate(cfg.pruner, _convert_="all") if goals is None else _no_pruner(cfg)
    args = dict(storage=storage, study_name=name, pruner=pruner)
    wanted = [[g.metric, g.direction] for g in goals] if goals else None
    try:
        if goals is None:
            study = optuna.create_study(**args, direction=cfg.tune.direction, sampler=_sampler(cfg, 0))
        else:
            study = optuna.create_study(**args, directions=[g.direction for g in goals], sampler=_sampler(cfg, 0))
            study.set_user_attr(OBJECTIVES_ATTR, wanted)
        created = True
    except optuna.exceptions.DuplicatedStudyError:
        study = optuna.load_study(**args)
        created = False
        held = study.user_attrs.get(OBJECTIVES_ATTR)
        if goals is not None or held is not None or len(study.directions) > 1:
            # the creator sets the attribute just after creating: a study a moment old may not hold it yet
            directions = [d.name.lower() for d in study.directions]
            if held != wanted and not (held is None and wanted and directions == [d for _, d in wanted]):
                found = f"objectives {held}" if held else f"a single objective ({directions[0]})"
                raise ObjectiveError(f"study {name!r} exists with {found}, not {wanted or 'a single objective'}; "
                                     "choose another tune.study (make tune STUDY=<name>)") from None  # fmt: skip
        elif study.direction.name.lower() != str(cfg.tune.direction):
            raise ValueError(f"study {name!r} exists with direction {study.direction.name.lower()}, "
                             f"not {cfg.tune.direction}; choose another tune.study") from None  # fmt: skip
        study.sampler = _sampler(cfg, len(study.get_trials(deepcopy=False)))
    return study, created


def study_goals(cfg: DictConfig) -> tuple[Goal, ...] | None:
    """The objectives of a multi-objective study (``tune.objectives``), or None for a single-objective one."""
    objectives = cfg.tune.get("objectives")
    return goals_from_config(list(objectives) if objectives is not None and not isinstance(objectives, str)
                             else objectives)  # fmt: skip


def _no_pruner(cfg: DictConfig) -> optuna.pruners.BasePruner:
    """``NopPruner``, saying so when the config asked for a real pruner (``PRUNER=median`` is the default)."""
    asked = str(cfg.pruner.get("_target_", ""))
    if not asked.endswith("NopPruner"):
        log.warning("pruner %s is not used: Optuna cannot prune a multi-objective trial (Trial.report and "
                    "should_prune are single-objective only), so every trial trains all trainer.max_epochs epochs; "
                    "make tune PRUNER=none says the same without this warning", asked.rsplit(".", 1)[-1])  # fmt: skip
    return optuna.pruners.NopPruner()


def _sampler(cfg: DictConfig, existing: int) -> optuna.samplers.BaseSampler:
    seed = int(cfg.tune.seed) + existing + 1009 * int(cfg.tune.worker)
    return instantiate(cfg.tune.sampler, seed=seed, _convert_="all")


def experiment_id(client: MlflowClient, cfg: DictConfig) -> str:
    """The task's experiment, created like a training run would (artifacts under ``mlruns/artifacts``)."""
    return ensure_experiment(client, cfg.tracking.experiment, tracking_uri(cfg), cfg.tracking.artifact_root)


def await_parent(study: optuna.Study, created: bool, wait_s: float = 120.0) -> str | None:
    """The parent run id the study's creator recorded, waiting up to ``wait_s`` for it unless we are the creator.

    Waiting touches only the Optuna storage: two processes initialising a fresh MLflow database at once race in its
    schema migration, so a worker must not open the MLflow store before the creator has.
    """
    deadline = time.monotonic() + (0.0 if created else wait_s)
    while PARENT_ATTR not in study.user_attrs and time.monotonic() < deadline:
        time.sleep(1.0)
    return study.user_attrs.get(PARENT_ATTR)


def parent_run(cfg: DictConfig, study: optuna.Study, run_id: str | None, client: MlflowClient) -> str:
    """The study's parent run: ``run_id`` reopened, or a new one when there is none yet.

    A worker that loads a study without a parent run (its creator died first, or it predates tracking) creates
    one once :func:`await_parent` gave up.
    """
    if run_id is None:
        tags = {KIND_TAG: STUDY_KIND, STUDY_TAG: study.study_name, "task": str(cfg.task.name),
                "optuna.storage": redacted(str(cfg.tune.storage)), "mlflow.source.git.commit": git_commit()}  # fmt: skip
        run = TrackedRun.start(client, experiment_id(client, cfg), f"study-{study.study_name}", tags)
        run_id = run.run_id
        study.set_user_attr(PARENT_ATTR, run_id)
        goals = study.user_attrs.get(OBJECTIVES_ATTR)
        if goals:
            run.set_tags({OBJECTIVES_ATTR: json.dumps(goals), "optuna.pruner": NO_PRUNING})
            settings = {"objectives": goals, "seed": cfg.tune.seed, "pruner_used": NO_PRUNING}
        else:
            settings = {k: cfg.tune[k] for k in ("metric", "direction", "seed")}
        run.log_text(OmegaConf.to_yaml({**settings, "search": cfg.hparams_search, "pruner": cfg.pruner,
                                        "sampler": cfg.tune.sampler}, resolve=True), "study.yaml")  # fmt: skip
        log.info("study %s: parent run %s", study.study_name, run_id)
    else:
        client.update_run(run_id, status="RUNNING")
    return run_id


def fail_stale(study: optuna.Study) -> None:
    """Optuna's ``fail_stale_trials``: a trial silent past the grace period is failed and its callback run."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        optuna.storages.fail_stale_trials(study)


def trials_left(study: optuna.Study, target: int) -> int:
    """How many trials a worker starting now runs (its ``study.optimize(n_trials=...)``): ``target`` less the
    :data:`COUNTED` trials, once a dead worker's trial is failed and queued again."""
    fail_stale(study)
    counted = study.get_trials(deepcopy=False, states=COUNTED)
    if len(counted) < target:
        return target - len(counted)
    running = [t.number for t in counted if t.state == RUNNING]
    alive = (f"; trials {running} still RUNNING (one whose worker died is failed and queued again once silent for "
             "tune.grace_period: a worker started then runs it)") if running else ""  # fmt: skip
    log.info(
        "study %s holds %d trials (tune.trials=%d): nothing to run%s", study.study_name, len(counted), target, alive
    )
    return 0
