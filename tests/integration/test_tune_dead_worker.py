"""A tuning worker killed mid-trial leaves a RUNNING trial nobody will finish; the next worker to start must fail it,
close its MLflow run, retry its parameters and leave a study (and a parent run summary) that says only the truth.
A worker that was only suspended, and comes back after its trial was failed, must drop that trial and go on."""

from __future__ import annotations

import os
import signal
import subprocess
import time

import optuna
import pytest
from mlflow import MlflowClient
from omegaconf import OmegaConf

from tests.tune_support import TINY, prepare_data, study_record, tune_command
from training.tuning.heartbeat import CLOCK_STEP_S
from training.tuning.study import build_storage, fail_stale, trials_left

pytestmark = pytest.mark.e2e  # trains through the real CLI: make test-e2e (docs/development.md)

COMPLETE, FAIL, RUNNING, WAITING = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.FAIL,
                                    optuna.trial.TrialState.RUNNING, optuna.trial.TrialState.WAITING)  # fmt: skip
TRIALS = 2
#: Beat every second and call a trial dead after 2 silent seconds, so nothing here waits on the 150 s default.
INTERVAL_S, GRACE_S = 1, 2
HEARTBEAT = (f"tune.heartbeat_interval={INTERVAL_S}", f"tune.grace_period={GRACE_S}")


def _wait_for(condition, worker: subprocess.Popen, log, deadline_s: float, what: str) -> None:
    deadline = time.monotonic() + deadline_s
    while not condition():
        assert worker.poll() is None, f"worker exited ({worker.returncode}) before {what}:\n{log.read_text()[-5000:]}"
        assert time.monotonic() < deadline, f"no {what} within {deadline_s} s:\n{log.read_text()[-5000:]}"
        time.sleep(0.2)


def test_rerun_after_a_worker_is_killed_mid_trial_finishes_the_study(tmp_path):
    prepare_data(tmp_path)
    env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path}/mlflow.db", "PYTHONUNBUFFERED": "1"}
    marker, first_log = tmp_path / "held", tmp_path / "first.log"
    hold = ("+callbacks.hold._target_=tests.tune_support.HoldFit", f"+callbacks.hold.marker={marker}",
            f"+callbacks.hold.at={TRIALS}")  # fmt: skip
    with first_log.open("w") as out:
        first = subprocess.Popen(tune_command(tmp_path, TRIALS, *TINY, *HEARTBEAT, *hold), env=env, stdout=out,
                                 stderr=subprocess.STDOUT)  # fmt: skip
    try:
        _wait_for(marker.exists, first, first_log, 300, "hold of the last trial")
    finally:
        first.send_signal(signal.SIGKILL)  # kill -9: no handler, no cleanup, the trial just stops beating
        first.wait(timeout=60)

    storage = f"sqlite:///{tmp_path}/optuna.db"
    study = optuna.load_study(study_name="task1-default", storage=storage)
    assert [t.state for t in study.trials] == [COMPLETE, RUNNING]  # the kill landed inside the last trial
    dead = study.trials[-1]

    time.sleep(GRACE_S + CLOCK_STEP_S)  # the killed trial's last beat is now older than the grace period
    second = subprocess.run(tune_command(tmp_path, TRIALS, *TINY, *HEARTBEAT), env=env, capture_output=True,
                            text=True, timeout=600)  # fmt: skip
    assert second.returncode == 0, (second.stdout + second.stderr)[-5000:]

    study = optuna.load_study(study_name="task1-default", storage=storage)
    trials = study.trials
    assert [t.state for t in trials] == [COMPLETE, FAIL, COMPLETE]  # exactly TRIALS complete, nothing RUNNING
    retry = trials[-1]
    assert retry.system_attrs["failed_trial"] == dead.number and retry.params == dead.params  # the point not lost

    client = MlflowClient(env["MLFLOW_TRACKING_URI"])
    ghost = client.get_run(dead.user_attrs["mlflow_run_id"])
    assert (ghost.info.status, ghost.data.tags["optuna.state"]) == ("KILLED", "FAIL")
    assert retry.user_attrs["mlflow_run_id"] != ghost.info.run_id  # the retry trained in a run of its own
    assert client.get_run(retry.user_attrs["mlflow_run_id"]).info.status == "FINISHED"

    (parent,) = client.search_runs([ghost.info.experiment_id], filter_string="tags.`cxrlt.kind` = 'tuning-study'")
    assert parent.info.status == "FINISHED"
    summary = {k.removeprefix("study/n_"): v for k, v in parent.data.metrics.items() if k.startswith("study/n_")}
    assert summary == {"complete": TRIALS, "fail": 1, "running": 0, "waiting": 0, "pruned": 0, "trials": TRIALS + 1}
    assert parent.data.tags["best.mlflow_run_id"] == study.best_trial.user_attrs["mlflow_run_id"]


