"""`make train TASK=task2 ARGS="data=cxrlt2026 ..."` on a release-shaped fixture with no patient column: the NIH
external test comes from an NIH folder plus the organisers' list, and Task 2 is reported on the internal
(PadChest), external (NIH) and pooled tests, each bootstrapped within source, in the MLflow run."""

from __future__ import annotations

import os
import subprocess

import numpy as np
import pandas as pd
import pytest
from mlflow import MlflowClient

from evaluation.suite import compute_suite
from tests.conftest import train_command
from tests.cxrlt2026_release import DEVELOPMENT, release_config, write_release
from training.data.findings import TASK2_LABELS
from training.data.label_names import ORGANISER_SPELLING

pytestmark = pytest.mark.e2e  # trains through the real CLI: make test-e2e (docs/development.md)

N_BOOT = 40


@pytest.fixture(scope="module")
def release_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("cxrlt2026")
    release = write_release(tmp / "release", layout="column", nih="folder")
    env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{tmp}/mlflow.db", "PYTHONUNBUFFERED": "1"}
    command = train_command(
        tmp, "task=task2", "debug=smoke", *release.hydra_overrides(), f"data.source.out_dir={tmp}/manifests",
        "data.num_workers=0", "trainer.enable_progress_bar=false", f"evaluation.n_boot={N_BOOT}",
        "evaluation.plots=false", f"evaluation.perturbation.cache_dir={tmp}/perturbed",
    )  # fmt: skip
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    client = MlflowClient(env["MLFLOW_TRACKING_URI"])
    (run,) = client.search_runs([client.get_experiment_by_name("task2").experiment_id])
    return tmp, client, run, done.stdout + done.stderr


def test_the_release_trains_without_patient_ids_on_its_own_splits(release_run):
    tmp, _, run, output = release_run
    assert run.info.status == "FINISHED" and run.data.tags["data_source"] == "cxrlt2026"
    assert output.count("no patient column") == 1
    # Task 2's training rule (docs/rules.md §11) keeps development images positive for an unseen finding out of
    # validation; the release's own table says how many there are (its training rows carry no unseen labels).
    table = pd.read_csv(tmp / "release" / release_config()["table"])
    development = table[table["split"] == DEVELOPMENT]
    unseen_positive = int((development[[ORGANISER_SPELLING.get(n, n) for n in TASK2_LABELS]] == 1).any(axis=1).sum())
    assert 0 < unseen_positive < 32
    assert run.data.tags["cxrlt.training_rule.excluded.val"] == str(unseen_positive)
    assert run.data.tags["cxrlt.training_rule.excluded.train"] == "0"
    for split, n in (("train", 96), ("val", 32 - unseen_positive), ("test", 24 + 16)):  # release splits + NIH
        assert f"{split} split: {n} images" in output
    assert "test/mAP" in run.data.metrics


def test_task2_internal_external_and_pooled_figures_are_each_resampled_within_source(release_run, tmp_path):
    _, client, run, output = release_run
    metrics, tags = run.data.metrics, run.data.tags
    assert tags["cxrlt.unseen.internal_source"] == "padchest" and tags["cxrlt.unseen.external_sources"] == "nih"
    assert tags["cxrlt.unseen.bootstrap"] == "resampled within source (nih, padchest)"
    for scope in ("pooled", "internal", "external"):
        for macro in ("mAP", "mAUROC"):
            low, value, high = (metrics[f"test_unseen/{scope}/{macro}{s}"] for s in ("_ci_low", "", "_ci_high"))
            assert 0.0 <= low <= high <= 1.0 and 0.0 <= value <= 1.0, (scope, macro, low, value, high)
    # Recompute from the logged predictions: the run's figures are the within-source bootstrap of these scores.
    frame = pd.read_csv(client.download_artifacts(run.info.run_id, "predictions/test_unseen.csv", str(tmp_path)))
    assert frame["source"].value_counts().to_dict() == {"padchest": 24, "nih": 16}
    probs, targets = frame[list(TASK2_LABELS)].to_numpy(), frame[[f"true/{n}" for n in TASK2_LABELS]].to_numpy()
    sources = frame["source"].to_numpy()
    seed = int(run.data.params["evaluation.seed"])
    pooled = compute_suite(targets, probs, TASK2_LABELS, n_boot=N_BOOT, seed=seed, strata=sources).metrics
    for scope, rows in (("internal", sources == "padchest"), ("external", sources == "nih")):
        alone = compute_suite(targets[rows], probs[rows], TASK2_LABELS, n_boot=N_BOOT, seed=seed).metrics
        for key in ("mAP", "mAP_ci_low", "mAP_ci_high", "mAUROC_ci_low"):
            assert metrics[f"test_unseen/{scope}/{key}"] == pytest.approx(alone[key], abs=1e-6), (scope, key)
    for key in ("mAP", "mAP_ci_low", "mAP_ci_high", "mAUROC_ci_high"):
        assert metrics[f"test_unseen/pooled/{key}"] == pytest.approx(pooled[key], abs=1e-6), key
        assert metrics[f"test_unseen/{key}"] == pytest.approx(pooled[key], abs=1e-6), key
    unstratified = compute_suite(targets, probs, TASK2_LABELS, n_boot=N_BOOT, seed=seed).metrics
    assert not np.isclose(metrics["test_unseen/pooled/mAP_ci_low"], unstratified["mAP_ci_low"])
    assert "| internal (padchest) |" in output and "| pooled (resampled within source) |" in output


def test_task2_analyses_on_the_release_internal_external_and_the_development_draw(release_run, tmp_path):
    """TTA and perturbed copies of the internal (PadChest) and external (NIH) tests, and the held-out draw of the
    release's development split (which carries the six classes), scored on the unseen classes."""
    _, client, run, output = release_run
    metrics = run.data.metrics
    for prefix in ("test_unseen_tta", "test_unseen_perturbed"):
        for scope in ("pooled", "internal", "external"):
            low, value, high = (metrics[f"{prefix}/{scope}/mAP{s}"] for s in ("_ci_low", "", "_ci_high"))
            assert 0.0 <= low <= high <= 1.0 and 0.0 <= value <= 1.0, (prefix, scope)
    frame = pd.read_csv(client.download_artifacts(run.info.run_id, "predictions/test_unseen_perturbed.csv",
                                                  str(tmp_path)))  # fmt: skip
    rows = (frame["source"] == "nih").to_numpy()
    probs, targets = frame[list(TASK2_LABELS)].to_numpy(), frame[[f"true/{n}" for n in TASK2_LABELS]].to_numpy()
    alone = compute_suite(targets[rows], probs[rows], TASK2_LABELS, n_boot=N_BOOT, seed=0).metrics
    assert metrics["test_unseen_perturbed/external/mAP"] == pytest.approx(alone["mAP"], abs=1e-6)
    held = pd.read_csv(client.download_artifacts(run.info.run_id, "predictions/heldout_unseen.csv", str(tmp_path)))
    assert len(held) == metrics["heldout_unseen/n_images"] == 32 and set(held["source"]) == {"padchest"}
    expected = compute_suite(held[[f"true/{n}" for n in TASK2_LABELS]].to_numpy(), held[list(TASK2_LABELS)].to_numpy(),
                             TASK2_LABELS, n_boot=0).metrics["mAP"]  # fmt: skip
    assert metrics["heldout_unseen/mAP"] == pytest.approx(expected, abs=1e-6)
    assert "unseen mAP, test perturbed: pooled " in output and "| scope | test | test with TTA |" in output
