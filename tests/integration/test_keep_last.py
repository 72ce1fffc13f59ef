"""`checkpoint.keep_last=true` end to end: the run tests and logs its final epoch, and the score it logs as the kept
checkpoint's (what `make register` ranks by) is that epoch's validation value, not the best one."""

from __future__ import annotations

import subprocess

from mlflow import MlflowClient

from tests.conftest import train_command


def test_keep_last_run_tests_and_ranks_its_final_epoch(make_manifest, tmp_path, run_env):
    manifest = make_manifest(n=48)
    done = subprocess.run(
        train_command(tmp_path, "data=manifest", f"data.source.manifest={manifest}", "data.image_size=32",
                      "data.batch_size=8", "model=resnet18", "model.backbone=resnet10t", "checkpoint.keep_last=true",
                      "trainer.max_epochs=3", "trainer.enable_progress_bar=false", "tta.enabled=false",
                      "evaluation.perturbation.enabled=false", "evaluation.heldout.enabled=false",
                      "evaluation.n_boot=20", "tracking.system_metrics.enabled=false"),
        env=run_env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    client = MlflowClient(run_env["MLFLOW_TRACKING_URI"])
    (run,) = client.search_runs([client.get_experiment_by_name("task1").experiment_id])
    history = sorted(client.get_metric_history(run.info.run_id, "val/mAP"), key=lambda m: m.step)
    assert len(history) == 3 and run.data.metrics["best_epoch"] == 2
    assert run.data.metrics["val/mAP_best"] == history[-1].value