def _fitting(tmp_path) -> bool:
    """Whether a trial has started fitting (its MLflow run id is on it); the storage is read only once a run's
    checkpoint folder exists, so the test never races the worker to create the storage's tables."""
    runs = tmp_path / "checkpoints"
    if not (runs.is_dir() and any(runs.iterdir())):
        return False
    trials = optuna.load_study(study_name="task1-default", storage=f"sqlite:///{tmp_path}/optuna.db").trials
    return any("mlflow_run_id" in t.user_attrs for t in trials)


def test_a_worker_suspended_past_the_grace_period_drops_its_failed_trial_in_one_line_and_finishes_the_study(
    tmp_path, monkeypatch
):
    prepare_data(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path}/mlflow.db", "PYTHONUNBUFFERED": "1"}
    worker_log, storage = tmp_path / "worker.log", f"sqlite:///{tmp_path}/optuna.db"
    with worker_log.open("w") as out:
        worker = subprocess.Popen(tune_command(tmp_path, 1, *TINY, *HEARTBEAT), env=env, stdout=out,
                                  stderr=subprocess.STDOUT)  # fmt: skip
    try:
        _wait_for(lambda: _fitting(tmp_path), worker, worker_log, 300, "a trial fitting")
        worker.send_signal(signal.SIGSTOP)  # a suspended machine: alive, silent
        try:
            other = optuna.load_study(study_name="task1-default", storage=_storage(tmp_path, grace=2))
            deadline = time.monotonic() + 30
            while not other.get_trials(states=(FAIL,)):  # another worker's dead-worker rule, once it is stale
                assert time.monotonic() < deadline, "the suspended worker's trial was never failed"
                fail_stale(other)
                time.sleep(0.5)
        finally:
            worker.send_signal(signal.SIGCONT)
        worker.wait(timeout=600)
    finally:
        if worker.poll() is None:
            worker.kill()
    output = worker_log.read_text()
    record = study_record(storage, "task1-default", [output])
    assert worker.returncode == 0, record + output[-3000:]  # no "Cannot tell a FAIL trial"
    lines = [line for line in output.splitlines() if "was failed under this worker" in line]
    assert len(lines) == 1 and "trial 0 " in lines[0], record
    trials = optuna.load_study(study_name="task1-default", storage=storage).trials
    assert [t.state for t in trials] == [FAIL, COMPLETE], record  # the retry ran the point here, after the drop
    assert trials[1].system_attrs["failed_trial"] == 0 and trials[1].params == trials[0].params
    ghost = MlflowClient(env["MLFLOW_TRACKING_URI"]).get_run(trials[0].user_attrs["mlflow_run_id"])
    assert (ghost.info.status, ghost.data.tags["optuna.state"]) == ("KILLED", "FAIL")


#: The two tests below drive a study by hand (ask, heartbeats) to stand for workers; Optuna warns that heartbeats
#: are meant for ``optimize``, which is what the real workers use.
by_hand = pytest.mark.filterwarnings("ignore:Heartbeat of storage is supposed to be used:UserWarning")


def _storage(tmp_path, grace: int):
    cfg = OmegaConf.create({"tune": {"storage": f"sqlite:///{tmp_path}/optuna.db", "heartbeat_interval": 1,
                                     "grace_period": grace, "max_retry": 1},
                            "tracking": {"uri": f"sqlite:///{tmp_path}/mlflow.db"}})  # fmt: skip
    return build_storage(cfg)


@by_hand
def test_a_dead_worker_s_trial_counts_until_it_is_stale_then_its_retry_is_left_to_run(tmp_path, monkeypatch, caplog):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    grace = 4  # seconds between the beat and the first count below, even on a loaded machine
    study = optuna.create_study(storage=_storage(tmp_path, grace=grace), study_name="s")
    study.add_trial(optuna.create_trial(state=COMPLETE, value=0.5))
    ghost = study.ask()  # the last slot: its worker beat once, then was killed a moment ago
    ghost.suggest_float("lr", 1e-4, 1e-1, log=True)
    study._storage.record_heartbeat(ghost._trial_id)

    with caplog.at_level("INFO", logger="training.tuning.study"):
        assert trials_left(study, 2) == 0  # not stale yet: a live worker's trial, as far as anyone can tell
    assert "nothing to run; trials [1] still RUNNING" in caplog.text and "tune.grace_period" in caplog.text
    time.sleep(grace + CLOCK_STEP_S + 0.5)
    assert trials_left(study, 2) == 1  # a worker started now fails it and runs its retry
    assert [t.state for t in study.get_trials()] == [COMPLETE, FAIL, WAITING]
