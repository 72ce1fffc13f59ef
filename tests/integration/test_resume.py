"""Kill a training during its second epoch, resume it: same run, every epoch logged exactly once, and the same
numbers as a training that was never interrupted. Killed again in its test phase and resumed, it still logs every
value once. The logs go to files, as a cluster job's do: each epoch is one progress line there."""

import os
import re
import subprocess

import pytest
import torch
from mlflow import MlflowClient

from tests.conftest import train_command
from tests.process_budget import wait_working

pytestmark = pytest.mark.e2e  # trains through the real CLI: make test-e2e (docs/development.md)

EPOCHS = 4
# Every per-epoch key the module logs (train/lr is scheduled by step, so it is the optimiser and scheduler state).
EPOCH_KEYS = ("train/loss", "train/lr", "val/mAP", "val/mAUROC")


def _overrides(data_root) -> tuple[str, ...]:
    """A smoke run cut to 8 steps an epoch and a test phase without TTA, perturbed copy or plots: the claims are
    about which values a resumed run logs, and every value goes through the same check whatever the phase."""
    return ("debug=smoke", f"trainer.max_epochs={EPOCHS}", "data.batch_size=8", f"data.source.root={data_root}",
            "data.debug_size.train=64", "data.debug_size.val=32", "data.debug_size.test=32",
            "evaluation.heldout.size=16", "evaluation.n_boot=20", "evaluation.plots=false", "tta.enabled=false",
            "evaluation.perturbation.enabled=false")  # fmt: skip


#: ``python -m training.train`` that SIGKILLs itself (no clean-up, like a lost node) at the second training step of
#: epoch ``{epoch}``: mid-epoch, after the previous epoch's ``last.ckpt``, and at the same point on every run, so
#: the resumed run's numbers can be compared exactly.
KILLED_IN_EPOCH = """
import os, runpy, signal
from training.models.module import MultiLabelClassifier
step = MultiLabelClassifier.training_step
def killed_in_epoch(self, batch, batch_idx):
    if self.current_epoch == {epoch} and batch_idx == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    return step(self, batch, batch_idx)
MultiLabelClassifier.training_step = killed_in_epoch
runpy.run_module("training.train", run_name="__main__")
"""


#: ``python -m training.train`` that SIGKILLs itself in its test phase, right after its first test metrics were
#: stored (``best_epoch`` and ``val/mAP_best`` are logged before them): a kill at a known point of that phase.
KILLED_IN_TEST_PHASE = """
import os, runpy, signal
import training.pipeline as pipeline
test_phase = pipeline.run_test_phase
def killed_in_test_phase(model, datamodule, cfg, session):
    log = session.log_metrics
    def log_then_die(metrics, *args, **kwargs):
        log(metrics, *args, **kwargs)
        if any(key.startswith("test/") for key in metrics):
            os.kill(os.getpid(), signal.SIGKILL)
    session.log_metrics = log_then_die
    return test_phase(model, datamodule, cfg, session)
pipeline.run_test_phase = killed_in_test_phase
runpy.run_module("training.train", run_name="__main__")
"""

#: One progress line per epoch (training/console.py, EpochLines): ``epoch 2/3: 11.8 step/s, train/loss ..., ETA ...``.
PROGRESS = re.compile(rf"^epoch (\d+)/{EPOCHS - 1}: \d+\.\d step/s, train/loss \d\.\d{{4}}, val/mAP \d\.\d{{4}}, "
                      r"ETA \d+:\d\d:\d\d$", re.MULTILINE)  # fmt: skip


def _progress_epochs(output: str) -> list[int]:
    return [int(epoch) for epoch in PROGRESS.findall(output)]


def _once_each(output: str) -> None:
    """Lightning's lines printed once, not also by its own console handler (``INFO: Seed set to 42``)."""
    assert output.count("Seed set to 42") == 1, output[:2000]
    assert "INFO: " not in output, output[:2000]


#: CPU seconds a smoke training of EPOCHS epochs may use: many times what it takes, and independent of how busy the
#: machine is (tests/process_budget.py).
TRAINING_CPU_SECONDS = 600


def _killed_in_epoch(out, env, overrides, epoch: int) -> str:
    """Start a training that SIGKILLs itself in epoch ``epoch`` (``KILLED_IN_EPOCH``); returns its run id.

    The output goes to a file: a pipe nobody reads fills up and stalls the training.
    """
    log = out / "first.log"
    command = train_command(out, *overrides)
    command[1:3] = ["-c", KILLED_IN_EPOCH.replace("{epoch}", str(epoch))]
    with log.open("w") as sink:
        first = subprocess.Popen(command, env=env, stdout=sink, stderr=subprocess.STDOUT)
    wait_working(first, f"training until epoch {epoch}", TRAINING_CPU_SECONDS)
    assert first.returncode == -9, log.read_text()[-3000:]
    (last,) = (out / "checkpoints").glob("*/last.ckpt")
    assert torch.load(last, map_location="cpu", weights_only=True)["epoch"] == epoch - 1
    return last.parent.name


