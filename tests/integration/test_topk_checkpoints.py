"""Two validations per epoch and the best three checkpoints kept, end to end through `make train`: the run logs each
validation at its own step, uploads the three checkpoints as weights only (no optimizer state) with an index whose
values are the logged validation values, and `make ensemble MODELS=<run id>:top3` weighs exactly those three;
`make evaluate RUN=<run id>:rank2` evaluates one of them into a nested run."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import torch
from mlflow import MlflowClient

from tests.conftest import PROJECT_ROOT

pytestmark = pytest.mark.e2e  # trains through the real CLI: make test-e2e (docs/development.md)

QUIET = ("evaluation.n_boot=20", "evaluation.per_source=false", "tta.enabled=false",
         "evaluation.perturbation.enabled=false", "evaluation.plots=false", "trainer.enable_progress_bar=false",
         "tracking.system_metrics.enabled=false")  # fmt: skip


def make(env: dict, *args: str) -> subprocess.CompletedProcess:
    """The command the user types, against the test's store."""
    return subprocess.run(["make", "-s", *args], env=env, capture_output=True, text=True, timeout=900,
                          cwd=PROJECT_ROOT)  # fmt: skip


@pytest.fixture(scope="module")
def top3(tmp_path_factory, smoke_data):
    tmp = tmp_path_factory.mktemp("topk")
    env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{tmp}/mlflow.db", "PYTHONUNBUFFERED": "1",
           "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false"}  # fmt: skip
    args = ("debug=smoke", "trainer.max_epochs=2", "trainer.val_check_interval=0.5", "checkpoint.save_top_k=3",
            f"data.source.root={smoke_data[0]}", f"tracking.artifact_root={tmp}/artifacts",
            f"tracking.checkpoint_root={tmp}/checkpoints", *QUIET)  # fmt: skip
    done = make(env, "train", "TASK=task1", "ARGS=" + " ".join(args))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    client = MlflowClient(env["MLFLOW_TRACKING_URI"])
    (run,) = client.search_runs([client.get_experiment_by_name("task1").experiment_id])
    return tmp, env, client, run


def _download(client, run_id: str, path: str, folder: Path) -> Path:
    return Path(client.download_artifacts(run_id, path, str(folder)))


def test_three_best_validations_are_logged_as_weights_with_their_values(top3, tmp_path):
    tmp, _, client, run = top3
    run_id = run.info.run_id
    history = {m.step: m.value for m in client.get_metric_history(run_id, "val/mAP")}
    first = min(history)  # two validations in each of two epochs, each at its own optimizer step
    assert sorted(history) == [first, 2 * first, 3 * first, 4 * first]
    index = json.loads(_download(client, run_id, "checkpoints/top/index.json", tmp_path).read_text())
    rows = index["checkpoints"]
    assert [row["rank"] for row in rows] == [1, 2, 3] and all(row["monitor"] == "val/mAP" for row in rows)
    values = [row["value"] for row in rows]
    assert values == sorted(values, reverse=True)
    assert values == pytest.approx(sorted(history.values(), reverse=True)[:3])  # the three best of the four
    assert all(row["value"] == pytest.approx(history[row["step"]]) for row in rows)  # each its own validation's
    assert run.data.metrics["val/mAP_best"] == pytest.approx(values[0])
    assert run.data.metrics["best_epoch"] == rows[0]["epoch"]

    uploaded = {a.path for a in client.list_artifacts(run_id, "checkpoints/top")}
    assert uploaded == {"checkpoints/top/index.json", "checkpoints/top/rank2.ckpt", "checkpoints/top/rank3.ckpt"}
    for row in rows:
        state = torch.load(_download(client, run_id, row["artifact"], tmp_path / str(row["rank"])),
                           map_location="cpu", weights_only=True)  # fmt: skip
        assert set(state) == {"state_dict", "epoch", "global_step"}  # no optimizer, scheduler or loop state
        assert (state["epoch"], state["global_step"]) == (row["epoch"], row["step"])
        for split in ("val", "test"):
            if row["rank"] > 1:  # what make ensemble weighs the rank by
                _download(client, run_id, f"predictions/rank{row['rank']}/{split}.csv", tmp_path / str(row["rank"]))
    assert not (tmp / "checkpoints" / run_id).exists()  # the resumable checkpoints went with the finished run
    assert int(run.data.params["effective_batch_size"]) == int(run.data.params["data.batch_size"])  # 1 x 1 device


