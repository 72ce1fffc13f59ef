"""A participant's first day on the organisers' release, as typed: ``make data-check``, ``make train ... debug=smoke``,
``make submit TEMPLATE=<their test list>`` (the zip), unzip, ``make score`` on the unzipped CSV. The folder is the
organisers' format exactly (tests/cxrlt2026_release.py); nothing is edited and no ``label_map`` is given."""

from __future__ import annotations

import argparse
import os
import subprocess
import zipfile

import numpy as np
import pandas as pd
import pytest
from mlflow import MlflowClient

from apps.score import score
from evaluation.organiser_names import TASK1_COLUMNS
from tests.conftest import PROJECT_ROOT
from tests.cxrlt2026_release import DEV_LABELS, write_release
from training.data.adapters.cxrlt2026_files import TEST_LISTS

pytestmark = pytest.mark.e2e  # trains through the real commands: make test-e2e (docs/development.md)


def make(*args: str, env: dict, timeout: int = 900) -> subprocess.CompletedProcess:
    done = subprocess.run(["make", "--no-print-directory", "-C", str(PROJECT_ROOT), *args], env=env,
                          capture_output=True, text=True, timeout=timeout)  # fmt: skip
    assert done.returncode == 0, f"make {args[0]}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done


@pytest.fixture(scope="module")
def rehearsal(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("rehearsal")
    release = write_release(tmp / "release")
    env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{tmp}/mlflow.db", "PYTHONUNBUFFERED": "1"}
    data = [*release.overrides(labelled=False), f"data.source.eval_labels=[{DEV_LABELS['task1']}]",
            f"data.source.out_dir={tmp}/manifests"]  # fmt: skip
    check = make("data-check", "DATA=cxrlt2026", f"DATA_ROOT={release.root}", f"ARGS={' '.join(data[2:])}", env=env)
    train_args = [*data, "debug=smoke", "data.num_workers=0", "trainer.enable_progress_bar=false",
                  "evaluation.n_boot=20", "evaluation.plots=false", "tta.enabled=false",
                  "evaluation.perturbation.enabled=false", f"tracking.artifact_root={tmp}/artifacts",
                  f"tracking.checkpoint_root={tmp}/checkpoints"]  # fmt: skip
    train = make("train", "TASK=task1", f"ARGS={' '.join(train_args)}", env=env)
    client = MlflowClient(env["MLFLOW_TRACKING_URI"])
    (run,) = client.search_runs([client.get_experiment_by_name("task1").experiment_id])
    out = tmp / "submission.zip"
    make("submit", "TASK=task1", f"MODEL={run.info.run_id}", f"TEMPLATE={release.root / TEST_LISTS['task1']}",
         f"OUT={out}", env=env)  # fmt: skip
    with zipfile.ZipFile(out) as archive:
        names = archive.namelist()
        (csv_name,) = [n for n in names if n.endswith(".csv") and "/" not in n]
        archive.extract(csv_name, tmp / "unzipped")
    predictions = tmp / "unzipped" / csv_name
    scored = make("score", "TASK=task1", f"PREDICTIONS={predictions}", f"MANIFEST={release.root / DEV_LABELS['task1']}",
                  env=env)  # fmt: skip
    return {"release": release, "run": run, "check": check.stdout, "train": train.stdout + train.stderr,
            "names": names, "predictions": predictions, "score": scored.stdout}  # fmt: skip


def test_data_check_and_training_read_the_release_as_shipped(rehearsal):
    release, run = rehearsal["release"], rehearsal["run"]
    assert "CXR-LT 2026 release" in rehearsal["check"] and "removed from training: 2" in rehearsal["check"]
    assert run.info.status == "FINISHED" and run.data.tags["data_source"] == "cxrlt2026"
    assert run.data.tags["cxrlt.release.removed_from_training"] == str(len(release.leaked))
    assert run.data.tags["cxrlt.release.patient_ids"].startswith("PadChest's own PatientID")
    assert "test/mAP" in run.data.metrics


def test_the_submission_header_is_the_organisers_byte_for_byte(rehearsal):
    first = rehearsal["predictions"].read_bytes().split(b"\n")[0]
    assert first == ("ImageID," + ",".join(TASK1_COLUMNS.values())).encode()
    frame = pd.read_csv(rehearsal["predictions"], dtype=str)
    assert frame["ImageID"].tolist() == rehearsal["release"].evaluation["task1"]  # the template's order
    assert any(n.startswith("code/") for n in rehearsal["names"])


def test_make_score_on_the_unzipped_file_reproduces_the_runs_test_map(rehearsal):
    run, release = rehearsal["run"], rehearsal["release"]
    expected = run.data.metrics["test/mAP"]
    assert f"{expected:.4f}" in rehearsal["score"]
    args = argparse.Namespace(predictions=rehearsal["predictions"], manifest=release.root / DEV_LABELS["task1"],
                              split="test", task="task1", n_boot=10, data=None)  # fmt: skip
    results = score(args)
    assert abs(results["all"]["mAP"] - expected) < 1e-9
    # The same values spelt the platform's way score the same.
    frame = pd.read_csv(rehearsal["predictions"], dtype={"ImageID": str})
    platform = frame.rename(columns={"ImageID": "image_id", **{v: k for k, v in TASK1_COLUMNS.items()}})
    respelt = rehearsal["predictions"].with_name("platform.csv")
    platform.to_csv(respelt, index=False)
    again = score(argparse.Namespace(**{**vars(args), "predictions": respelt}))
    assert again["all"]["mAP"] == results["all"]["mAP"]
    assert np.isfinite(results["all"]["mAUROC"])
