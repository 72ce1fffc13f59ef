"""`make benchmark` end to end on a generated Kermany-shaped folder: a tiny random open_clip model, and a
smoke-trained platform run reached through the model registry (a classifier without a pneumonia output)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from mlflow import MlflowClient

from apps.benchmarks.framework.catalog import available, load_protocol
from apps.benchmarks.framework.models import load_encoder
from apps.benchmarks.framework.platform_models import ModelNotFound, PlatformRunEncoder
from apps.benchmarks.framework.runner import draw_subsets
from tests.benchmark_data import write_kermany, write_tiny_clip
from tests.conftest import PROJECT_ROOT

pytestmark = pytest.mark.e2e  # trains through the real CLI: make test-e2e (docs/development.md)

METRIC_KEYS = ("auroc", "accuracy", "sensitivity", "specificity", "ap")
PROTOCOL = load_protocol("pneumonia")


def benchmark(tmp_path: Path, env: dict, model: str, data: Path, version: str) -> subprocess.CompletedProcess:
    command = [
        sys.executable, "-m", "apps.benchmarks.cli", "--name", "pneumonia", "--model", model,
        "--data-root", str(data), "--version", version, "--cache-dir", str(tmp_path / "cache"),
        "--artifact-root", str(tmp_path / "artifacts"),
    ]  # fmt: skip
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300, cwd=PROJECT_ROOT)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done


def runs_by_version(client: MlflowClient) -> dict:
    experiment = client.get_experiment_by_name("benchmark-pneumonia")
    return {run.data.params["version"]: run for run in client.search_runs([experiment.experiment_id])}


def test_clip_model_both_versions_logged_with_table_scores_and_fingerprints(tmp_path, run_env):
    data = tmp_path / "kermany"
    write_kermany(data, train=(140, 380), test=(45, 75))
    spec = write_tiny_clip(tmp_path / "tiny-clip")

    full = benchmark(tmp_path, run_env, spec, data, "full")
    assert "| ROC-AUC |" in full.stdout and "| Specificity |" in full.stdout
    assert "zero-shot score: margin, pneumonia when above 0" in full.stdout
    assert "embeddings from the cache: none" in full.stdout
    assert "removed 4 image(s) of 4 test patient(s)" in full.stdout
    # n100 through the Makefile target; it shares the training draw, whose embeddings now come from the cache.
    done = subprocess.run(
        ["make", "-s", "benchmark", "NAME=pneumonia", f"MODEL={spec}", f"DATA_ROOT={data}", "VERSION=n100",
         f"ARGS=--cache-dir {tmp_path / 'cache'} --artifact-root {tmp_path / 'artifacts'}"],
        env=run_env, capture_output=True, text=True, timeout=300, cwd=PROJECT_ROOT,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "embeddings from the cache: train" in done.stdout

    client = MlflowClient(run_env["MLFLOW_TRACKING_URI"])
    runs = runs_by_version(client)
    assert set(runs) == {"full", "n100"}
    for version, n_test in (("full", 120), ("n100", 100)):
        run = runs[version]
        subsets = draw_subsets(PROTOCOL, data, version)
        params, tags, metrics = run.data.params, run.data.tags, run.data.metrics
        assert run.info.status == "FINISHED"
        assert params["model"] == spec and params["seed"] == "20261006" and params["n_test"] == str(n_test)
        assert params["test_fingerprint"] == tags["benchmark.test_fingerprint"] == subsets.fingerprints["test"]
        assert params["train_fingerprint"] == tags["benchmark.train_fingerprint"] == subsets.fingerprints["train"]
        assert params["excluded_train_images"] == "4"
        for protocol in ("zero_shot", "probe"):
            for key in METRIC_KEYS:
                low, value, high = (metrics[f"{protocol}/{key}{s}"] for s in ("_ci_low", "", "_ci_high"))
                assert low <= value <= high
        artifacts = Path(client.download_artifacts(run.info.run_id, "", str(tmp_path / f"dl-{version}")))
        table = pd.read_csv(artifacts / "table.csv")
        assert len(table) == 20 and set(table["protocol"]) == set(PROTOCOL.methods)
        assert not any(key.startswith("zero_shot_run_threshold/") for key in metrics)  # a CLIP has no run threshold
        assert metrics["always_pneumonia/accuracy"] == pytest.approx(75 / 120 if version == "full" else 63 / 100)
        probe_auc = table.set_index(["protocol", "metric"]).loc[("probe", "auroc"), "value"]
        assert probe_auc == pytest.approx(metrics["probe/auroc"])
        scores = pd.read_csv(artifacts / "scores.csv")
        assert len(scores) == n_test and set(scores["item_id"]) == set(subsets.test.ids)
        assert scores["item_id"].str.fullmatch(r"pneumonia-test-[\w-]+").all()
        assert (scores["label"] == scores["path"].str.contains("/PNEUMONIA/").astype(int)).all()
        assert ((scores["zero_shot_score"] > 0) == scores["zero_shot_pneumonia"].astype(bool)).all()
        assert "| Linear probe |" in (artifacts / "table.md").read_text()
        assert len(pd.read_csv(artifacts / "subsets" / "train.csv")) == 500
    assert runs["full"].data.metrics["probe/auroc"] > 0.9  # brighter = pneumonia in the generated images
    assert len(list((tmp_path / "cache").glob("*.npz"))) == 3  # train once, test twice (two test subsets)


def test_registered_platform_run_without_a_pneumonia_output_reports_probe_only(tmp_path, smoke_champion):
    run_env, client, run = smoke_champion  # a store the card test writes to as well: only this test's run is read

    target = PROTOCOL.target
    encoder = load_encoder("models:/cxrlt-task1@champion", (target,), run_env["MLFLOW_TRACKING_URI"])
    assert isinstance(encoder, PlatformRunEncoder) and encoder.run_id == run.info.run_id
    assert encoder.image_size == 64 and not encoder.any_zero_shot
    with pytest.raises(ModelNotFound, match="no run 'deadbeef'"):
        load_encoder("deadbeef", (target,), run_env["MLFLOW_TRACKING_URI"])

    data = tmp_path / "kermany"
    write_kermany(data, train=(140, 380), test=(45, 75))
    done = benchmark(tmp_path, run_env, "models:/cxrlt-task1/1", data, "n100")
    assert "zero-shot: not available" in done.stdout and "has no 'Pneumonia' output" in done.stdout
    assert "| ROC-AUC | n/a |" in done.stdout
    experiment = client.get_experiment_by_name("benchmark-pneumonia")
    (bench,) = client.search_runs([experiment.experiment_id], "params.model = 'models:/cxrlt-task1/1'")
    metrics = bench.data.metrics
    assert not any(key.startswith("zero_shot/") for key in metrics)
    assert {f"probe/{key}" for key in METRIC_KEYS} <= set(metrics)
    assert bench.data.params["zero_shot"] == "n/a" and bench.data.tags["zero_shot_available"] == "false"
    assert bench.data.tags["model_kind"] == "models"


def test_make_benchmark_without_a_name_lists_the_protocols_and_a_bad_name_is_one_line(run_env):
    listed = subprocess.run(["make", "-s", "benchmark"], env=run_env, capture_output=True, text=True, timeout=120,
                            cwd=PROJECT_ROOT)  # fmt: skip
    assert listed.returncode == 0, listed.stderr[-3000:]
    assert re.search(r"\n  pneumonia +Pediatric pneumonia", listed.stdout) and "[versions: full, n100]" in listed.stdout
    bad = subprocess.run(["make", "-s", "benchmark", "NAME=pneumonai", "MODEL=clip:x", "DATA_ROOT=/nonexistent"],
                         env=run_env, capture_output=True, text=True, timeout=120, cwd=PROJECT_ROOT)  # fmt: skip
    assert bad.returncode != 0 and "Traceback" not in bad.stderr
    known = ", ".join(available())
    assert f"make benchmark: unknown benchmark 'pneumonai'; known: {known} (configs in" in bad.stderr
