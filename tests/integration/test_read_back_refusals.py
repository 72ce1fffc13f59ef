"""What a run holds is refused in one named line when it is not what the platform logged: a checkpoint with pickled
code, an artifact that is a symbolic link, and ``resume=<run id>`` of a run recorded under another config."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from apps.serving import CXRClassifierModel
from tests.conftest import PROJECT_ROOT, train_command
from tests.finished_runs import Payload, fabricate_finished_run
from training.checkpoint_io import UnsafeCheckpoint
from training.runs import load_finished
from training.tracking.artifacts import UnsafeArtifact
from training.tracking.resume import RUN_KEY_TAG

pytestmark = pytest.mark.e2e  # trains through the real CLI: make test-e2e (docs/development.md)


def artifact_folder(client, run_id: str) -> Path:
    return Path(client.get_run(run_id).info.artifact_uri.removeprefix("file://"))


def test_a_checkpoint_with_pickled_code_is_one_named_line_under_make_evaluate(tmp_path):
    client, run_id, _ = fabricate_finished_run(tmp_path)
    best = artifact_folder(client, run_id) / "checkpoints" / "best.ckpt"
    state = torch.load(best, weights_only=True)
    torch.save({**state, "extra": Payload(tmp_path / "ran.marker")}, best)

    done = subprocess.run([sys.executable, "-m", "apps.evaluate", f"run={run_id}"], cwd=PROJECT_ROOT,
                          env={**os.environ, "MLFLOW_TRACKING_URI": client.tracking_uri},
                          capture_output=True, text=True, timeout=600)  # fmt: skip
    assert done.returncode == 1, done.stderr[-2000:]
    assert "Traceback" not in done.stderr and not (tmp_path / "ran.marker").exists()
    (message,) = [line for line in done.stderr.splitlines() if "holds pickled Python objects" in line]
    assert message.startswith(f"run {run_id} checkpoints/best.ckpt holds pickled Python objects (") or (
        f"error: run {run_id} checkpoints/best.ckpt holds pickled" in message
    ), message
    assert "refusing to load it" in message
    # The served model's weights file is refused the same way.
    weights = tmp_path / "weights.pt"
    torch.save({"w": torch.zeros(1), "extra": Payload(tmp_path / "ran.marker")}, weights)
    context = SimpleNamespace(artifacts={"spec": str(tmp_path / "spec.json"), "weights": str(weights)})
    (tmp_path / "spec.json").write_text("{}")
    with pytest.raises(UnsafeCheckpoint, match="the registered model's weights holds pickled Python objects"):
        CXRClassifierModel().load_context(context)
    assert not (tmp_path / "ran.marker").exists()


@pytest.mark.parametrize("artifact", ["checkpoints", "config.yaml"])
def test_an_artifact_replaced_by_a_symbolic_link_is_refused_by_name(tmp_path, artifact):
    client, run_id, _ = fabricate_finished_run(tmp_path)
    elsewhere = tmp_path / "elsewhere"
    shutil.copytree(artifact_folder(client, run_id), elsewhere)  # the same bytes: only the link is wrong
    inside = artifact_folder(client, run_id) / artifact
    shutil.rmtree(inside) if inside.is_dir() else inside.unlink()
    inside.symlink_to(elsewhere / artifact)
    with pytest.raises(UnsafeArtifact, match=rf"run {run_id}: artifact {artifact} is a symbolic link \(to {elsewhere}"):
        load_finished(run_id, client)


def test_resume_of_a_run_recorded_under_another_config_is_refused_naming_the_settings(tmp_path, run_env, smoke_data):
    """The run was started with ``loss=bce``; ``resume=<its id>`` with ``loss=asl`` must not continue it."""
    from mlflow import MlflowClient

    client = MlflowClient(run_env["MLFLOW_TRACKING_URI"])
    experiment = client.create_experiment("task1")
    run_id = client.create_run(experiment, tags={RUN_KEY_TAG: "0123456789abcdef"}).info.run_id
    client.log_param(run_id, "loss.name", "bce")
    last = tmp_path / "checkpoints" / run_id / "last.ckpt"
    last.parent.mkdir(parents=True)
    torch.save({"epoch": 0}, last)

    done = subprocess.run(train_command(tmp_path, "debug=smoke", "loss=asl", f"resume={run_id}",
                                        f"data.source.root={smoke_data[0]}"),
                          env=run_env, capture_output=True, text=True, timeout=600, cwd=PROJECT_ROOT)  # fmt: skip
    assert done.returncode == 1, done.stdout[-2000:] + done.stderr[-2000:]
    assert "Traceback" not in done.stderr
    assert f"resume={run_id}: that run was recorded under another config (loss.name: bce -> asl" in done.stderr
    assert client.get_run(run_id).info.status == "RUNNING" and len(client.search_runs([experiment])) == 1
