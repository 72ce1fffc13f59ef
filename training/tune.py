"""Entry point: ``python -m training.tune task=task1 tune.trials=20 [hparams_search=...] [pruner=...]`` (``make tune``).

Every trial is a normal tracked training run nested under the study's parent run; see :mod:`training.tuning`.
With ``tune.objectives`` (``make tune OBJECTIVES="val/mAP val/group/rare/mAP"``) the study is multi-objective: its
report is the Pareto front (:mod:`training.tuning.pareto`) instead of a best trial.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

import hydra
import optuna
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from training.config_files import CONFIGS
from training.errors import hydra_user_errors, run_hydra_entry
from training.tracking.health import check_reachable
from training.tracking.session import tracking_uri
from training.tracking.tracked_run import TrackedRun
from training.tracking.uri import tracking_client
from training.tuning.heartbeat import optimize_until_done
from training.tuning.pareto import describe_front, log_front, write_front_report
from training.tuning.report import StudyState, log_best, write_report
from training.tuning.space import SearchSpace
from training.tuning.study import COUNTED, await_parent, build_storage, open_study, parent_run, study_goals, trials_left
from training.tuning.trial_run import Objective

log = logging.getLogger(__name__)


def run_study(cfg: DictConfig, overrides: Sequence[str], compose: Callable[[list[str]], DictConfig]) -> optuna.Study:
    """Open (or resume) the study, run trials until it holds ``tune.trials``, and report into the parent run."""
    space = SearchSpace.from_config(cfg.hparams_search)  # a bad space fails before anything is created
    goals = study_goals(cfg)  # so does an unknown objective
    check_reachable(tracking_uri(cfg))  # a stopped tracking server fails in seconds, before any trial starts
    study, created = open_study(cfg, build_storage(cfg))
    existing = await_parent(study, created)  # before any MLflow access (see await_parent)
    client = tracking_client(tracking_uri(cfg))
    parent = parent_run(cfg, study, existing, client)
    metric, target = str(cfg.tune.metric), int(cfg.tune.trials)
    objective = Objective(compose, overrides, space, metric, str(cfg.tune.direction), parent, study.study_name,
                          int(cfg.tune.worker), goals=goals)  # fmt: skip

    def report(study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
        """After each trial: the front of a multi-objective study, the best so far of a single-objective one."""
        if goals:
            log_front(study, client, parent)
        else:
            log_best(study, client, parent, metric)

    status = "FINISHED"
    try:
        # A trial of this worker that another failed under it (training.tuning.heartbeat) is dropped with one line.
        optimize_until_done(
            study, objective, lambda study: trials_left(study, target), cfg.tune.timeout,
            catch=(Exception,),  # a failed trial (diverged, bad combination) is recorded; the study goes on
            gc_after_trial=True,
            callbacks=[optuna.study.MaxTrialsCallback(target, states=COUNTED), report],
        )  # fmt: skip
    except BaseException:
        status = "KILLED"
        raise
    finally:
        front = (
            write_front_report(study, client, parent, goals) if goals else write_report(study, client, parent, metric)
        )
        TrackedRun(client, parent).finish(status)
    # One fresh read of the storage for both lines: other workers may still be finishing trials, and a best
    # pieced together from several reads could name one trial with another's value.
    state = StudyState.read(study)
    log.info("study %s: %s; parent run %s", study.study_name, state.counts(), parent)
    if goals:
        for line in describe_front(front, goals):
            log.info("%s", line)
        log.info("next: `make register TASK=%s ARGS=--pareto-front` registers the front's trial nearest the utopia "
                 "point (docs/tuning-registry-submission.md, Multi-objective tuning)", cfg.task.name)  # fmt: skip
        return study
    best = state.describe_best(metric)
    if best is not None:
        log.info("%s", best)
        # A debug preset's trials are debug runs, which make register ranks only when asked to.
        debug = " ARGS=--include-debug" if OmegaConf.select(cfg, "data.debug_size", default=None) is not None else ""
        log.info("next: `make register TASK=%s%s` registers the best finished run (the full evaluation first, if it "
                 "is a trial); `make optuna-dashboard` explores the study", cfg.task.name, debug)  # fmt: skip
    return study


@hydra.main(config_path=str(CONFIGS), config_name="tune", version_base="1.3")
@hydra_user_errors()
def main(cfg: DictConfig) -> None:
    overrides = list(HydraConfig.get().overrides.task)
    run_study(cfg, overrides, lambda extra: hydra.compose(config_name="tune", overrides=extra))


if __name__ == "__main__":
    run_hydra_entry(main, "tune")
