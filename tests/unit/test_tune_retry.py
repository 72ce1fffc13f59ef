"""A dead worker's trial: failed by heartbeat, its MLflow run closed, queued again; the budget counts it once."""

from __future__ import annotations

import time

import optuna
from mlflow import MlflowClient
from omegaconf import OmegaConf

from training.tuning.study import ENGINE_KWARGS, TrialBudget, budget_count, build_storage, redacted, remaining

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
    time.sleep(2.5)  # past the grace period

    budget = TrialBudget(target=1)
    budget(study, study.trials[0])  # what a surviving worker runs after each of its trials
    first, retry = study.get_trials()
    assert first.state == FAIL and retry.state == WAITING
    assert retry.params == first.params and retry.system_attrs["failed_trial"] == 0
    assert not study._stop_flag  # the queued retry is still to run: the worker must not stop
    assert client.get_run(run_id).info.status == "KILLED"
    assert client.get_run(run_id).data.tags["optuna.state"] == "FAIL"
    assert budget_count(study) == 1 and remaining(study, 1) == 0  # the retry replaces the failed trial


def test_budget_counts_running_and_plain_failed_trials_but_not_replaced_ones():
    study = optuna.create_study()
    study.add_trial(optuna.create_trial(state=FAIL))  # trial 0: replaced by trial 2
    study.add_trial(optuna.create_trial(state=FAIL))  # trial 1: an ordinary failure, counts
    study.add_trial(
        optuna.create_trial(state=COMPLETE, value=0.5, system_attrs={"failed_trial": 0, "retry_history": [0]})
    )
    assert budget_count(study) == 2
    # Optuna's optimize loop with the budget as its only limit (n_trials is a safety net): one more trial reaches 3
    study.optimize(lambda trial: 0.7, n_trials=5, callbacks=[TrialBudget(target=3)])
    assert len(study.trials) == 4 and budget_count(study) == 3


def test_postgresql_storage_gets_pre_ping_and_a_connect_timeout_and_its_password_is_redacted():
    assert ENGINE_KWARGS["postgresql"]["pool_pre_ping"] is True
    assert ENGINE_KWARGS["postgresql"]["connect_args"]["connect_timeout"] > 0
    assert redacted("postgresql://optuna:pw-123@db:5432/optuna") == "postgresql://optuna:***@db:5432/optuna"
