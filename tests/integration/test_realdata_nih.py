"""The data layer and a short training on real radiographs (NIH ChestX-ray14 subset in ../shared/data)."""

from __future__ import annotations

import subprocess

import numpy as np
import pandas as pd
import pytest
from mlflow import MlflowClient

from tests.conftest import shared_data, train_command
from training.data.datamodule import CXRDataModule
from training.data.findings import NIH14_LABELS
from training.data.sources import ManifestSource
from training.data.splits import patient_split

pytestmark = pytest.mark.realdata


@pytest.fixture
def nih_manifest(tmp_path):
    """A manifest for nih1000 written to tmp (the shared folder is read-only), re-split by patient."""
    root = shared_data("nih1000")
    labels = pd.read_csv(root / "labels.csv", dtype={"patient_id": str})
    manifest = pd.DataFrame({
        "image_id": labels["image"].str.extract(r"([^/]+)\.png$")[0],
        "path": labels["image"],
        "split": patient_split(labels["patient_id"], seed=0),
        "patient_id": labels["patient_id"],
        "source": "nih",
        "view": labels["view"],
    })  # fmt: skip
    manifest = pd.concat([manifest, labels[list(NIH14_LABELS)]], axis=1)
    path = tmp_path / "nih1000.csv"
    manifest.to_csv(path, index=False)
    return path, root, labels


def test_real_images_load_with_their_labels(nih_manifest):
    path, root, labels = nih_manifest
    dm = CXRDataModule(ManifestSource(str(path), str(root)), NIH14_LABELS, image_size=64, batch_size=16)
    dm.setup()
    total = sum(len(dm.datasets[s]) for s in ("train", "val", "test"))
    assert total == 1000
    counts = sum((dm.datasets[s].targets.numpy() == 1).sum(axis=0) for s in ("train", "val", "test"))
    assert dict(zip(NIH14_LABELS, counts.tolist(), strict=True))["Effusion"] == 170  # README of the data folder
    assert counts[NIH14_LABELS.index("No Finding")] == 499
    images = dm.datasets["train"].images
    assert images.shape[1:] == (64, 64) and images.dtype == np.uint8
    # Radiographs, not blanks: every image spans a real intensity range.
    spread = images.reshape(len(images), -1).std(axis=1)
    assert spread.min() > 10
    batch = next(iter(dm.train_dataloader()))
    assert batch["image"].shape == (16, 1, 64, 64)


def test_short_training_on_real_images_is_tracked(nih_manifest, tmp_path, run_env):
    path, root, _ = nih_manifest
    done = subprocess.run(
        train_command(tmp_path, "task=nih14", "data=manifest", f"data.source.manifest={path}",
                      f"data.source.root={root}", "data.source.name=nih1000", "data.image_size=64",
                      "trainer.max_epochs=1", "model=resnet18", "trainer.enable_progress_bar=false"),
        env=run_env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    client = MlflowClient(run_env["MLFLOW_TRACKING_URI"])
    (run,) = client.search_runs([client.get_experiment_by_name("nih14").experiment_id])
    assert run.info.status == "FINISHED" and run.data.tags["data_source"] == "nih1000"
    assert {f"test/ap/{name}" for name in NIH14_LABELS if name != "Hernia"} <= set(run.data.metrics)
