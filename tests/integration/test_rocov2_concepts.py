"""`task=rocov2_concepts` end to end at smoke size: train on a ROCOv2-shaped release -> `make submit` writes the
ImageCLEF run file with thresholds chosen on validation -> `make score` gives its F1.

The release is built by the same fixture as the real-data test (tests/rocov2_data.py), from a drawn stand-in of the
NIH subset, so this runs without ../shared/data.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
from pathlib import Path

import pandas as pd
import pytest
import yaml
from mlflow import MlflowClient

from apps import score as score_cli
from apps import submit_cli
from apps.benchmarks.imageclef_concepts.scoring import read_concepts, read_run
from tests.conftest import train_command
from tests.rocov2_data import write_nih_standin, write_rocov2_release

pytestmark = pytest.mark.e2e  # trains through the real CLI: make test-e2e (docs/development.md)

MIN_COUNT = 3
FAST = ("tta.enabled=false", "evaluation.perturbation.enabled=false", "evaluation.n_boot=50",
        "trainer.enable_progress_bar=false")  # fmt: skip


def train(tmp, release, *overrides: str) -> subprocess.CompletedProcess:
    """`make train TASK=rocov2_concepts ARGS="data=rocov2 data.root=<release> ... debug=smoke"`, store under tmp."""
    env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{tmp}/mlflow.db", "PYTHONUNBUFFERED": "1"}
    command = train_command(tmp, "task=rocov2_concepts", "data=rocov2", f"data.root={release}",
                            f"data.source.out_dir={tmp}/manifests", f"task.min_count={MIN_COUNT}", "debug=smoke",
                            *FAST, *overrides)  # fmt: skip
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("rocov2")
    release = tmp / "release"
    ids = write_rocov2_release(release, write_nih_standin(tmp / "nih", n=120), gzip_tables=True)
    train(tmp, release)
    client = MlflowClient(f"sqlite:///{tmp}/mlflow.db")
    (run,) = client.search_runs([client.get_experiment_by_name("rocov2_concepts").experiment_id])
    return tmp, release, ids, client, run


def test_the_labels_come_from_the_training_counts_and_reach_the_stored_config(trained, tmp_path):
    tmp, release, _, client, run = trained
    assert run.info.status == "FINISHED"
    config = yaml.safe_load(Path(client.download_artifacts(run.info.run_id, "config.yaml", str(tmp_path))).read_text())
    train_table = read_concepts(release / "train_concepts.csv.gz")
    counts = pd.Series([c for cuis in train_table.values() for c in cuis]).value_counts()
    expected = sorted(counts[counts >= MIN_COUNT].index, key=lambda c: (-counts[c], c))
    assert config["task"]["labels"] == expected and len(expected) < len(counts)  # rarer CUIs are not labels
    metrics = run.data.metrics
    assert math.isfinite(metrics["test/mAP"]) and "val/mAP_best" in metrics
    table = json.loads(
        Path(client.download_artifacts(run.info.run_id, "evaluation/per_class.json", str(tmp_path))).read_text()
    )
    rows = dict(zip([r[0] for r in table["data"]], [r[table["columns"].index("name")] for r in table["data"]],
                    strict=True))  # fmt: skip
    assert rows["C0817096"] == "Chest" and rows["C1306645"] == "Plain x-ray"  # names from cui_mapping.csv


def test_submit_writes_a_valid_run_file_and_score_gives_its_f1(trained, tmp_path, monkeypatch, capsys):
    tmp, release, ids, client, run = trained
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp}/mlflow.db")
    monkeypatch.setenv("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    out = tmp_path / "run.csv"
    # `make submit TASK=rocov2_concepts MODEL=<run> OUT=...` (the Makefile's entry, in this process)
    submit_cli.main(["--task", "rocov2_concepts", "--model", run.info.run_id, "--out", str(out)])
    written = read_run(out, ids["test"])  # the organisers' rules: every test id, valid CUIs
    assert list(written) == ids["test"]
    labels = yaml.safe_load(Path(client.download_artifacts(run.info.run_id, "config.yaml", str(tmp_path))).read_text())[
        "task"
    ]
    assert {c for cuis in written.values() for c in cuis} <= set(labels["labels"])
    chosen = json.loads((tmp_path / "run.csv.thresholds.json").read_text())
    assert chosen["mode"] == "per_class" and chosen["val_f1"] >= chosen["global_f1"] - 1e-12
    assert set(chosen["thresholds"]) == set(labels["labels"])
    logged = {a.path for a in client.list_artifacts(run.info.run_id, "submissions")}
    assert logged == {"submissions/run.csv", "submissions/run.csv.thresholds.json"}

    submit_cli.main(["--task", "rocov2_concepts", "--model", run.info.run_id, "--out", str(tmp_path / "g.csv"),
                     "--thresholds", "global"])  # fmt: skip
    single = set(json.loads((tmp_path / "g.csv.thresholds.json").read_text())["thresholds"].values())
    assert len(single) == 1

    capsys.readouterr()
    # `make score TASK=rocov2_concepts PREDICTIONS=<run file> MANIFEST=<test concepts> MANUAL=<manual table>`
    score_cli.main([str(out), str(release / "test_concepts.csv.gz"), "--task", "rocov2_concepts", "--manual",
                    str(release / "test_concepts_manual.csv.gz"), "--n-boot", "50",
                    "--out", str(tmp_path / "t.csv")])  # fmt: skip
    printed = capsys.readouterr().out
    primary = float(printed.split("F1 (primary)")[1].split()[0])
    secondary = float(printed.split("F1 (secondary)")[1].split()[0])
    assert 0 < primary <= 1 and 0 < secondary <= 1
    per_concept = pd.read_csv(tmp_path / "t.csv", keep_default_na=False)
    assert per_concept.loc[per_concept["concept"] == "C0817096", "name"].item() == "Chest"


def test_a_long_tailed_loss_and_sampler_train_on_the_labels_from_the_data(trained, tmp_path):
    """LDAM-DRW and class-aware sampling read the class counts of the data's own label list."""
    _, release, _, _, _ = trained
    train(tmp_path, release, "loss=ldam", "sampler=class_aware")
    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    (run,) = client.search_runs([client.get_experiment_by_name("rocov2_concepts").experiment_id])
    assert run.info.status == "FINISHED" and run.info.run_name.startswith("debug-regnetx_004-ldam-class_aware-s42-")
    assert math.isfinite(run.data.metrics["test/mAP"]) and math.isfinite(run.data.metrics["train/loss"])
