"""The pneumonia protocol on the real Kermany images in ../shared/data/kermany-dev (its test folder = dev_test)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from apps.benchmarks.framework.catalog import load_protocol
from apps.benchmarks.framework.report import format_table
from apps.benchmarks.framework.runner import draw_subsets, load_model, run_benchmark
from apps.benchmarks.pneumonia import pools
from tests.benchmark_data import write_tiny_clip
from tests.conftest import shared_data
from training.data.adapters.kermany import patient_key

pytestmark = pytest.mark.realdata
PROTOCOL = load_protocol("pneumonia")


def test_every_file_name_parses_to_the_data_sets_own_patient_key():
    root = shared_data("kermany-dev")
    labels = pd.read_csv(root / "labels.csv")
    parsed = labels["image"].map(lambda rel: patient_key(Path(rel).name))
    assert (parsed == labels["patient_key"]).all()
    shapes = set(labels["image"].str.replace(r"\d+", "N", regex=True).map(lambda rel: Path(rel).name))
    assert {"personN_bacteria_N.jpeg", "personN_virus_N_N.jpeg", "IM-N-N-N.jpeg", "NORMALN-IM-N-N-N.jpeg"} <= shapes


def test_protocol_draws_on_kermany_dev():
    root = shared_data("kermany-dev")
    train_pool, test_pool = pools(str(root))
    assert test_pool["label"].value_counts().to_dict() == {1: 390, 0: 234}  # dev_test: the official test's mix
    full, n100 = draw_subsets(PROTOCOL, root, "full"), draw_subsets(PROTOCOL, root, "n100")
    # dev_train / dev_test are patient-disjoint by construction: no version excludes anything, so both versions
    # train on the same 500 images (on the official release they would not).
    assert full.params["excluded_train_images"] == n100.params["excluded_train_images"] == 0
    assert full.params["train_shared_full_n100"] == n100.params["train_shared_full_n100"] == 500
    assert full.params["train_fingerprint_n100"] == n100.params["train_fingerprint_full"] == "0a3c95c494f4c448"
    assert "500 of 500 training images shared between full and n100" in n100.description
    assert {name: subset.pool for name, subset in full.subsets.items()} == {"train": 4592, "test": 624}
    assert full.subsets["train"].table["label"].value_counts().to_dict() == {1: 379, 0: 121}
    assert n100.test.table["label"].value_counts().to_dict() == {1: 63, 0: 37}
    assert len(full.test) == 624
    # The subsets are part of the protocol: these values change only if the draw (or the data) changes.
    assert full.fingerprints == {"train": "0a3c95c494f4c448", "test": "7893715fab22515f"}
    assert n100.fingerprints == {"train": "0a3c95c494f4c448", "test": "f422f425e5db0f87"}


def test_tiny_random_clip_runs_the_protocol_on_real_images(tmp_path):
    root = shared_data("kermany-dev")
    draw = draw_subsets(PROTOCOL, root, "n100")
    encoder = load_model(PROTOCOL, write_tiny_clip(tmp_path / "tiny"), "sqlite:///unused.db")
    result = run_benchmark(PROTOCOL, draw, encoder, root, n_boot=200, cache_dir=tmp_path / "cache")
    assert len(result.scores) == 100 and result.scores["label"].sum() == 63
    values = result.table.set_index(["protocol", "metric"])["value"]
    assert np.isfinite(values.to_numpy()).all() and ((values >= 0) & (values <= 1)).all()


BEFORE_PLUGINS_N100 = """\
| metric (95% CI) | Zero-shot | Linear probe |
|---|---|---|
| ROC-AUC | 0.453 [0.346, 0.565] | 0.858 [0.776, 0.943] |
| Accuracy | 0.370 [0.370, 0.370] | 0.790 [0.720, 0.860] |
| Sensitivity | 0.000 [0.000, 0.000] | 0.937 [0.873, 0.984] |
| Specificity | 1.000 [1.000, 1.000] | 0.541 [0.378, 0.703] |
| Average precision | 0.655 [0.582, 0.747] | 0.865 [0.786, 0.967] |"""
"""``make benchmark NAME=pneumonia VERSION=n100`` with the tiny random CLIP, as printed before protocols became
plug-ins (the single-protocol CLI of commit 4318859)."""


def test_the_plug_in_reproduces_the_single_protocol_benchmark(tmp_path):
    root = shared_data("kermany-dev")
    draw = draw_subsets(PROTOCOL, root, "n100")
    encoder = load_model(PROTOCOL, write_tiny_clip(tmp_path / "tiny"), "sqlite:///unused.db")
    result = run_benchmark(PROTOCOL, draw, encoder, root, n_boot=1000, cache_dir=None)
    assert format_table(result.table, PROTOCOL.methods, PROTOCOL.metrics) == BEFORE_PLUGINS_N100
    metrics = result.metrics()
    assert metrics["probe/auroc"] == pytest.approx(0.8575718575718576, abs=1e-9)
    assert metrics["zero_shot/ap"] == pytest.approx(0.6545168195243941, abs=1e-9)
    assert metrics["probe/auroc_ci_low"] == pytest.approx(0.7764800514800515, abs=1e-9)
