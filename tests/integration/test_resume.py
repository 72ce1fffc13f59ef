"""Kill a training during its second epoch, resume it: same run, every epoch logged exactly once."""

import subprocess
import time

import torch
from mlflow import MlflowClient

from tests.conftest import train_command

EPOCHS = 4


def test_killed_run_resumes_into_the_same_run(tmp_path, run_env):
    overrides = ("debug=smoke", f"trainer.max_epochs={EPOCHS}", "data.batch_size=8", f"data.source.root={tmp_path}/synthetic",
                 "trainer.enable_progress_bar=false")  # fmt: skip
    first = subprocess.Popen(train_command(tmp_path, *overrides), env=run_env, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True)  # fmt: skip
    checkpoints = tmp_path / "checkpoints"
    deadline = time.time() + 240
    while not list(checkpoints.glob("*/last.ckpt")):
        assert first.poll() is None, first.stdout.read()[-3000:]
        assert time.time() < deadline, "no checkpoint after the first epoch"
        time.sleep(0.02)
    first.kill()  # SIGKILL: no chance to clean up, like a lost node
    first.wait()
    (last,) = checkpoints.glob("*/last.ckpt")
    run_id = last.parent.name
    killed_at = torch.load(last, map_location="cpu", weights_only=True)["epoch"]
    assert killed_at < EPOCHS - 1, "the first process finished before it could be killed"

    client = MlflowClient(run_env["MLFLOW_TRACKING_URI"])
    assert client.get_run(run_id).info.status == "RUNNING"

    second = subprocess.run(train_command(tmp_path, *overrides, "resume=true"), env=run_env, capture_output=True,
                            text=True, timeout=300)  # fmt: skip
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    assert f"resuming run {run_id}" in second.stdout + second.stderr

    experiment = client.get_experiment_by_name("task1")
    runs = client.search_runs([experiment.experiment_id])
    assert [r.info.run_id for r in runs] == [run_id]
    assert runs[0].info.status == "FINISHED"
    for key in ("val/mAP", "val/mAUROC", "train/loss", "train/lr"):
        steps = sorted(m.step for m in client.get_metric_history(run_id, key))
        assert steps == list(range(EPOCHS)), (key, steps)  # the step is the epoch: each exactly once
    assert "test/mAP" in runs[0].data.metrics
    assert [a.path for a in client.list_artifacts(run_id, "checkpoints")] == ["checkpoints/best.ckpt"]
