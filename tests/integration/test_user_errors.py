"""Errors a user causes, through the real command lines: exit code 1, one message naming where, no traceback.

Also ``make score`` on ids with leading zeros (they are text), and ``make evaluate`` refusing, by name and before
anything runs, a finished run whose stored config names a callable the project would never build.
"""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
from mlflow import MlflowClient

from tests.conftest import PROJECT_ROOT
from training.data.findings import TASK1_LABELS

pytestmark = pytest.mark.e2e  # trains through the real CLI: make test-e2e (docs/development.md)


def run(*args: str, env: dict, timeout: int = 180) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", *args], env=env, cwd=PROJECT_ROOT, capture_output=True, text=True,
                          timeout=timeout)  # fmt: skip


def assert_reported(done: subprocess.CompletedProcess, *expected: str) -> None:
    assert done.returncode == 1, done.stdout[-2000:] + done.stderr[-2000:]
    assert "Traceback" not in done.stderr, done.stderr[-4000:]
    for text in expected:
        assert text in done.stderr, done.stderr[-4000:]


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (["data.image_size=abc"], ["data.image_size=abc: expected an integer (the config's value is 128), got 'abc'"]),
        (["loss.gamma_neg=4"], ["loss=bce has no setting 'gamma_neg'; it is a setting of loss=asl"]),
        (["loss=nope"], ["loss=nope: no loss called 'nope' (configs/loss/)", "choices: asl, bce"]),
    ],
)
def test_train_refuses_bad_overrides_without_a_traceback(tmp_path, run_env, overrides, expected):
    assert_reported(run("training.train", *overrides, env=run_env), *expected)


def test_hydra_full_error_keeps_the_traceback(run_env):
    done = run("training.train", "data.image_size=abc", env={**run_env, "HYDRA_FULL_ERROR": "1"})
    assert done.returncode != 0
    assert "Traceback" in done.stderr and "OverrideError" in done.stderr


def test_data_check_refuses_what_training_refuses(make_manifest, run_env):
    path = make_manifest(n=12)
    table = pd.read_csv(path, dtype=str, keep_default_na=False).rename(columns={"Cardiomegaly": "Cardiomegally"})
    table.to_csv(path, index=False)
    done = run("training.data_check", "data=manifest", f"data.source.manifest={path}", env=run_env)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert f"1 error(s) in {path}:" in done.stdout
    assert "line 1, column 'Cardiomegally': unknown label column (did you mean 'Cardiomegaly'?)" in done.stdout
    path.write_text("")
    done = run("training.data_check", "data=manifest", f"data.source.manifest={path}", env=run_env)
    assert_reported(done, f"{path}: empty file, not even a header line")


@pytest.fixture
def zero_padded(tmp_path):
    """A manifest and predictions keyed by ids with leading zeros (``000012``), as a spreadsheet would drop them."""
    rng = np.random.default_rng(0)
    ids = [f"{i:06d}" for i in range(12)]
    labels = {name: rng.integers(0, 2, 12).astype(str) for name in TASK1_LABELS}
    manifest = pd.DataFrame({"image_id": ids, "path": [f"{i}.png" for i in ids], "split": ["train", "val", "test"] * 4,
                             "patient_id": ids, **labels})  # fmt: skip
    manifest.to_csv(tmp_path / "manifest.csv", index=False)
    test = manifest[manifest["split"] == "test"]
    predictions = pd.DataFrame({"image_id": test["image_id"], **{n: rng.random(len(test)) for n in TASK1_LABELS}})
    predictions.to_csv(tmp_path / "predictions.csv", index=False)
    return tmp_path / "predictions.csv", tmp_path / "manifest.csv"


def test_score_matches_ids_with_leading_zeros(zero_padded, run_env):
    predictions, manifest = zero_padded
    done = run("apps.score", str(predictions), str(manifest), "--n-boot", "10", env=run_env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"{predictions} on {manifest} [test], 4 images" in done.stdout


def test_score_names_a_bad_cell_and_keeps_the_traceback_behind_debug(zero_padded, run_env):
    predictions, manifest = zero_padded
    table = pd.read_csv(predictions, dtype=str)
    table.loc[2, "Hernia"] = "high"
    table.to_csv(predictions, index=False)
    done = run("apps.score", str(predictions), str(manifest), env=run_env)
    assert_reported(done, f"error: {predictions}: line 4, column 'Hernia': 'high' is not a probability in [0, 1]")
    debug = run("apps.score", str(predictions), str(manifest), "--debug", env=run_env)
    assert debug.returncode != 0 and "Traceback" in debug.stderr


@pytest.fixture
def store(tmp_path, run_env):
    """An empty tracking store in ``tmp_path`` with the ``task1`` experiment, its artifacts under ``tmp_path``."""
    client = MlflowClient(run_env["MLFLOW_TRACKING_URI"])
    experiment = client.create_experiment("task1", artifact_location=str(tmp_path / "artifacts"))
    return client, experiment


def finished_run(client: MlflowClient, experiment: str, config: str) -> str:
    """A FINISHED run whose only artifact is ``config`` as its ``config.yaml``: no training needed to load it."""
    run_id = client.create_run(experiment).info.run_id
    client.log_text(run_id, config, "config.yaml")
    client.set_terminated(run_id, "FINISHED")
    return run_id


@pytest.mark.parametrize(
    ("target", "arguments"),
    [
        ("torch.load", "f: {src}\n    weights_only: false"),
        ("shutil.copy", "src: {src}\n    dst: {dst}"),
        ("pathlib.Path.write_text", "self: {dst}\n    data: written"),
    ],
)
def test_evaluate_refuses_a_stored_config_naming_a_foreign_callable(tmp_path, run_env, store, target, arguments):
    src, dst = tmp_path / "source.bin", tmp_path / "destination"
    src.write_bytes(b"not a checkpoint")
    config = f"task:\n  name: task1\nmodel:\n  name: evil\n  head:\n    _target_: {target}\n    {arguments}\n"
    run_id = finished_run(*store, config.format(src=src, dst=dst))
    done = run("apps.evaluate", f"run={run_id}", env=run_env)
    assert_reported(done, f"run {run_id} config.yaml: model.head._target_ = '{target}' is not a class or function "
                          "that this project's configs/ name; refusing to build it")  # fmt: skip
    assert not dst.exists()


def test_register_and_submit_name_an_unknown_run(store, run_env, tmp_path):
    done = run("apps.registry", "--run", "0123456789abcdef", env=run_env)
    assert_reported(done, "error: no run '0123456789abcdef' in the tracking store")
    done = run("apps.submit_cli", "--model", "0123456789abcdef", "--out", str(tmp_path / "s.csv"), env=run_env)
    assert_reported(done, "error: no run '0123456789abcdef' in the tracking store")
