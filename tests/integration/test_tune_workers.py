"""Two `make tune` workers started at once on one SQLite storage share one study: no lost or duplicated trials."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import optuna
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate
from mlflow import MlflowClient

from tests.tune_support import trained_trials, tune_command

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
TRIALS = 6
TINY = ("debug=smoke", "data.subset={train:64,val:48,test:32}", "trainer.max_epochs=1", "evaluation.n_boot=0",
        "evaluation.per_source=false", "pruner=none")  # fmt: skip


def test_two_workers_share_one_study(tmp_path):
    # Generate the data first: two fresh workers would otherwise both generate the same set at once.
    with initialize_config_dir(str(CONFIGS), version_base="1.3"):
        cfg = compose("tune", overrides=["debug=smoke", f"data.source.root={tmp_path}/synthetic"])
    instantiate(cfg.data.source).prepare()
    env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path}/mlflow.db", "PYTHONUNBUFFERED": "1"}
    workers = [
        subprocess.Popen(tune_command(tmp_path, TRIALS, f"tune.worker={k}", *TINY), env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for k in range(2)
    ]  # fmt: skip
    outputs = [worker.communicate(timeout=600)[0] for worker in workers]
    for worker, output in zip(workers, outputs, strict=True):
        assert worker.returncode == 0, output[-5000:]

    study = optuna.load_study(study_name="task1-default", storage=f"sqlite:///{tmp_path}/optuna.db")
    trials = trained_trials(study, TRIALS)
    assert sorted(t.number for t in trials) == list(range(TRIALS))  # none lost, none duplicated, no extra
    assert all(t.state == optuna.trial.TrialState.COMPLETE for t in trials)

    client = MlflowClient(env["MLFLOW_TRACKING_URI"])
    experiment = client.get_experiment_by_name("task1")
    runs = client.search_runs([experiment.experiment_id])
    parents = [r for r in runs if r.data.tags.get("cxrlt.kind") == "tuning-study"]
    assert len(parents) == 1  # one parent run, however many workers
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parents[0].info.run_id]
    assert sorted(int(r.data.tags["optuna.trial_number"]) for r in children) == list(range(TRIALS))
    assert {t.user_attrs["mlflow_run_id"] for t in trials} == {r.info.run_id for r in children}
    assert {r.data.tags["optuna.worker"] for r in children} == {"0", "1"}  # both workers ran trials
    assert len({str(sorted(t.params.items())) for t in trials}) == TRIALS  # and drew different points
