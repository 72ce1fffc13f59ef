"""A broken manifest stops the CLI before any model or run exists, with its message and no traceback."""

import re
import subprocess

import pandas as pd
import pytest
from mlflow import MlflowClient

from tests.conftest import train_command

pytestmark = pytest.mark.e2e  # trains through the real CLI: make test-e2e (docs/development.md)


def _break_duplicate(table):
    table.loc[5, "image_id"] = table.loc[2, "image_id"]
    return table


def _break_column(table):
    return table.rename(columns={"Pleural Effusion": "Pleural Efusion"})


def _break_file(table):
    table.loc[4, "path"] = "images/missing.png"
    return table


def _header_only(table):
    return table.iloc[:0]


def _scientific_id(table):
    table.loc[3, "image_id"] = "1e5"
    return table


@pytest.mark.parametrize(
    ("breaker", "expected"),
    [
        (_break_duplicate, "column 'image_id': 'img2' duplicated on lines [4, 7]"),
        (_break_column, "column 'Pleural Efusion': unknown label column (did you mean 'Pleural Effusion'?)"),
        (_break_file, "line 6, column 'path': image file not found"),
        (_header_only, "line 1: a header without rows"),
        (_scientific_id, "line 5, column 'image_id': '1e5' looks like a number"),
    ],
)
def test_cli_refuses_a_broken_manifest(make_manifest, tmp_path, run_env, breaker, expected):
    path = make_manifest(n=12)
    breaker(pd.read_csv(path, dtype=str, keep_default_na=False)).to_csv(path, index=False)
    done = _train(tmp_path, run_env, path)
    assert done.returncode != 0
    assert re.search(rf"{re.escape(str(path))}: \d problem\(s\), nothing was trained:\n", done.stderr)
    assert expected in done.stderr
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    _assert_no_run(run_env)


def test_cli_names_an_empty_manifest_file(tmp_path, run_env):
    path = tmp_path / "manifest.csv"
    path.write_text("")
    done = _train(tmp_path, run_env, path)
    assert done.returncode != 0
    assert f"{path}: empty file, not even a header line" in done.stderr
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    _assert_no_run(run_env)


def _train(tmp_path, run_env, path):
    return subprocess.run(
        train_command(tmp_path, "data=manifest", f"data.source.manifest={path}", "data.image_size=32"),
        env=run_env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def _assert_no_run(run_env):
    experiment = MlflowClient(run_env["MLFLOW_TRACKING_URI"]).get_experiment_by_name("task1")
    assert experiment is None or not MlflowClient(run_env["MLFLOW_TRACKING_URI"]).search_runs(
        [experiment.experiment_id]
    )
