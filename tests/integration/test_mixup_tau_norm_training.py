"""`mixup=mixup|balanced` and `postprocess=tau_norm` through the real training command at smoke size: the runs finish
and record what was used; the tuned tau is logged and is the classifier the stored checkpoint holds; a head that
tau-normalisation cannot rescale is refused in one line before training.

The arithmetic is checked by hand in tests/unit/test_mixup.py and tests/unit/test_tau_norm.py.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest
from mlflow import MlflowClient

from tests.conftest import train_command
from training.runs import load_finished

pytestmark = pytest.mark.e2e  # trains through the real CLI: make test-e2e (docs/development.md)

QUICK = ("debug=smoke", "trainer.enable_progress_bar=false", "tta.enabled=false", "evaluation.perturbation.enabled=false",
         "evaluation.heldout.enabled=false", "evaluation.n_boot=20", "evaluation.plots=false")  # fmt: skip


def _train(tmp: Path, smoke_data, *overrides: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{tmp}/mlflow.db", "PYTHONUNBUFFERED": "1"}
    return subprocess.run(train_command(tmp, *QUICK, f"data.source.root={smoke_data[0]}", *overrides),
                          env=env, capture_output=True, text=True, timeout=900)  # fmt: skip


def _run(tmp: Path):
    client = MlflowClient(f"sqlite:///{tmp}/mlflow.db")
    (run,) = client.search_runs([client.get_experiment_by_name("task1").experiment_id])
    return client, run


@pytest.mark.parametrize("choice", ["mixup", "balanced"])
def test_mixup_trains_at_smoke_size_and_the_run_records_it(choice, smoke_data, tmp_path):
    done = _train(tmp_path, smoke_data, f"mixup={choice}")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    _, run = _run(tmp_path)
    assert run.info.status == "FINISHED"
    assert run.data.params["callbacks.mixup.name"] == choice
    assert float(run.data.params["callbacks.mixup.alpha"]) == 0.2
    assert np.isfinite(run.data.metrics["train/loss"])


def test_tau_norm_logs_its_tau_and_the_stored_head_is_normalised(smoke_data, tmp_path):
    done = _train(tmp_path, smoke_data, "postprocess=tau_norm", "postprocess.metric=val/mF1")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    client, run = _run(tmp_path)
    assert run.info.status == "FINISHED" and run.data.params["postprocess.name"] == "tau_norm"
    tau = run.data.metrics["tau_norm/tau"]
    record = json.loads(Path(client.download_artifacts(run.info.run_id, "postprocess/tau_norm.json",
                                                       str(tmp_path))).read_text())  # fmt: skip
    assert record["tau"] == tau and len(record["grid"]) == 21 and record["metric"] == "val/mF1"
    assert run.data.metrics["tau_norm/val_mF1_chosen"] == max(record["grid"].values())
    # ||w_c / ||w_c||^tau|| = ||w_c||^(1 - tau): the reloaded run's head is the trained one normalised by the tau
    finished = load_finished(run.info.run_id, client)
    norms = finished.network.head.weight.detach().double().norm(dim=1).numpy()
    trained = np.array([record["weight_norms"][name] for name in finished.labels])
    np.testing.assert_allclose(norms, trained ** (1 - tau), rtol=1e-5)


def test_tau_norm_refuses_a_non_linear_head_in_one_line_before_training(smoke_data, tmp_path):
    done = _train(tmp_path, smoke_data, "postprocess=tau_norm", "head=csra")
    assert done.returncode != 0
    assert "postprocess=tau_norm needs a linear head (head=linear); this model's head is CSRAHead" in done.stderr
    assert "Traceback" not in done.stderr
    _, run = _run(tmp_path)
    assert "train/loss" not in run.data.metrics  # refused before the first step
