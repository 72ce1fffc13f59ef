"""`make train TASK=task2 ARGS="debug=smoke"` end to end: leak guard recorded, proxy-OOD logged per epoch, the
six unseen classes reported overall and per centre (internal/external) with bootstrap CIs; and the clip adapter
on a random tiny open_clip model through the same command."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import mlflow.pyfunc
import numpy as np
import pandas as pd
import pytest
from mlflow import MlflowClient
from sklearn.metrics import average_precision_score

from evaluation.organiser_names import TASK2_COLUMNS
from tests.benchmark_data import TINY_CLIP
from tests.conftest import train_command
from training.data.findings import TASK1_LABELS, TASK2_LABELS

pytestmark = pytest.mark.e2e  # trains through the real CLI: make test-e2e (docs/development.md)

MACRO_KEYS = ("mAP", "mAUROC", "mF1", "mECE")


@pytest.fixture(scope="module")
def task2_runs(tmp_path_factory, smoke_data):
    tmp = tmp_path_factory.mktemp("task2")
    env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{tmp}/mlflow.db", "PYTHONUNBUFFERED": "1"}
    tiny = tmp / "tiny_clip"
    tiny.mkdir()
    (tiny / "open_clip_config.json").write_text(json.dumps(TINY_CLIP))
    common = ("task=task2", "debug=smoke", f"data.source.root={smoke_data[0]}", "trainer.enable_progress_bar=false")
    variants = {
        "semantic": (),
        "clip": ("adapter=clip", f"adapter.model=local-dir:{tiny}", "adapter.finetune=head", "adapter.proxy.k=2",
                 "tta.enabled=false", "evaluation.perturbation.enabled=false", "evaluation.plots=false"),
    }  # fmt: skip
    outputs = {}
    for name, extra in variants.items():
        done = subprocess.run(train_command(tmp, *common, *extra), env=env, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        outputs[name] = done.stdout + done.stderr
    client = MlflowClient(env["MLFLOW_TRACKING_URI"])
    experiment = client.get_experiment_by_name("task2")
    runs = {run.data.params["adapter.name"]: run for run in client.search_runs([experiment.experiment_id])}
    return tmp, client, runs, outputs


def test_task2_reports_unseen_classes_overall_internal_and_external_with_cis(task2_runs):
    tmp, client, runs, outputs = task2_runs
    run = runs["semantic"]
    assert run.info.status == "FINISHED"
    metrics, tags = run.data.metrics, run.data.tags
    for scope in ("test_unseen", "test_unseen/source/centre_a", "test_unseen/source/centre_b"):
        for macro in MACRO_KEYS:
            assert f"{scope}/{macro}" in metrics, f"{scope}/{macro}"
        for macro in ("mAP", "mAUROC"):
            low, value, high = (metrics[f"{scope}/{macro}{s}"] for s in ("_ci_low", "", "_ci_high"))
            assert 0.0 <= low <= value <= high <= 1.0, (scope, macro, low, value, high)
    assert {f"test_unseen/ap/{name}" for name in TASK2_LABELS} <= set(metrics)  # the smoke set has 3 of each
    assert "test_unseen_random/mAP_ci_high" in metrics and "test_unseen/prevalence_baseline_mAP" in metrics
    assert tags["cxrlt.unseen.internal_source"] == "centre_a" and tags["cxrlt.unseen.external_sources"] == "centre_b"
    # The seen-class report still runs as for task1, over the 30 trained labels only.
    assert "test/mAP" in metrics and not any(key.startswith(f"test/ap/{n}") for key in metrics for n in TASK2_LABELS)
    # Proxy-OOD, once per epoch (a checkpoint monitor), and the leak guard's record.
    history = client.get_metric_history(run.info.run_id, "val/proxy_ood_mAP")
    assert len(history) == 1
    # Task 2 keeps its checkpoint by the zero-shot proxy; the kept value is what `make register` ranks by.
    assert metrics["val/proxy_ood_mAP_best"] == pytest.approx(max(m.value for m in history))
    assert {f"val/proxy_ood/split{i}/mAP" for i in range(5)} <= set(metrics)
    assert tags["cxrlt.leak_guard.dropped_columns"] == ",".join(TASK2_LABELS)
    assert "training rule (docs/rules.md §11): excluded" in outputs["semantic"]
    assert int(tags["cxrlt.training_rule.excluded.train"]) > 0 and tags["cxrlt.training_rule.checked"] == "true"
    assert "Unseen classes (zero-shot)" in outputs["semantic"]
    # Task 2 is ranked on its unseen classes: the summary printed when training ends leads with their chain.
    first = re.search(r"best epoch \d+:\n  (.*)", outputs["semantic"])[1]
    assert first.startswith("unseen classes, test (ranking chain; lower mECE wins): mAP "), first
    assert f"mAP {metrics['test_unseen/mAP']:.3f} [{metrics['test_unseen/mAP_ci_low']:.3f}, " in first
    assert f"mAUROC {metrics['test_unseen/mAUROC']:.3f} [" in first
    assert f"seen classes (proxy, not ranked), test (ranking chain; lower mECE wins): mAP {metrics['test/mAP']:.3f}" \
        in outputs["semantic"]  # fmt: skip


def test_unseen_predictions_carry_the_true_labels_of_the_full_manifest(task2_runs, smoke_data, tmp_path):
    tmp, client, runs, _ = task2_runs
    run_id = runs["semantic"].info.run_id
    frame = pd.read_csv(client.download_artifacts(run_id, "predictions/test_unseen.csv", str(tmp_path)))
    manifest = pd.read_csv(smoke_data[1])
    test = manifest[manifest["split"] == "test"].set_index("image_id")
    assert sorted(frame["image_id"]) == sorted(test.index)
    truth = frame.set_index("image_id")[[f"true/{n}" for n in TASK2_LABELS]]
    assert (truth.to_numpy() == test.loc[truth.index, list(TASK2_LABELS)].to_numpy()).all()
    probs = frame[list(TASK2_LABELS)].to_numpy()
    assert ((probs >= 0) & (probs <= 1)).all() and probs.std(axis=0).min() > 0  # real scores, not a constant
    report = client.download_artifacts(run_id, "evaluation/unseen_report.md", str(tmp_path))
    assert "centre_b (external)" in Path(report).read_text()


def test_clip_adapter_trains_and_reports_through_the_same_command(task2_runs):
    _, client, runs, _ = task2_runs
    run = runs["clip"]
    assert run.info.status == "FINISHED"
    assert run.data.params["adapter._target_"] == "training.zeroshot.clip.ClipClassifier"
    metrics = run.data.metrics
    assert {"test_unseen/mAUROC", "test_unseen/source/centre_b/mAP_ci_low", "val/proxy_ood_mAP", "train/loss"} <= set(
        metrics
    )


def test_the_transfer_in_use_is_the_best_candidate_on_proxy_ood_validation(task2_runs):
    _, client, runs, outputs = task2_runs
    run = runs["semantic"]
    candidates = run.data.params["adapter.transfer_candidates"].strip("[]").replace("'", "").split(", ")
    assert run.data.params["adapter.transfer"] == "auto" and len(candidates) > 1
    values = {name: run.data.metrics[f"val/proxy_ood/{name}/mAP"] for name in candidates}  # the only epoch
    best = max(values, key=values.get)
    assert run.data.tags["cxrlt.zeroshot.transfer"] == f"{best}, chosen on proxy-OOD validation"
    assert run.data.metrics["val/proxy_ood_mAP"] == pytest.approx(values[best])
    assert f"(transfer: {best}, chosen on proxy-OOD validation)" in outputs["semantic"]


def test_make_evaluate_reports_the_unseen_classes_again(task2_runs):
    tmp, client, runs, _ = task2_runs
    run = runs["semantic"]
    env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{tmp}/mlflow.db"}
    done = subprocess.run(
        [sys.executable, "-m", "apps.evaluate", f"run={run.info.run_id}", "tta.enabled=false",
         "evaluation.perturbation.enabled=false", "evaluation.plots=false"],
        env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    metrics = client.get_run(run.info.run_id).data.metrics
    for key in ("test_unseen/mAP", "test_unseen/mAUROC", "test_unseen/source/centre_b/mAP"):
        assert len(client.get_metric_history(run.info.run_id, key)) == 2  # reported again, into the run
        assert metrics[key] == pytest.approx(run.data.metrics[key], abs=1e-6)  # same checkpoint, same transfer


def test_registered_task2_model_serves_seen_and_unseen_and_submits_the_unseen_columns(
    task2_runs, smoke_data, tmp_path, monkeypatch
):
    tmp, client, runs, _ = task2_runs
    run_id = runs["semantic"].info.run_id
    env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{tmp}/mlflow.db"}
    printed = []
    for command in (["apps.registry", "--task", "task2", "--run", run_id, "--include-debug"],
                    ["apps.submit_cli", "--task", "task2", "--out", str(tmp_path / "task2.csv")]):  # fmt: skip
        done = subprocess.run([sys.executable, "-m", *command], env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        printed.append(done.stdout + done.stderr)
    # `make register TASK=task2` ranks both smoke runs by the unseen classes' proxy, ties on their test chain.
    ranking = printed[0]
    assert "ranking 2 comparable run(s) by val/proxy_ood_mAP (higher is better" in ranking
    assert "ties broken by the ranking chain on test (unseen classes): test_unseen/mAP, test_unseen/mAUROC, " in ranking
    order = sorted(runs.values(), key=lambda run: -run.data.metrics["val/proxy_ood_mAP_best"])
    for place, run in enumerate(order, 1):
        assert f"{place:>4}. {run.info.run_id}  {run.data.metrics['val/proxy_ood_mAP_best']:.4f}" in ranking
    champion = client.get_model_version_by_alias("cxrlt-task2", "champion")
    assert champion.run_id == run_id
    submission = pd.read_csv(tmp_path / "task2.csv").set_index("ImageID")
    assert list(submission.columns) == list(TASK2_COLUMNS.values())  # Eval_Class_Task2.txt's order and spelling
    # The registered model scores the unseen classes exactly as the run's own report did.
    reported = pd.read_csv(client.download_artifacts(run_id, "predictions/test_unseen.csv", str(tmp_path)))
    reported = reported.set_index("image_id").loc[submission.index, list(TASK2_LABELS)]
    np.testing.assert_allclose(submission.to_numpy(), reported[list(TASK2_COLUMNS)].to_numpy(), atol=2e-5)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", env["MLFLOW_TRACKING_URI"])  # not set_tracking_uri: it outlives the test
    manifest_path = smoke_data[1]
    # A served model opens paths only under the image root it is given (docs/tuning-registry-submission.md).
    model = mlflow.pyfunc.load_model("models:/cxrlt-task2@champion",
                                     model_config={"image_root": str(manifest_path.parent)})  # fmt: skip
    manifest = pd.read_csv(manifest_path)
    row = manifest[manifest["split"] == "test"].iloc[0]
    scores = model.predict(pd.DataFrame({"image": [str(manifest_path.parent / row["path"])]}))
    assert list(scores.columns) == [*TASK1_LABELS, *TASK2_LABELS]  # task2 trains on the Task 1 labels
    np.testing.assert_allclose(scores[list(TASK2_LABELS)].to_numpy()[0], reported.loc[row["image_id"]].to_numpy(),
                               atol=2e-5)  # fmt: skip


def test_task2_analyses_are_in_the_run_the_report_and_the_terminal(task2_runs, tmp_path):
    """TTA, perturbed and held-out figures of the unseen classes, each pooled / internal / external with CIs
    (docs/zero-shot.md, "Task 2 analyses as the paper reports them")."""
    tmp, client, runs, outputs = task2_runs
    run = runs["semantic"]
    metrics = run.data.metrics
    for prefix in ("test_unseen_tta", "test_unseen_perturbed"):
        for scope in ("", "/pooled", "/internal", "/external"):
            low, value, high = (metrics[f"{prefix}{scope}/mAP{s}"] for s in ("_ci_low", "", "_ci_high"))
            assert 0.0 <= low <= high <= 1.0 and 0.0 <= value <= 1.0, (prefix, scope, low, value, high)
    for scope in ("", "/internal", "/external"):
        change = metrics[f"test_unseen_perturbed{scope}/mAP"] - metrics[f"test_unseen{scope}/mAP"]
        assert metrics[f"test_unseen_perturbed{scope}/delta/mAP"] == pytest.approx(change, abs=1e-9)
    assert not any(k.startswith(("test_unseen_tta/", "test_unseen_perturbed/")) for k in runs["clip"].data.metrics)
    # The held-out draw of the development split as released, scored on the unseen classes: recomputed here. Read
    # with the figures stored now: test_make_evaluate_reports_the_unseen_classes_again may have re-evaluated the run.
    now = client.get_run(run.info.run_id).data.metrics
    frame = pd.read_csv(client.download_artifacts(run.info.run_id, "predictions/heldout_unseen.csv", str(tmp_path)))
    draw = json.loads(Path(client.download_artifacts(run.info.run_id, "evaluation/heldout_unseen.json",
                                                     str(tmp_path))).read_text())  # fmt: skip
    assert draw["split"] == "val" and draw["image_ids"] == list(frame["image_id"].astype(str))
    assert now["heldout_unseen/n_images"] == len(frame) == min(draw["requested"], draw["available"])
    truth, probs = frame[[f"true/{n}" for n in TASK2_LABELS]].to_numpy(), frame[list(TASK2_LABELS)].to_numpy()
    aps = [average_precision_score(truth[:, c], probs[:, c]) for c in range(len(TASK2_LABELS)) if truth[:, c].any()]
    assert now["heldout_unseen/mAP"] == pytest.approx(np.mean(aps), abs=1e-6)
    # Images positive for an unseen finding are out of training's validation split, not out of this evaluation.
    assert truth.any(axis=1).sum() > 0 and "heldout_unseen/internal/mAP_ci_low" in now
    report = Path(client.download_artifacts(run.info.run_id, "evaluation/report.md", str(tmp_path))).read_text()
    # Its first table is the unseen classes' chain (test_unseen and its copies); the seen classes follow.
    table = [line for line in report.split("## Headline: unseen classes", 1)[1].splitlines() if line.startswith("|")]
    assert table[0].startswith("| rank | metric | test_unseen |") and "| test |" not in table[0]
    first_map = table[2].split("|")
    assert first_map[1:3] == [" 1 ", " mAP "] and float(first_map[3].split()[0]) == pytest.approx(
        metrics["test_unseen/mAP"], abs=1e-4)  # fmt: skip
    assert report.index("## Seen classes (proxy, not ranked)") > report.index("## Headline: unseen classes")
    # test_make_evaluate_reports_the_unseen_classes_again re-evaluates this run with TTA off (it may run first), so
    # the report may lack the TTA column; the training's own terminal lines are the run's first test phase.
    assert "## Task 2: unseen classes (zero-shot)" in report and "| scope | test |" in report
    assert "unseen mAP, test with TTA: pooled " in outputs["semantic"]
    assert "unseen mAP, test perturbed: pooled " in outputs["semantic"]
    assert f"unseen mAP, held-out subset, {int(metrics['heldout_unseen/n_images'])} cases: " in outputs["semantic"]
