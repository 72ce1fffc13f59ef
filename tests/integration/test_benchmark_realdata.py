"""The pneumonia protocol on the real Kermany images in ../shared/data/kermany-dev (its test folder = dev_test)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from evaluation.benchmarks.encoders import Target
from evaluation.benchmarks.models import load_encoder
from evaluation.benchmarks.pneumonia import SEED, build_subsets, pools
from evaluation.benchmarks.runner import run_benchmark
from tests.benchmark_data import write_tiny_clip
from tests.conftest import shared_data
from training.data.adapters.kermany import patient_key

pytestmark = pytest.mark.realdata


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
    full, n100 = build_subsets(str(root), "full"), build_subsets(str(root), "n100")
    assert full.excluded_images == 0  # kermany-dev's dev_train / dev_test are patient-disjoint by construction
    assert full.pools == {"train": 4592, "test": 624}
    assert full.train["label"].value_counts().to_dict() == {1: 379, 0: 121}
    assert n100.test["label"].value_counts().to_dict() == {1: 63, 0: 37}
    assert len(full.test) == 624
    # The subsets are part of the protocol: these values change only if the draw (or the data) changes.
    assert full.fingerprints == {"train": "0a3c95c494f4c448", "test": "7893715fab22515f"}
    assert n100.fingerprints == {"train": "0a3c95c494f4c448", "test": "f422f425e5db0f87"}


def test_tiny_random_clip_runs_the_protocol_on_real_images(tmp_path):
    root = shared_data("kermany-dev")
    subsets = build_subsets(str(root), "n100")
    target = Target("Pneumonia", "a chest x-ray showing pneumonia", "a normal chest x-ray")
    encoder = load_encoder(write_tiny_clip(tmp_path / "tiny"), target, "sqlite:///unused.db", seed=SEED)
    result = run_benchmark(encoder, subsets, root, n_boot=200, seed=SEED, cache_dir=tmp_path / "cache")
    assert len(result.scores) == 100 and result.scores["label"].sum() == 63
    values = result.table.set_index(["protocol", "metric"])["value"]
    assert np.isfinite(values.to_numpy()).all() and ((values >= 0) & (values <= 1)).all()
