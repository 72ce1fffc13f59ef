"""Two `make tune` workers started at once on one SQLite storage share one study: no lost or duplicated trials (one
over tune.trials at most, when both finish together), and one parent run whose summary matches the study once both
have stopped."""

from __future__ import annotations

import ast
import os
import re
import subprocess

import optuna
import pytest
from mlflow import MlflowClient

from tests.tune_support import TINY, prepare_data, shared_study_trials, study_record, tune_command

pytestmark = pytest.mark.e2e  # trains through the real CLI: make test-e2e (docs/development.md)

TRIALS = 4  # enough for both workers to run trials and for their racing finishes to matter


def test_two_workers_share_one_study(tmp_path):
    prepare_data(tmp_path)
    env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path}/mlflow.db", "PYTHONUNBUFFERED": "1"}
    workers = [
        subprocess.Popen(tune_command(tmp_path, TRIALS, f"tune.worker={k}", *TINY), env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for k in range(2)
    ]  # fmt: skip
    outputs = [worker.communicate(timeout=600)[0] for worker in workers]
    for worker, output in zip(workers, outputs, strict=True):
        assert worker.returncode == 0, output[-5000:]

    storage = f"sqlite:///{tmp_path}/optuna.db"
    study = optuna.load_study(study_name="task1-default", storage=storage)
    record = study_record(storage, "task1-default", outputs)
    trials = shared_study_trials(study, TRIALS, workers=2, record=record)
    assert all(t.state == optuna.trial.TrialState.COMPLETE for t in trials), record

    client = MlflowClient(env["MLFLOW_TRACKING_URI"])
    experiment = client.get_experiment_by_name("task1")
    runs = client.search_runs([experiment.experiment_id])
    parents = [r for r in runs if r.data.tags.get("cxrlt.kind") == "tuning-study"]
    assert len(parents) == 1  # one parent run, however many workers
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parents[0].info.run_id]
    assert sorted(int(r.data.tags["optuna.trial_number"]) for r in children) == [t.number for t in trials]
    assert {t.user_attrs["mlflow_run_id"] for t in trials} == {r.info.run_id for r in children}
    assert {r.data.tags["optuna.worker"] for r in children} == {"0", "1"}  # both workers ran trials
    assert len({str(sorted(t.params.items())) for t in trials}) == len(trials)  # and drew different points

    # The parent run's summary is the finished study's, however the two workers' reports interleaved.
    parent = client.get_run(parents[0].info.run_id)
    best = study.best_trial
    tags = {k: v for k, v in parent.data.tags.items() if k.startswith("best.")}
    expected = {f"best.{k}": str(v) for k, v in best.params.items()}
    assert tags == {**expected, "best.mlflow_run_id": best.user_attrs["mlflow_run_id"]}  # no earlier best's tags
    metrics = parent.data.metrics
    assert metrics["study/n_running"] == 0 and metrics["study/n_complete"] == len(trials)
    assert metrics["best/val/mAP"] == best.value and metrics["best/trial"] == best.number
    finished = sorted(trials, key=lambda t: (t.datetime_complete, t.number))
    running_best = [max(t.value for t in finished[: k + 1]) for k in range(len(trials))]
    history = sorted((m.step, m.value) for m in client.get_metric_history(parent.info.run_id, "best/val/mAP"))
    assert history == list(enumerate(running_best, start=1))  # every step once, none missing

    # What each worker printed last is one trial as the storage held it; the worker that stopped last saw it all.
    printed = [re.search(r"^best val/mAP ([\d.]+) \(trial (\d+)\)(.*?): (\{.*\})$", out, re.M) for out in outputs]
    for found in printed:
        trial = study.trials[int(found[2])]
        assert (round(trial.value, 4), trial.params) == (float(found[1]), ast.literal_eval(found[4])), found[0]
    assert any(int(found[2]) == best.number and not found[3] for found in printed), [f[0] for f in printed]
