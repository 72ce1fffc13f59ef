"""`calibration=per_class` end to end: fitted on validation, logged before/after, and carried by the stored
checkpoint into every reload (evaluate, submit, the served model) and into ``predictions/test.csv``."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from mlflow import MlflowClient

from apps.evaluate import evaluate_run
from evaluation.suite import compute_suite
from evaluation.tta import TTAPredictor
from tests.conftest import train_command
from training.pipeline import build_datamodule
from training.runs import load_finished

pytestmark = pytest.mark.e2e  # trains through the real CLI: make test-e2e (docs/development.md)


@pytest.fixture(scope="module")
def calibrated_run(tmp_path_factory, smoke_data):
    tmp = tmp_path_factory.mktemp("temperature")
    env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{tmp}/mlflow.db", "PYTHONUNBUFFERED": "1"}
    done = subprocess.run(
        train_command(tmp, "debug=smoke", "calibration=per_class", f"data.source.root={smoke_data[0]}",
                      "trainer.enable_progress_bar=false", "tta.enabled=false",
                      "evaluation.perturbation.enabled=false"),
        env=env, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    client = MlflowClient(env["MLFLOW_TRACKING_URI"])
    (run,) = client.search_runs([client.get_experiment_by_name("task1").experiment_id])
    return tmp, client, run


def _artifact(client, run_id: str, path: str, folder: Path) -> Path:
    return Path(client.download_artifacts(run_id, path, str(folder)))


def test_validation_ece_falls_and_the_report_shows_before_and_after(calibrated_run, tmp_path):
    _, client, run = calibrated_run
    metrics = run.data.metrics
    assert run.info.status == "FINISHED"
    assert metrics["calibration/applied"] == 1.0
    assert metrics["val/calibration/mECE_after"] < metrics["val/calibration/mECE_before"]
    assert metrics["val/calibration/nll_after"] <= metrics["val/calibration/nll_before"] + 1e-9
    # The applied side is the suite's own test/mECE: the scaled model is what was scored.
    assert metrics["test/calibration/mECE_after"] == pytest.approx(metrics["test/mECE"], abs=1e-9)
    assert {"test/calibration/mECE_before", "test/calibration/ECE_pooled_after"} <= set(metrics)
    report = _artifact(client, run.info.run_id, "evaluation/report.md", tmp_path).read_text()
    assert "## Calibration (temperature scaling)" in report and "Temperature scaling applied (per_class" in report
    record = json.loads(_artifact(client, run.info.run_id, "calibration/temperature.json", tmp_path).read_text())
    assert record["mode"] == "per_class" and record["applied"] is True


def test_the_temperature_travels_with_the_checkpoint_into_reloads_and_predictions(calibrated_run, tmp_path):
    _, client, run = calibrated_run
    run_id = run.info.run_id
    record = json.loads(_artifact(client, run_id, "calibration/temperature.json", tmp_path).read_text())
    finished = load_finished(run_id, client)
    network, labels = finished.network, finished.labels
    stored = network.logit_temperature.clone()
    np.testing.assert_allclose(stored.numpy(), [record["temperature"][name] for name in labels], rtol=1e-6)
    assert not torch.equal(stored, torch.ones_like(stored))

    datamodule = build_datamodule(finished.config)
    datamodule.prepare_data()
    datamodule.setup("test")
    loader = datamodule.eval_dataloader("test")
    scaled = TTAPredictor(["identity"]).predict_logits(network, loader)[0]
    with torch.no_grad():
        network.logit_temperature.fill_(1.0)
    plain = TTAPredictor(["identity"]).predict_logits(network, loader)[0]
    np.testing.assert_allclose(scaled, plain / stored.numpy(), rtol=1e-5, atol=1e-6)

    frame = pd.read_csv(_artifact(client, run_id, "predictions/test.csv", tmp_path), dtype={"image_id": str})
    np.testing.assert_allclose(frame[labels].to_numpy(), torch.sigmoid(torch.tensor(scaled)).numpy(), atol=1e-6)

    # Real model outputs: a positive scale per class changes no ranking, so AP and AUROC per class are unchanged.
    # Exactly so in float64; the stored float32 probabilities may merge near-ties, so they are held to the order.
    targets = datamodule.datasets["test"].targets.numpy()
    z, t = plain.astype(np.float64), stored.numpy().astype(np.float64)
    before = compute_suite(targets, 1 / (1 + np.exp(-z)), labels=labels, n_boot=0).metrics
    after = compute_suite(targets, 1 / (1 + np.exp(-z / t)), labels=labels, n_boot=0).metrics
    for key in (k for k in before if k.startswith(("ap/", "auroc/"))):
        assert after[key] == pytest.approx(before[key], abs=1e-12), key
    stored_probs = frame[labels].to_numpy()
    for c in range(len(labels)):
        order = np.argsort(z[:, c], kind="stable")
        assert np.all(np.diff(stored_probs[order, c]) >= 0), labels[c]
    scored = compute_suite(targets, stored_probs, labels=labels, n_boot=0).metrics
    assert scored["mAP"] == pytest.approx(before["mAP"], abs=1e-3)


def test_make_evaluate_refits_the_same_temperature(calibrated_run):
    _, client, run = calibrated_run
    finished = load_finished(run.info.run_id, client)
    metrics = evaluate_run(run.info.run_id, finished.config.evaluation, finished.config.tta, client)
    assert metrics["calibration/applied"] == 1.0
    assert metrics["calibration/temperature_mean"] == pytest.approx(run.data.metrics["calibration/temperature_mean"],
                                                                     rel=1e-5)  # fmt: skip
    assert metrics["test/mAP"] == pytest.approx(run.data.metrics["test/mAP"], abs=1e-6)
