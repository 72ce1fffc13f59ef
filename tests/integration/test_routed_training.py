"""`model=routed_regnetx_004 debug=smoke` through the real CLI: the routed run trains, tests, logs the router's
accuracy, and a reload of the finished run routes to the same predictions the test phase stored."""

from __future__ import annotations

import os
import subprocess

import numpy as np
import pandas as pd
import pytest
import torch
from mlflow import MlflowClient

from tests.conftest import train_command
from training.data.findings import TASK1_LABELS
from training.models.routed import ViewRoutedClassifier
from training.pipeline import build_datamodule
from training.runs import load_finished

pytestmark = pytest.mark.e2e  # trains through the real CLI: make test-e2e (docs/development.md)


@pytest.fixture(scope="module")
def routed_run(tmp_path_factory, smoke_data):
    tmp = tmp_path_factory.mktemp("routed")
    env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{tmp}/mlflow.db", "PYTHONUNBUFFERED": "1"}
    done = subprocess.run(
        train_command(tmp, "task=task1", "debug=smoke", "model=routed_regnetx_004", f"data.source.root={smoke_data[0]}",
                      "trainer.enable_progress_bar=false"),
        env=env, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    client = MlflowClient(env["MLFLOW_TRACKING_URI"])
    (run,) = client.search_runs([client.get_experiment_by_name("task1").experiment_id])
    return tmp, client, run


def test_the_routed_run_finishes_with_test_metrics_and_the_router_accuracy(routed_run):
    _, _, run = routed_run
    assert run.info.status == "FINISHED"
    metrics = run.data.metrics
    assert {"val/mAP", "test/mAP", "test_tta/mAP"} <= set(metrics)
    # The synthetic set has PA and AP films, so the router was scored on known views.
    assert 0.0 <= metrics["val/router_accuracy"] <= 1.0
    assert run.data.params["model.module"] == "training.models.routed.ViewRoutedClassifier"


def test_a_reloaded_routed_run_reproduces_the_stored_test_predictions(routed_run, tmp_path):
    _, client, run = routed_run
    finished = load_finished(run.info.run_id, client)
    network = finished.network
    assert isinstance(network, ViewRoutedClassifier) and not network.training
    assert list(network.experts) == ["PA", "AP", "LATERAL"]
    datamodule = build_datamodule(finished.config)
    datamodule.setup("test")
    frame = datamodule.split_frame("test")
    with torch.no_grad():
        probs = torch.cat([torch.sigmoid(network(b["image"])) for b in datamodule.eval_dataloader("test")]).numpy()
    stored = pd.read_csv(client.download_artifacts(run.info.run_id, "predictions/test.csv", str(tmp_path)))
    stored = stored.set_index("image_id").loc[frame["image_id"], list(TASK1_LABELS)].to_numpy()
    np.testing.assert_allclose(probs, stored, atol=1e-5)
