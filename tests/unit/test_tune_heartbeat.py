"""A live trial is never declared dead by another worker; a worker whose trial was failed under it goes on cleanly.

Two workers are two storages (two engines) on one SQLite study in one process: worker A runs Optuna's own
``optimize`` loop, with its heartbeat thread, in a thread; the test plays worker B, applying the dead-worker rule
(``fail_stale``) as often as a busy worker would. A database fault is injected into A's engine only, through
SQLAlchemy's cursor events, so A's heartbeat writes fail exactly as they do when the database is locked or
restarting. Heartbeats beat every second here and the grace period is seconds, so each test takes seconds.
"""

from __future__ import annotations

import logging
import threading
import time

import optuna
import pytest
from omegaconf import OmegaConf
from sqlalchemy import event
from sqlalchemy.exc import OperationalError

from training.config_files import CONFIGS
from training.tuning.heartbeat import TrialTakenOver, ensure_running, min_grace_period, optimize_until_done
from training.tuning.study import COUNTED, ENGINE_KWARGS, build_storage, fail_stale, trials_left, write_wait

COMPLETE, FAIL = optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.FAIL


def _cfg(tmp_path, grace: int):
    return OmegaConf.create({
        "tune": {"storage": f"sqlite:///{tmp_path}/optuna.db", "heartbeat_interval": 1, "grace_period": grace,
                 "max_retry": 1},
        "tracking": {"uri": f"sqlite:///{tmp_path}/mlflow.db"},
    })  # fmt: skip


def _fail_heartbeat_writes(storage, count: int) -> list[float]:
    """Make the next ``count`` heartbeat updates on ``storage``'s engine fail as a locked database does; returns the
    times they failed at (monotonic), so a test can tell when the faults were spent."""
    failed: list[float] = []

    def locked(conn, cursor, statement, parameters, context, executemany):
        if statement.lstrip().upper().startswith("UPDATE TRIAL_HEARTBEATS") and len(failed) < count:
            failed.append(time.monotonic())
            raise OperationalError(statement, parameters, Exception("database is locked"))

    event.listen(storage.engine, "before_cursor_execute", locked)
    return failed


def _watch(other: optuna.Study, worker: threading.Thread) -> None:
    """Worker B: the dead-worker rule, twice a second, for as long as worker A runs."""
    while worker.is_alive():
        fail_stale(other)
        time.sleep(0.5)


@pytest.mark.filterwarnings("ignore::optuna.exceptions.ExperimentalWarning")
def test_a_live_trial_whose_heartbeat_write_failed_once_is_not_declared_dead(tmp_path, monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    cfg = _cfg(tmp_path, grace=4)  # min_grace_period(1 s, a fault that fails at once) is 3 s: one second to spare
    mine = build_storage(cfg)
    study = optuna.create_study(storage=mine, study_name="s")
    other = optuna.load_study(study_name="s", storage=build_storage(cfg))
    faults = _fail_heartbeat_writes(mine, count=1)  # the second beat: the first one inserts the heartbeat row
    errors: list[BaseException] = []

    def slow_trial(trial: optuna.Trial) -> float:
        time.sleep(9)  # a slow step: well past the grace period after the lost beat
        return 0.5

    def run() -> None:
        try:
            study.optimize(slow_trial, n_trials=1)
        except BaseException as error:  # noqa: BLE001 - whatever ended worker A is the finding
            errors.append(error)

    worker = threading.Thread(target=run)
    worker.start()
    _watch(other, worker)
    worker.join()

    assert faults, "no heartbeat write was made to fail"
    assert not errors, f"worker A ended with {errors[0]!r}"  # e.g. ValueError('Cannot tell a FAIL trial.')
    assert [t.state for t in other.get_trials()] == [COMPLETE]  # not failed, and so no retry queued


@pytest.mark.filterwarnings("ignore::optuna.exceptions.ExperimentalWarning")
def test_a_worker_whose_trial_was_failed_under_it_says_so_once_and_runs_the_retry(tmp_path, monkeypatch, caplog):
    """A worker cut off from the database past the grace period looks dead to the others: its trial is failed and
    queued again. When it comes back it must not crash on Optuna's refusal to finish a FAIL trial: it drops the
    trial with one line and goes on, here by running the queued retry itself."""
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    cfg = _cfg(tmp_path, grace=2)
    mine = build_storage(cfg)
    study = optuna.create_study(storage=mine, study_name="s")
    other = optuna.load_study(study_name="s", storage=build_storage(cfg))
    faults = _fail_heartbeat_writes(mine, count=5)  # every beat for 5 s, then the database is back
    errors: list[BaseException] = []

    def objective(trial: optuna.Trial) -> float:
        x = trial.suggest_float("x", 0.0, 1.0)
        while len(faults) < 5:  # a step that lasts as long as the outage
            time.sleep(0.2)
        time.sleep(1.5)  # the dead-worker rule's next pass has run
        ensure_running(trial)  # what the trial's recorder asks after each validation
        return x

    def run() -> None:
        try:
            with caplog.at_level(logging.WARNING, logger="training.tuning.heartbeat"):
                optimize_until_done(study, objective, lambda s: trials_left(s, 1), timeout=None,
                                    callbacks=[optuna.study.MaxTrialsCallback(1, states=COUNTED)])  # fmt: skip
        except BaseException as error:  # noqa: BLE001
            errors.append(error)

    worker = threading.Thread(target=run)
    worker.start()
    _watch(other, worker)
    worker.join()

    assert not errors, f"worker A ended with {errors[0]!r}"
    first, retry = other.get_trials()
    assert (first.state, retry.state) == (FAIL, COMPLETE)
    assert retry.system_attrs["failed_trial"] == first.number and retry.params == first.params
    lines = [r.getMessage() for r in caplog.records if r.name == "training.tuning.heartbeat"]
    taken = [line for line in lines if "trial 0" in line and "failed under this worker" in line]
    assert len(taken) == 1 and "\n" not in taken[0], lines


def test_ensure_running_lets_a_running_trial_go_on_and_stops_a_failed_one():
    study = optuna.create_study()
    trial = study.ask()
    ensure_running(trial)  # RUNNING: nothing happens
    study.tell(trial, state=FAIL)
    with pytest.raises(TrialTakenOver, match="trial 0 was failed under this worker"):
        ensure_running(trial)
    assert not issubclass(TrialTakenOver, Exception)  # past Optuna's catch, which would try to finish the trial


def test_the_default_grace_period_outlasts_one_heartbeat_lost_to_the_slowest_write():
    tune = OmegaConf.load(CONFIGS / "tune.yaml").tune
    for scheme in ENGINE_KWARGS:
        wait = write_wait(f"{scheme}://x")
        assert tune.grace_period >= min_grace_period(tune.heartbeat_interval, wait), scheme
    assert min_grace_period(30, 60) > 2 * 30 + 60  # two intervals and the whole wait, plus the clock's step


def test_a_grace_period_a_live_worker_could_outlast_is_named_when_the_storage_opens(tmp_path, monkeypatch, caplog):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    cfg = _cfg(tmp_path, grace=3)
    with caplog.at_level(logging.WARNING):
        build_storage(cfg)
    (warning,) = [r.getMessage() for r in caplog.records if "tune.grace_period=3" in r.getMessage()]
    assert f"{min_grace_period(1, 60):.0f} s" in warning and "\n" not in warning
    caplog.clear()
    cfg.tune.grace_period = min_grace_period(1, 60)
    with caplog.at_level(logging.WARNING):
        build_storage(cfg)
    assert not [r for r in caplog.records if "grace_period" in r.getMessage()]
