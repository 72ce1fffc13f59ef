"""Issue 33 (4), end to end: two first trainings started at once on a fresh SQLite store both finish.

Before the store lock (:mod:`training.tracking.store_lock`) one of them crashed in MLflow's schema migration.
Slow (two smoke trainings); ``tests/unit/test_store_creation.py`` checks the store-creation step itself.
"""

from __future__ import annotations

import os
import subprocess

import pytest
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate
from mlflow import MlflowClient

from tests.conftest import PROJECT_ROOT, train_command


@pytest.mark.slow
def test_two_first_trainings_at_once_on_a_fresh_store_both_finish(tmp_path):
    data = tmp_path / "synthetic"
    with initialize_config_dir(str(PROJECT_ROOT / "configs"), version_base="1.3"):
        cfg = compose("train", overrides=["debug=smoke", f"data.source.root={data}"])
    instantiate(cfg.data.source).prepare()  # once, before: the trainings race for the store, not for the data
    env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path}/mlflow.db", "PYTHONUNBUFFERED": "1"}
    trainings = [
        subprocess.Popen(train_command(tmp_path, "debug=smoke", f"data.source.root={data}", f"seed={seed}",
                                       "trainer.enable_progress_bar=false", "evaluation.n_boot=0"),
                         env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for seed in (1, 2)
    ]  # fmt: skip
    outputs = [training.communicate(timeout=900)[0] for training in trainings]
    for training, output in zip(trainings, outputs, strict=True):
        assert training.returncode == 0, output[-3000:]

    client = MlflowClient(env["MLFLOW_TRACKING_URI"])
    runs = client.search_runs([client.get_experiment_by_name("task1").experiment_id])
    assert sorted(run.data.params["seed"] for run in runs) == ["1", "2"]
    assert all(run.info.status == "FINISHED" for run in runs)
