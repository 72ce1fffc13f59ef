"""Zero-shot on real radiographs (NIH ChestX-ray14 subset): three findings held out, trained on the other twelve."""

from __future__ import annotations

import os
import subprocess

import pandas as pd
import pytest
from mlflow import MlflowClient

from tests.conftest import shared_data, train_command

HELD_OUT = ("Hernia", "Pneumothorax", "Emphysema")


@pytest.mark.realdata
def test_nih_hold_out_trains_without_the_held_out_labels_and_reports_them(tmp_path):
    root = shared_data("nih1000")
    before = sorted(p.name for p in root.iterdir())
    env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path}/mlflow.db", "PYTHONUNBUFFERED": "1"}
    done = subprocess.run(
        train_command(tmp_path, "task=nih14_zeroshot", "data=nih14", f"data.root={root}", "data.image_size=64",
                      f"data.source.out_dir={tmp_path}/manifests", "trainer.max_epochs=1", "tta.enabled=false",
                      "evaluation.perturbation.enabled=false", "evaluation.plots=false", "evaluation.n_boot=200",
                      "trainer.enable_progress_bar=false"),
        env=env, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert sorted(p.name for p in root.iterdir()) == before  # nothing written beside the read-only images
    client = MlflowClient(env["MLFLOW_TRACKING_URI"])
    (run,) = client.search_runs([client.get_experiment_by_name("nih14_zeroshot").experiment_id])
    metrics, tags = run.data.metrics, run.data.tags
    assert tags["cxrlt.leak_guard.dropped_columns"] == ",".join(HELD_OUT)
    assert {f"test_unseen/auroc/{name}" for name in HELD_OUT} <= set(metrics)
    for prefix in ("test_unseen", "test_unseen_random"):
        assert metrics[f"{prefix}/mAUROC_ci_low"] <= metrics[f"{prefix}/mAUROC"] <= metrics[f"{prefix}/mAUROC_ci_high"]
    # The full NIH manifest has the held-out columns; the one the run trained on does not.
    full = pd.read_csv(next((tmp_path / "manifests").glob("*.csv")))
    assert set(HELD_OUT) <= set(full.columns)
    assert "cxrlt.leak_guard.full_manifest_fingerprint" in tags
    assert "val/proxy_ood_mAP" in metrics
