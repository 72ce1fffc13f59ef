"""`make ensemble` -> `make submit MODEL=ensemble:<run id>` end to end on three smoke runs in a store of their own:
the weights fitted on validation are logged as a run, and the submission holds exactly the members' probabilities
combined with those weights; members that cannot be combined and tampered weights end in one clear line."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from mlflow import MlflowClient

from apps import submit_cli
from apps.serving import Scorer
from apps.submission import Template, build_submission
from apps.submit import rows_to_predict, run_manifest
from tests.conftest import PROJECT_ROOT, train_command
from training.data.images import read_grayscale
from training.runs import read_config

pytestmark = pytest.mark.e2e  # trains through the real CLI: make test-e2e (docs/development.md)

SMOKE = ("debug=smoke", "data.subset={train:96,val:96,test:48}", "trainer.max_epochs=1", "evaluation.n_boot=20",
         "evaluation.per_source=false", "tta.enabled=false", "evaluation.perturbation.enabled=false",
         "evaluation.plots=false", "trainer.enable_progress_bar=false")  # fmt: skip


def make(env: dict, *args: str) -> subprocess.CompletedProcess:
    """The command the user types, against the test's store."""
    return subprocess.run(["make", "-s", *args], env=env, capture_output=True, text=True, timeout=600,
                          cwd=PROJECT_ROOT)  # fmt: skip


@pytest.fixture(scope="module")
def members(tmp_path_factory, smoke_data):
    """Three finished smoke runs of task1 differing only in their seed, on one generated data set."""
    tmp = tmp_path_factory.mktemp("ensemble")
    env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{tmp}/mlflow.db", "PYTHONUNBUFFERED": "1",
           "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false"}  # fmt: skip
    for seed in range(3):
        done = subprocess.run(train_command(tmp, *SMOKE, f"seed={seed}", f"data.source.root={smoke_data[0]}"),
                              env=env, capture_output=True, text=True, timeout=900, cwd=PROJECT_ROOT)  # fmt: skip
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    client = MlflowClient(env["MLFLOW_TRACKING_URI"])
    runs = client.search_runs([client.get_experiment_by_name("task1").experiment_id], order_by=["start_time ASC"])
    assert len(runs) == 3
    return tmp, env, client, [run.info.run_id for run in runs]


def _ensemble_runs(client: MlflowClient) -> list:
    experiment = client.get_experiment_by_name("task1").experiment_id
    return client.search_runs([experiment], filter_string="tags.`cxrlt.kind` = 'ensemble'", order_by=["start_time ASC"])


def _fit(members, weighting: str):
    tmp, env, client, run_ids = members
    before = {run.info.run_id for run in _ensemble_runs(client)}
    done = make(env, "ensemble", "TASK=task1", f"MODELS={' '.join(run_ids)}", f"WEIGHTS={weighting}")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (run,) = [run for run in _ensemble_runs(client) if run.info.run_id not in before]
    weights = json.loads(
        Path(client.download_artifacts(run.info.run_id, "ensemble/weights.json", str(tmp))).read_text()
    )
    return run, weights, done.stdout + done.stderr


def test_per_model_weights_are_logged_with_mean_and_tuned_map_on_both_splits(members):
    _, _, client, run_ids = members
    run, weights, output = _fit(members, "per_model")
    assert run.info.status == "FINISHED" and run.data.tags["task"] == "task1"
    assert run.data.params["weighting"] == "per_model" and run.data.params["members"] == " ".join(run_ids)
    assert weights["members"] == run_ids and weights["weighting"] == "per_model"
    matrix = np.array(weights["weights"])
    labels = weights["labels"]
    assert matrix.shape == (3, len(labels)) and np.allclose(matrix.sum(axis=0), 1) and (matrix >= 0).all()
    assert np.allclose(matrix, matrix[:, :1])  # per model: one vector for every class
    metrics = run.data.metrics
    # The search starts at the plain mean and only moves to strictly better validation mAP.
    assert metrics["ensemble/val/mAP_tuned"] >= metrics["ensemble/val/mAP_mean"]
    for split in ("val", "test"):
        assert {f"ensemble/{split}/mAP_mean", f"ensemble/{split}/mAP_tuned"} <= set(metrics)
    for k, run_id in enumerate(run_ids):  # the project's own metric code: the members' logged test/mAP again
        assert metrics[f"ensemble/test/mAP_member{k}"] == pytest.approx(client.get_run(run_id).data.metrics["test/mAP"])
    assert "plain mean" in output and "tuned (per_model)" in output and f"MODEL=ensemble:{run.info.run_id}" in output
    assert "val/mAP" not in metrics  # `make register` ranks by val/mAP: an ensemble run must never be a candidate


