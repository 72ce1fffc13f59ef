"""`debug=smoke` end to end through the real CLI: keys, artifacts, and two runs side by side in the MLflow UI."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pandas as pd
import pytest
import torch
from mlflow import MlflowClient

from tests.conftest import free_port, stop_process_group, train_command, wait_for_http
from training.data.findings import TASK1_LABELS
from training.data.manifest import file_fingerprint

pytestmark = pytest.mark.e2e  # trains through the real CLI: make test-e2e (docs/development.md)

MODELS = ("regnetx_004", "resnet18")


@pytest.fixture(scope="module")
def smoke_runs(tmp_path_factory, smoke_data):
    """Two smoke runs differing only in ``model=``, sharing one store and the session's generated data set."""
    tmp = tmp_path_factory.mktemp("smoke")
    env = {"MLFLOW_TRACKING_URI": f"sqlite:///{tmp}/mlflow.db", "PYTHONUNBUFFERED": "1"}
    env = {**os.environ, **env}
    outputs = {}
    for model in MODELS:
        started = time.perf_counter()
        done = subprocess.run(  # stdout a pipe, not a terminal: progress is one line per epoch
            train_command(tmp, "debug=smoke", f"model={model}", f"data.source.root={smoke_data[0]}"),
            env=env, capture_output=True, text=True, timeout=900,
        )  # fmt: skip
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        outputs[model] = (done, time.perf_counter() - started)
    client = MlflowClient(env["MLFLOW_TRACKING_URI"])
    return tmp, client, outputs


def _runs(client):
    experiment = client.get_experiment_by_name("task1")
    return {run.data.params["model.name"]: run for run in client.search_runs([experiment.experiment_id])}


def test_smoke_run_logs_the_contracted_keys(smoke_runs, smoke_data):
    tmp, client, _ = smoke_runs
    runs = _runs(client)
    assert set(runs) == set(MODELS)
    run = runs["regnetx_004"]
    assert run.info.status == "FINISHED"
    assert run.info.run_name == f"debug-regnetx_004-bce-random-s42-{run.data.tags['cxrlt.run_key'][:6]}"
    params, metrics, tags = run.data.params, run.data.metrics, run.data.tags
    assert params["model.backbone"] == "regnetx_004" and params["loss._target_"].endswith("BCELoss")
    assert params["trainer.max_epochs"] == "1"
    for key in ("train/loss", "val/mAP", "val/mAUROC", "test/mAP", "test/mAUROC", "test/prevalence_baseline_mAP",
                "test/mAP_ci_low", "test/mAP_ci_high", "test/mF1", "test/mPrecision", "test/mRecall", "test/mECE",
                "test/mF1_valthr", "test_tta/mAP", "test_perturbed/mAP", "test_perturbed/delta/mAP",
                "test/source/centre_a/mAP", "test/source/centre_b/mAP_ci_low", "best_epoch"):  # fmt: skip
        assert key in metrics, key
    assert metrics["test/mAP_ci_low"] <= metrics["test/mAP"] <= metrics["test/mAP_ci_high"]
    assert metrics["test_perturbed/delta/mAP"] == pytest.approx(metrics["test_perturbed/mAP"] - metrics["test/mAP"])
    assert any(key.startswith("test/group/") and key.endswith("/mAP") for key in metrics)
    assert any(key.startswith("val/group/") for key in metrics)
    assert {f"test/ap/{name}" for name in TASK1_LABELS} <= set(metrics)
    assert len(client.get_metric_history(run.info.run_id, "val/mAP")) == 1
    assert tags["task"] == "task1" and tags["data_source"] == "synthetic" and tags["synthetic_data"] == "true"
    assert tags["mlflow.source.git.commit"]
    assert tags["dataset_fingerprint"] == file_fingerprint(smoke_data[1])


def test_a_piped_training_prints_a_progress_line_per_epoch_and_each_lightning_line_once(smoke_runs):
    _, _, outputs = smoke_runs
    done, _ = outputs["regnetx_004"]
    printed = done.stdout + done.stderr
    progress = r"^epoch (\d+)/0: \d+\.\d step/s, train/loss \d\.\d{4}, val/mAP \d\.\d{4}, ETA 0:00:00$"
    assert re.findall(progress, done.stdout, re.MULTILINE) == ["0"], printed[-3000:]  # debug=smoke: one epoch
    assert printed.count("Seed set to 42") == 1 and "INFO: " not in printed, printed[:3000]


def test_smoke_run_stores_one_checkpoint_config_and_predictions(smoke_runs, smoke_data, tmp_path):
    tmp, client, _ = smoke_runs
    run = _runs(client)["regnetx_004"]
    run_id = run.info.run_id
    top = {a.path for a in client.list_artifacts(run_id)}
    assert {"config.yaml", "checkpoints", "predictions", "evaluation"} <= top
    evaluation = {a.path.split("/")[-1] for a in client.list_artifacts(run_id, "evaluation")}
    assert {"report.md", "metrics.json", "pr_curves.png", "reliability.png", "head_to_tail.png",
            "perturbation_deltas.png"} <= evaluation  # fmt: skip
    splits = {a.path.split("/")[-1] for a in client.list_artifacts(run_id, "predictions")}
    assert splits == {"val.csv", "test.csv", "test_tta.csv", "test_perturbed.csv", "heldout.csv"}
    checkpoints = client.list_artifacts(run_id, "checkpoints")
    assert [a.path for a in checkpoints] == ["checkpoints/best.ckpt"]
    config = client.download_artifacts(run_id, "config.yaml", str(tmp_path))
    assert "backbone: regnetx_004" in Path(config).read_text()
    predictions = pd.read_csv(client.download_artifacts(run_id, "predictions/test.csv", str(tmp_path)))
    manifest = pd.read_csv(smoke_data[1])
    test_ids = manifest.loc[manifest["split"] == "test", "image_id"]
    assert sorted(predictions["image_id"]) == sorted(test_ids)
    probs = predictions[list(TASK1_LABELS)].to_numpy()
    assert ((probs >= 0) & (probs <= 1)).all()
    truth = predictions.set_index("image_id")[[f"true/{n}" for n in TASK1_LABELS]]
    expected = manifest.set_index("image_id").loc[truth.index, list(TASK1_LABELS)]
    assert (truth.to_numpy() == expected.to_numpy()).all()
    assert not (tmp / "checkpoints" / run_id).exists()  # working checkpoints dropped once the run finished


