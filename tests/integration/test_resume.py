"""Kill a training during its second epoch, resume it: same run, every epoch logged exactly once, and the same
numbers as a training that was never interrupted."""

import os
import subprocess

import pytest
import torch
from mlflow import MlflowClient

from tests.conftest import train_command
from tests.process_budget import wait_working

EPOCHS = 4
# Every per-epoch key the module logs (train/lr is scheduled by step, so it is the optimiser and scheduler state).
EPOCH_KEYS = ("train/loss", "train/lr", "val/mAP", "val/mAUROC")


def _overrides(data_root) -> tuple[str, ...]:
    return ("debug=smoke", f"trainer.max_epochs={EPOCHS}", "data.batch_size=8", f"data.source.root={data_root}",
            "trainer.enable_progress_bar=false")  # fmt: skip


#: CPU seconds a smoke training of EPOCHS epochs may use: several times what it takes (about 60 to 120 CPU s on
#: two cores), and independent of how busy the machine is (tests/process_budget.py).
TRAINING_CPU_SECONDS = 1500


def _kill_after_checkpoint(out, env, overrides, epoch: int) -> tuple[str, int]:
    """Start a training, SIGKILL it once ``last.ckpt`` holds ``epoch`` or later; returns (run id, its epoch).

    Each save replaces the file by a rename (training/checkpoint_io.py), so a new inode means a new epoch's
    checkpoint, and polling the inode avoids reading a 20 MB file every few milliseconds. The output goes to a file:
    a pipe nobody reads fills up and stalls the training.
    """
    log = out / "first.log"
    with log.open("w") as sink:
        first = subprocess.Popen(train_command(out, *overrides), env=env, stdout=sink, stderr=subprocess.STDOUT)
    checkpoints, seen = out / "checkpoints", [None]

    def reached() -> bool:
        found = list(checkpoints.glob("*/last.ckpt"))
        inode = found[0].stat().st_ino if found else None
        if inode is None or inode == seen[0]:
            return False
        seen[0] = inode
        return torch.load(found[0], map_location="cpu", weights_only=True)["epoch"] >= epoch

    wait_working(first, f"training until the checkpoint of epoch {epoch}", TRAINING_CPU_SECONDS, until=reached)
    assert first.poll() is None, log.read_text()[-3000:]
    first.kill()  # SIGKILL: no chance to clean up, like a lost node
    first.wait()
    (last,) = checkpoints.glob("*/last.ckpt")
    killed_at = torch.load(last, map_location="cpu", weights_only=True)["epoch"]
    assert epoch <= killed_at < EPOCHS - 1, f"killed after epoch {killed_at}: the first process finished too soon"
    return last.parent.name, killed_at


def _resume(out, env, overrides, run_id: str) -> None:
    log = out / "resumed.log"
    with log.open("w") as sink:
        second = subprocess.Popen(train_command(out, *overrides, "resume=true"), env=env, stdout=sink,
                                  stderr=subprocess.STDOUT)  # fmt: skip
    wait_working(second, "the resumed training", TRAINING_CPU_SECONDS)
    output = log.read_text()
    assert second.returncode == 0, output[-3000:]
    assert f"resuming run {run_id}" in output


def _metrics(client: MlflowClient, run_id: str) -> dict[tuple[str, int], float]:
    """Every value the run logged by ``(key, step)``: each epoch of the per-epoch keys, and the test metrics.

    MLflow's ``system/`` metrics (CPU load, memory) describe the machine, not the model, and are left out.
    """
    keys = [key for key in client.get_run(run_id).data.metrics if not key.startswith("system/")]
    return {(key, m.step): m.value for key in keys for m in client.get_metric_history(run_id, key)}


def test_killed_run_resumes_into_the_same_run(tmp_path, run_env):
    overrides = _overrides(tmp_path / "synthetic")
    run_id, _ = _kill_after_checkpoint(tmp_path, run_env, overrides, epoch=0)
    client = MlflowClient(run_env["MLFLOW_TRACKING_URI"])
    assert client.get_run(run_id).info.status == "RUNNING"

    _resume(tmp_path, run_env, overrides, run_id)

    experiment = client.get_experiment_by_name("task1")
    runs = client.search_runs([experiment.experiment_id])
    assert [r.info.run_id for r in runs] == [run_id]
    assert runs[0].info.status == "FINISHED"
    for key in EPOCH_KEYS:
        steps = sorted(m.step for m in client.get_metric_history(run_id, key))
        assert steps == list(range(EPOCHS)), (key, steps)  # the step is the epoch: each exactly once
    assert "test/mAP" in runs[0].data.metrics
    assert [a.path for a in client.list_artifacts(run_id, "checkpoints")] == ["checkpoints/best.ckpt"]


@pytest.mark.slow
@pytest.mark.parametrize("extra", [(), ("ema=ema", "checkpoint.keep_last=true")], ids=["default", "ema_keep_last"])
def test_resumed_run_reproduces_the_uninterrupted_run_exactly(tmp_path, extra):
    """Killed after epoch 1 and resumed at epoch 2, a run must log what a run that was never stopped logs.

    Epoch 2 is the first epoch of the resumed fit, where every stateful random stream (the shuffle, the sampler's
    draw, the augmentation pipeline's own generator) would restart from its beginning unless it is a function of
    the epoch or restored from the checkpoint; epoch 3 checks that the streams stay aligned after that. With the
    small-real preset's EMA and kept final epoch, the average and the kept checkpoint must resume too.
    """
    overrides = (*_overrides(tmp_path / "synthetic"), *extra)  # one generated data set for both runs
    stores = {}
    for name in ("straight", "resumed"):
        out = tmp_path / name
        out.mkdir()
        env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{out}/mlflow.db", "PYTHONUNBUFFERED": "1"}
        if name == "straight":
            with (out / "straight.log").open("w") as sink:
                done = subprocess.Popen(train_command(out, *overrides), env=env, stdout=sink, stderr=subprocess.STDOUT)
            wait_working(done, "the uninterrupted training", TRAINING_CPU_SECONDS)
            assert done.returncode == 0, (out / "straight.log").read_text()[-3000:]
            client = MlflowClient(env["MLFLOW_TRACKING_URI"])
            (run,) = client.search_runs([client.get_experiment_by_name("task1").experiment_id])
            run_id = run.info.run_id
        else:
            run_id, _ = _kill_after_checkpoint(out, env, overrides, epoch=1)
            _resume(out, env, overrides, run_id)
        stores[name] = _metrics(MlflowClient(env["MLFLOW_TRACKING_URI"]), run_id)

    straight, resumed = stores["straight"], stores["resumed"]
    assert {(key, epoch) for key in EPOCH_KEYS for epoch in range(EPOCHS)} <= straight.keys()
    assert any(key == "test/mAP" for key, _ in straight), sorted(straight)
    differences = {key: (straight.get(key), resumed.get(key)) for key in straight.keys() | resumed.keys()
                   if straight.get(key) != resumed.get(key)}  # fmt: skip
    assert differences == {}  # (straight, resumed): exact, the same floats, not close ones
