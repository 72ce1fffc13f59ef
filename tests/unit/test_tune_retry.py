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


def test_two_workers_racing_for_the_last_slot_train_it_once():
    study = optuna.create_study()
    for value in (0.1, 0.2):
        study.add_trial(optuna.create_trial(state=COMPLETE, value=value))
    budget = TrialBudget(target=3)
    # Both workers finished a trial at the same instant: each saw one free slot and asked for a trial.
    first, second = study.ask(), study.ask()
    assert budget.admits(study, first.number) and not budget.admits(study, second.number)
    # Asked in either order, the answer is the same: the slot belongs to the lower number.
    assert not budget.admits(study, second.number) and budget.admits(study, first.number)


def test_a_queued_retry_is_admitted_even_when_every_slot_is_used():
    study = optuna.create_study()
    study.add_trial(optuna.create_trial(state=FAIL))  # trial 0, its worker died
    study.add_trial(optuna.create_trial(state=COMPLETE, value=0.3))
    study.add_trial(
        optuna.create_trial(state=WAITING, system_attrs={"failed_trial": 0, "retry_history": [0]})
    )  # fmt: skip
    budget = TrialBudget(target=2)
    retry = study.ask()  # pops the queued retry
    assert retry.number == 2 and budget.admits(study, retry.number)
    assert not budget.admits(study, study.ask().number)  # a new original would be a third trial


def test_a_surplus_trial_ends_pruned_untrained_and_the_worker_stops(tmp_path):
    from training.tuning.trial_run import SURPLUS_ATTR, Objective
    from training.tuning.report import state_counts

    study = optuna.create_study()
    study.add_trial(optuna.create_trial(state=COMPLETE, value=0.4))
    study.add_trial(optuna.create_trial(state=optuna.trial.TrialState.RUNNING))  # the other worker's last trial
    budget = TrialBudget(target=2)

    def compose(overrides):
        raise AssertionError("a surplus trial must not compose a training config")

    objective = Objective(compose, [], None, "val/mAP", "maximize", "parent", "s", admits=budget.admits)
    study.optimize(objective, n_trials=3, callbacks=[budget])
    surplus = study.trials[-1]
    assert len(study.trials) == 3  # the worker stopped after its surplus trial
    assert surplus.state == optuna.trial.TrialState.PRUNED and surplus.user_attrs[SURPLUS_ATTR] is True
    assert budget_count(study) == 2 and remaining(study, 2) == 0
    assert state_counts(study) == {"COMPLETE": 1, "RUNNING": 1, "SURPLUS": 1}