def test_make_ensemble_weighs_the_three_kept_checkpoints(top3):
    tmp, env, client, run = top3
    run_id = run.info.run_id
    done = make(env, "ensemble", "TASK=task1", f"MODELS={run_id}:top3", "WEIGHTS=per_model")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (ensemble,) = client.search_runs([run.info.experiment_id], filter_string="tags.`cxrlt.kind` = 'ensemble'")
    members = [run_id, f"{run_id}:rank2", f"{run_id}:rank3"]
    assert ensemble.data.params["members"] == " ".join(members)
    weights = json.loads(_download(client, ensemble.info.run_id, "ensemble/weights.json", tmp / "w").read_text())
    assert weights["members"] == members
    # member 0 is the run's own best checkpoint, scored from the predictions its test phase stored
    metrics = ensemble.data.metrics
    assert {f"ensemble/val/mAP_member{k}" for k in range(3)} <= metrics.keys()
    assert metrics["ensemble/test/mAP_member0"] == pytest.approx(run.data.metrics["test/mAP"])

    too_many = make(env, "ensemble", "TASK=task1", f"MODELS={run_id}:top4")
    assert too_many.returncode != 0
    assert f"run {run_id} kept 3 checkpoint(s), not 4" in too_many.stderr + too_many.stdout
    assert "Traceback" not in too_many.stderr + too_many.stdout


def test_make_evaluate_judges_a_chosen_checkpoint_in_a_nested_run(top3):
    _, env, client, run = top3
    run_id = run.info.run_id
    done = make(env, "evaluate", f"RUN={run_id}:rank2", "ARGS=" + " ".join(QUIET[:5]))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (nested,) = client.search_runs([run.info.experiment_id], filter_string=f"tags.`mlflow.parentRunId` = '{run_id}'")
    assert nested.data.tags["cxrlt.checkpoint"] == f"{run_id}:rank2" and nested.info.status == "FINISHED"
    assert "test/mAP" in nested.data.metrics
    assert client.get_run(run_id).data.metrics["test/mAP"] == run.data.metrics["test/mAP"]  # the run's own kept


#: ``python -m training.train`` that SIGKILLs itself in epoch 2 after that epoch's first validation was logged and
#: its checkpoint kept (batch 6 of 8; validations after batches 4 and 8), but before the epoch's ``last.ckpt``.
KILLED_AFTER_MID_EPOCH_VALIDATION = """
import os, runpy, signal
from training.models.module import MultiLabelClassifier
step = MultiLabelClassifier.training_step
def killed(self, batch, batch_idx):
    if self.current_epoch == 2 and batch_idx == 5:
        os.kill(os.getpid(), signal.SIGKILL)
    return step(self, batch, batch_idx)
MultiLabelClassifier.training_step = killed
runpy.run_module("training.train", run_name="__main__")
"""

#: 64 training images in batches of 8: 8 steps an epoch, validated after the 4th and the 8th.
RESUMED = ("debug=smoke", "trainer.max_epochs=4", "data.batch_size=8", "data.debug_size.train=64",
           "data.debug_size.val=32", "data.debug_size.test=32", "evaluation.heldout.size=16",
           "trainer.val_check_interval=0.5", "checkpoint.save_top_k=3", "ema=ema", *QUIET)  # fmt: skip


def _metrics(client: MlflowClient, run_id: str) -> dict[tuple[str, int], list[float]]:
    keys = [key for key in client.get_run(run_id).data.metrics if not key.startswith("system/")]
    values: dict[tuple[str, int], list[float]] = {}
    for key in keys:
        for m in client.get_metric_history(run_id, key):
            values.setdefault((key, m.step), []).append(m.value)
    return values


@pytest.mark.slow
def test_killed_after_a_mid_epoch_validation_the_resumed_run_logs_what_an_uninterrupted_one_does(tmp_path, smoke_data):
    from tests.conftest import train_command
    from tests.process_budget import wait_working

    overrides = (*RESUMED, f"data.source.root={smoke_data[0]}")
    stores = {}
    for name in ("straight", "resumed"):
        out = tmp_path / name
        out.mkdir()
        env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{out}/mlflow.db", "PYTHONUNBUFFERED": "1"}
        commands = [train_command(out, *overrides)]
        if name == "resumed":
            commands[0][1:3] = ["-c", KILLED_AFTER_MID_EPOCH_VALIDATION]
            commands.append(train_command(out, *overrides, "resume=true"))
        for number, command in enumerate(commands):
            with (out / f"{number}.log").open("w") as sink:
                process = subprocess.Popen(command, env=env, stdout=sink, stderr=subprocess.STDOUT)
            wait_working(process, f"{name} training {number}", 900)
            expected = -9 if name == "resumed" and number == 0 else 0
            assert process.returncode == expected, (out / f"{number}.log").read_text()[-3000:]
        client = MlflowClient(env["MLFLOW_TRACKING_URI"])
        (run,) = client.search_runs([client.get_experiment_by_name("task1").experiment_id])
        index = client.download_artifacts(run.info.run_id, "checkpoints/top/index.json", str(out))
        stores[name] = (_metrics(client, run.info.run_id), json.loads(Path(index).read_text()))

    (straight, straight_index), (resumed, resumed_index) = stores["straight"], stores["resumed"]
    assert len([key for key in straight if key[0] == "val/mAP"]) == 8  # 2 validations x 4 epochs, own steps
    assert all(len(values) == 1 for values in resumed.values())  # nothing logged twice
    differences = {key: (straight.get(key), resumed.get(key)) for key in straight.keys() | resumed.keys()
                   if straight.get(key) != resumed.get(key)}  # fmt: skip
    assert differences == {}  # exact
    assert straight_index == resumed_index