def test_the_ensemble_run_holds_its_combined_predictions_and_make_compare_judges_it(members):
    tmp, env, client, run_ids = members
    run, weights, _ = _fit(members, "per_class")
    ensemble_id, labels, matrix = run.info.run_id, weights["labels"], np.array(weights["weights"])
    for split in ("val", "test"):

        def read(run_id: str, split: str = split) -> pd.DataFrame:
            folder = tmp / "read" / run_id[:8] / split
            folder.mkdir(parents=True, exist_ok=True)
            path = client.download_artifacts(run_id, f"predictions/{split}.csv", str(folder))
            return pd.read_csv(path, dtype={"image_id": str})

        own, first = read(ensemble_id), read(run_ids[0])
        others = [read(run_id).set_index("image_id").loc[first["image_id"]] for run_id in run_ids[1:]]
        stacked = [first[labels].to_numpy(float)] + [frame[labels].to_numpy(float) for frame in others]
        expected = sum(matrix[k] * stacked[k] for k in range(3))  # the stored weights, class by class
        assert own["image_id"].tolist() == first["image_id"].tolist()
        assert np.allclose(own[labels].to_numpy(float), expected, atol=1e-9)
        truth = [column for column in first if column.startswith("true/")]
        assert truth and own[truth].equals(first[truth])
    done = make(env, "compare", f"RUNS={ensemble_id} {run_ids[0]}")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "verdict:" in done.stdout and client.get_run(run_ids[0]).data.tags["cxrlt.compared_in"]
    compared = client.get_run(client.get_run(run_ids[0]).data.tags["cxrlt.compared_in"]).data.tags
    assert set(compared["cxrlt.compared_runs"].split()) == {ensemble_id, run_ids[0]}


def test_submit_with_stored_per_class_weights_is_the_hand_weighted_sum_of_the_members(members):
    tmp, env, client, run_ids = members
    run, weights, _ = _fit(members, "per_class")
    matrix = np.array(weights["weights"])
    assert weights["weighting"] == "per_class" and matrix.shape[0] == 3
    out = tmp / "ensemble-submission.csv"
    done = make(env, "submit", "TASK=task1", f"MODEL=ensemble:{run.info.run_id}", f"OUT={out}")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    written = pd.read_csv(out, dtype={0: str})

    scorers = [Scorer.load(run_id, client) for run_id in run_ids]
    manifest, root = run_manifest(client, run_ids[0])
    rows = rows_to_predict(manifest, "test")
    probs = []
    for scorer in scorers:
        images = np.stack([read_grayscale(root / p, scorer.image_size, scorer.resize) for p in rows["path"]])
        probs.append(scorer.predict_images(images))
    n, c = probs[0].shape
    expected = np.zeros((n, c))
    for i in range(n):
        for j in range(c):
            expected[i, j] = sum(matrix[k, j] * probs[k][i, j] for k in range(3))
    plain = build_submission(Template.read(out), rows["image_id"].tolist(), sum(probs) / 3, weights["labels"])
    hand = build_submission(Template.read(out), rows["image_id"].tolist(), expected, weights["labels"])
    values = written.iloc[:, 1:].to_numpy(float)
    assert np.allclose(values, hand.iloc[:, 1:].to_numpy(float), atol=1.5e-6, rtol=0)
    if not np.allclose(matrix, 1 / 3):  # the stored weights, not the plain mean, made the file
        assert not np.allclose(values, plain.iloc[:, 1:].to_numpy(float), atol=1.5e-6, rtol=0)
    assert out.name in [a.path.split("/")[-1] for a in client.list_artifacts(run.info.run_id, "submissions")]