def test_both_runs_appear_side_by_side_in_the_ui_rest_api(smoke_runs):
    tmp, _, _ = smoke_runs
    port = free_port()
    # Its own session, so the whole group (uvicorn, MLflow 3's job consumers) is stopped, however loaded the machine.
    server = subprocess.Popen(
        [sys.executable, "-m", "mlflow", "ui", "--backend-store-uri", f"sqlite:///{tmp}/mlflow.db",
         "--host", "127.0.0.1", "--port", str(port)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    try:
        wait_for_http(f"{base}/health", server, 120, "mlflow ui")
        url = f"{base}/api/2.0/mlflow/experiments/get-by-name?experiment_name=task1"
        experiment = json.load(urllib.request.urlopen(url, timeout=60))["experiment"]
        body = json.dumps({"experiment_ids": [experiment["experiment_id"]], "max_results": 10}).encode()
        request = urllib.request.Request(
            f"{base}/api/2.0/mlflow/runs/search", body, {"Content-Type": "application/json"}
        )
        runs = json.load(urllib.request.urlopen(request, timeout=60))["runs"]
        models = {next(p["value"] for p in r["data"]["params"] if p["key"] == "model.name"): r for r in runs}
        assert set(models) == set(MODELS)
        for run in models.values():
            metric_keys = {m["key"] for m in run["data"]["metrics"]}
            assert {"test/mAP", "val/mAP"} <= metric_keys
        assert urllib.request.urlopen(f"{base}/", timeout=60).status == 200  # the UI page itself is served
    finally:
        stop_process_group(server)


def test_crt_retrains_only_the_head_of_a_finished_run(smoke_runs, smoke_data):
    tmp, client, _ = smoke_runs
    parent = _runs(client)["resnet18"]
    env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{tmp}/mlflow.db"}
    done = subprocess.run(
        train_command(tmp, "debug=smoke", "model=resnet18", f"data.source.root={smoke_data[0]}", "stage=crt",
                      f"stage.parent_run={parent.info.run_id}", "trainer.max_epochs=1", "trainer.enable_progress_bar=false",
                      "tta.enabled=false", "evaluation.perturbation.enabled=false"),
        env=env, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    experiment = client.get_experiment_by_name("task1")
    (crt,) = client.search_runs([experiment.experiment_id], filter_string="tags.`cxrlt.stage` = 'crt'")
    assert crt.data.tags["mlflow.parentRunId"] == parent.info.run_id
    assert (
        crt.info.run_name.startswith("debug-resnet18-bce-class_aware-s42-crt-")
        and crt.data.params["sampler.name"] == "class_aware"
    )

    def state(run):
        path = client.download_artifacts(run.info.run_id, "checkpoints/best.ckpt", str(tmp / run.info.run_id))
        return torch.load(path, map_location="cpu", weights_only=True)["state_dict"]

    before, after = state(parent), state(crt)
    backbone = [k for k in before if k.startswith("backbone.") and before[k].is_floating_point()]
    assert backbone and all(torch.equal(before[k], after[k]) for k in backbone)  # frozen, BN statistics included
    assert not torch.equal(before["head.weight"], after["head.weight"])


def test_make_evaluate_rewrites_the_run_metrics(smoke_runs):
    tmp, client, _ = smoke_runs
    run = _runs(client)["regnetx_004"]
    env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{tmp}/mlflow.db"}
    done = subprocess.run(
        [sys.executable, "-m", "apps.evaluate", f"run={run.info.run_id}", "evaluation=postprocess",
         "evaluation.n_boot=50", "tta.enabled=false", "evaluation.perturbation.enabled=false"],
        env=env, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    metrics = client.get_run(run.info.run_id).data.metrics
    assert metrics["test/mAP"] == pytest.approx(run.data.metrics["test/mAP"])  # same checkpoint, same data
    assert "test_gated/mAP" in metrics and "test_logit_adjusted/mAP" in metrics


def test_the_same_seed_trains_the_same_model_again(smoke_runs, smoke_data):
    """Seeded end to end, augmentation included: the repeat's losses and scores equal the first run's exactly."""
    tmp, client, _ = smoke_runs
    first = _runs(client)["regnetx_004"]
    env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{tmp}/mlflow.db", "PYTHONUNBUFFERED": "1"}
    done = subprocess.run(
        train_command(tmp, "debug=smoke", f"model={MODELS[0]}", f"data.source.root={smoke_data[0]}",
                      "trainer.enable_progress_bar=false", "tracking.experiment=repeat"),
        env=env, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (repeat,) = client.search_runs([client.get_experiment_by_name("repeat").experiment_id])
    for key in ("train/loss", "val/mAP", "test/mAP"):
        assert repeat.data.metrics[key] == first.data.metrics[key], key
