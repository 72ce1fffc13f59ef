"""A dead worker's trial: failed by heartbeat, its MLflow run closed, queued again; the budget counts its retry."""

from __future__ import annotations

import time

import optuna
from mlflow import MlflowClient
from omegaconf import OmegaConf

from training.tuning.study import COUNTED, ENGINE_KWARGS, build_storage, redacted, trials_left

WAITING, FAIL, COMPLETE = (optuna.trial.TrialState.WAITING, optuna.trial.TrialState.FAIL,
                           optuna.trial.TrialState.COMPLETE)  # fmt: skip


def _cfg(tmp_path, storage: str):
    return OmegaConf.create({
        "tune": {"storage": storage, "heartbeat_interval": 1, "grace_period": 1, "max_retry": 1},
        "tracking": {"uri": f"sqlite:///{tmp_path}/mlflow.db"},
    })  # fmt: skip


def test_stale_trial_is_failed_its_run_killed_and_its_parameters_queued_again(tmp_path, monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    cfg = _cfg(tmp_path, f"sqlite:///{tmp_path}/optuna.db")
    client = MlflowClient(cfg.tracking.uri)
    run_id = client.create_run(client.create_experiment("t")).info.run_id
    study = optuna.create_study(storage=build_storage(cfg), study_name="s")
    ghost = study.ask()  # a worker started this trial...
    ghost.suggest_float("lr", 1e-4, 1e-1, log=True)
    ghost.set_user_attr("mlflow_run_id", run_id)
    study._storage.record_heartbeat(ghost._trial_id)  # ...beat once, then was SIGKILLed
    time.sleep(cfg.tune.grace_period + 1.5)  # past the grace period, and the storage clock's one-second step

    assert trials_left(study, 1) == 1  # what a worker asks first: the ghost failed, its retry is left to run
    first, retry = study.get_trials()
    assert first.state == FAIL and retry.state == WAITING
    assert retry.params == first.params and retry.system_attrs["failed_trial"] == 0
    assert client.get_run(run_id).info.status == "KILLED"
    assert client.get_run(run_id).data.tags["optuna.state"] == "FAIL"


def test_the_budget_counts_complete_pruned_and_running_trials_and_optuna_stops_there():
    study = optuna.create_study()
    study.add_trial(optuna.create_trial(state=FAIL))  # not counted: replaced by a new point
    study.add_trial(optuna.create_trial(state=optuna.trial.TrialState.PRUNED, value=None, intermediate_values={0: 0.1}))
    study.add_trial(optuna.create_trial(state=COMPLETE, value=0.5))
    assert trials_left(study, 4) == 2
    # Optuna's loop with its own callback as the study-wide limit (n_trials, this worker's, is a safety net)
    study.optimize(lambda trial: 0.7, n_trials=5, callbacks=[optuna.study.MaxTrialsCallback(4, states=COUNTED)])
    assert len(study.trials) == 5 and trials_left(study, 4) == 0


def test_postgresql_storage_gets_pre_ping_and_a_connect_timeout_and_its_password_is_redacted():
    assert ENGINE_KWARGS["postgresql"]["pool_pre_ping"] is True
    assert ENGINE_KWARGS["postgresql"]["connect_args"]["connect_timeout"] > 0
    assert redacted("postgresql://optuna:pw-123@db:5432/optuna") == "postgresql://optuna:***@db:5432/optuna"


def test_a_queued_retry_is_run_though_its_failed_original_was_counted_before():
    study = optuna.create_study()
    study.add_trial(optuna.create_trial(state=FAIL))  # trial 0, its worker died
    study.add_trial(optuna.create_trial(state=COMPLETE, value=0.3))
    study.add_trial(
        optuna.create_trial(state=WAITING, system_attrs={"failed_trial": 0, "retry_history": [0]})
    )  # fmt: skip
    assert trials_left(study, 2) == 1
    study.optimize(lambda trial: 0.9, n_trials=trials_left(study, 2))
    assert [t.state for t in study.trials] == [FAIL, COMPLETE, COMPLETE]  # the retry ran; no third point drawn