def _resume(out, env, overrides, run_id: str, name: str = "resumed", killed_in_test_phase: bool = False) -> str:
    """Resume the run (and SIGKILL it in its test phase if asked); returns what it printed."""
    log = out / f"{name}.log"
    command = train_command(out, *overrides, "resume=true")
    if killed_in_test_phase:
        command[1:3] = ["-c", KILLED_IN_TEST_PHASE]  # `python -m training.train ...` with the kill patched in
    with log.open("w") as sink:
        second = subprocess.Popen(command, env=env, stdout=sink, stderr=subprocess.STDOUT)
    wait_working(second, f"the {name} training", TRAINING_CPU_SECONDS)
    output = log.read_text()
    assert second.returncode == (-9 if killed_in_test_phase else 0), output[-3000:]
    assert f"resuming run {run_id}" in output
    return output


def _metrics(client: MlflowClient, run_id: str) -> dict[tuple[str, int], float]:
    """Every value the run logged by ``(key, step)``: each epoch of the per-epoch keys, and the test metrics.

    MLflow's ``system/`` metrics (CPU load, memory) describe the machine, not the model, and are left out.
    """
    keys = [key for key in client.get_run(run_id).data.metrics if not key.startswith("system/")]
    return {(key, m.step): m.value for key in keys for m in client.get_metric_history(run_id, key)}


def test_killed_run_resumes_into_the_same_run(tmp_path, run_env, smoke_data):
    """Killed in epoch 1 after epoch 0's checkpoint, resumed, killed again in the test phase, resumed: one run, every
    value of every key logged once per step (the test phase's ``best_epoch``, ``val/mAP_best`` and ``test/...``
    included)."""
    overrides = _overrides(smoke_data[0])
    run_id = _killed_in_epoch(tmp_path, run_env, overrides, epoch=1)
    client = MlflowClient(run_env["MLFLOW_TRACKING_URI"])
    assert client.get_run(run_id).info.status == "RUNNING"
    first = (tmp_path / "first.log").read_text()
    _once_each(first)
    assert _progress_epochs(first) == [0], first[-3000:]

    resumed = _resume(tmp_path, run_env, overrides, run_id, killed_in_test_phase=True)
    _once_each(resumed)
    assert _progress_epochs(resumed) == list(range(1, EPOCHS)), resumed[-3000:]  # one line per epoch
    assert client.get_run(run_id).info.status == "RUNNING"
    assert "best_epoch" in client.get_run(run_id).data.metrics  # killed in the test phase, after it began logging
    _once_each(_resume(tmp_path, run_env, overrides, run_id, name="finished"))

    experiment = client.get_experiment_by_name("task1")
    runs = client.search_runs([experiment.experiment_id])
    assert [r.info.run_id for r in runs] == [run_id]
    assert runs[0].info.status == "FINISHED"
    for key in EPOCH_KEYS:
        steps = sorted(m.step for m in client.get_metric_history(run_id, key))
        assert steps == list(range(EPOCHS)), (key, steps)  # the step is the epoch: each exactly once
    assert {"test/mAP", "best_epoch", "val/mAP_best"} <= runs[0].data.metrics.keys()
    keys = [key for key in runs[0].data.metrics if not key.startswith("system/")]
    repeated = {key: steps for key in keys
                if len(steps := [m.step for m in client.get_metric_history(run_id, key)]) != len(set(steps))}  # fmt: skip
    assert repeated == {}  # key: its steps, a step repeated where a value was logged twice
    assert [a.path for a in client.list_artifacts(run_id, "checkpoints")] == ["checkpoints/best.ckpt"]


@pytest.mark.slow
@pytest.mark.parametrize("extra", [(), ("ema=ema", "checkpoint.keep_last=true")], ids=["default", "ema_keep_last"])
def test_resumed_run_reproduces_the_uninterrupted_run_exactly(tmp_path, extra, smoke_data):
    """Killed after epoch 1 and resumed at epoch 2, a run must log what a run that was never stopped logs.

    Epoch 2 is the first epoch of the resumed fit, where every stateful random stream (the shuffle, the sampler's
    draw, the augmentation pipeline's own generator) would restart from its beginning unless it is a function of
    the epoch or restored from the checkpoint; epoch 3 checks that the streams stay aligned after that. With the
    small-real preset's EMA and kept final epoch, the average and the kept checkpoint must resume too.
    """
    overrides = (*_overrides(smoke_data[0]), *extra)  # one generated data set for both runs
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
            run_id = _killed_in_epoch(out, env, overrides, epoch=2)
            _resume(out, env, overrides, run_id)
        stores[name] = _metrics(MlflowClient(env["MLFLOW_TRACKING_URI"]), run_id)

    straight, resumed = stores["straight"], stores["resumed"]
    assert {(key, epoch) for key in EPOCH_KEYS for epoch in range(EPOCHS)} <= straight.keys()
    assert any(key == "test/mAP" for key, _ in straight), sorted(straight)
    differences = {key: (straight.get(key), resumed.get(key)) for key in straight.keys() | resumed.keys()
                   if straight.get(key) != resumed.get(key)}  # fmt: skip
    assert differences == {}  # (straight, resumed): exact, the same floats, not close ones