def _fake_member(client: MlflowClient, source: str, tmp: Path, drop_row: bool) -> str:
    """A finished run with ``source``'s config and predictions, one validation row short when ``drop_row``."""
    folder = tmp / f"fake-{source}"
    folder.mkdir(exist_ok=True)
    run_id = client.create_run(client.get_run(source).info.experiment_id).info.run_id
    client.log_artifact(run_id, client.download_artifacts(source, "config.yaml", str(folder)))
    for split in ("val", "test"):
        frame = pd.read_csv(client.download_artifacts(source, f"predictions/{split}.csv", str(folder)), dtype=str)
        if drop_row and split == "val":
            frame = frame.iloc[1:]
        (folder / "predictions").mkdir(exist_ok=True)
        frame.to_csv(folder / "predictions" / f"{split}.csv", index=False)
        client.log_artifact(run_id, str(folder / "predictions" / f"{split}.csv"), "predictions")
    client.set_terminated(run_id, "FINISHED")
    return run_id


def test_members_on_other_images_end_in_one_line_naming_the_run(members):
    tmp, env, client, run_ids = members
    fake = _fake_member(client, run_ids[1], tmp, drop_row=True)
    done = make(env, "ensemble", "TASK=task1", f"MODELS={run_ids[0]} {fake}")
    assert done.returncode != 0
    assert f"error: run {fake} predictions/val.csv holds other images than run {run_ids[0]}" in done.stderr
    assert "1 missing" in done.stderr and "Traceback" not in done.stderr
    usage = make(env, "ensemble", "TASK=task1")
    assert usage.returncode == 2 and "usage: make ensemble" in usage.stdout
    unknown = make(env, "ensemble", "TASK=task1", f"MODELS={run_ids[0]} {run_ids[1]}", "WEIGHTS=median")
    assert unknown.returncode != 0 and "no weighting 'median'" in unknown.stderr and "Traceback" not in unknown.stderr


def _tampered_ensemble(client: MlflowClient, tmp: Path, document: dict) -> str:
    run_id = client.create_run(client.get_experiment_by_name("task1").experiment_id,
                               tags={"cxrlt.kind": "ensemble"}).info.run_id  # fmt: skip
    path = tmp / f"tampered-{run_id}" / "weights.json"
    path.parent.mkdir()
    path.write_text(json.dumps(document))
    client.log_artifact(run_id, str(path), "ensemble")
    client.set_terminated(run_id, "FINISHED")
    return run_id


@pytest.mark.parametrize(
    ("tamper", "message"),
    [
        (lambda doc: doc.update(weights=[[-1.0] + row[1:] for row in doc["weights"]]), "finite and nonnegative"),
        (lambda doc: doc.update(weights=doc["weights"][:2]), "must be a 3 x"),
        (lambda doc: doc.update(members=[doc["members"][0], doc["members"][1], "0" * 32]), "no run"),
        (lambda doc: doc.update(labels=list(reversed(doc["labels"]))), "predicts other labels than ensemble run"),
    ],
)
def test_submit_refuses_tampered_weights_in_one_line(members, monkeypatch, capsys, tamper, message):
    tmp, env, client, run_ids = members
    document = {"format": 1, "weighting": "mean", "members": list(run_ids), "labels": None, "weights": None}
    labels = [str(name) for name in read_config(client, run_ids[0], str(tmp)).task.labels]
    document.update(labels=labels, weights=[[1 / 3] * len(labels)] * 3)
    tamper(document)
    ensemble = _tampered_ensemble(client, tmp, document)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", env["MLFLOW_TRACKING_URI"])
    with pytest.raises(SystemExit) as exited:
        submit_cli.main(["--task", "task1", "--model", f"ensemble:{ensemble}", "--out", str(tmp / "never.csv")])
    assert exited.value.code == 1
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert not (tmp / "never.csv").exists()
