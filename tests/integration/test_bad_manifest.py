"""A broken manifest stops the CLI before any model or run exists."""

import subprocess

import pandas as pd
import pytest
from mlflow import MlflowClient

from tests.conftest import train_command


def _break_duplicate(table):
    table.loc[5, "image_id"] = table.loc[2, "image_id"]
    return table


def _break_column(table):
    return table.rename(columns={"Pleural Effusion": "Pleural Efusion"})


def _break_file(table):
    table.loc[4, "path"] = "images/missing.png"
    return table


@pytest.mark.parametrize(
    ("breaker", "expected"),
    [
        (_break_duplicate, "column 'image_id': 'img2' duplicated on lines [4, 7]"),
        (_break_column, "column 'Pleural Efusion': unknown label column (did you mean 'Pleural Effusion'?)"),
        (_break_file, "line 6, column 'path': image file not found"),
    ],
)
def test_cli_refuses_a_broken_manifest(make_manifest, tmp_path, run_env, breaker, expected):
    path = make_manifest(n=12)
    breaker(pd.read_csv(path, dtype=str, keep_default_na=False)).to_csv(path, index=False)
    done = subprocess.run(
        train_command(tmp_path, "data=manifest", f"data.source.manifest={path}", "data.image_size=32"),
        env=run_env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode != 0
    assert expected in done.stdout + done.stderr
    assert "nothing was trained" in done.stdout + done.stderr
    experiment = MlflowClient(run_env["MLFLOW_TRACKING_URI"]).get_experiment_by_name("task1")
    assert experiment is None or not MlflowClient(run_env["MLFLOW_TRACKING_URI"]).search_runs(
        [experiment.experiment_id]
    )
