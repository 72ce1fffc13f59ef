"""Adapters, splits, the cache and short trainings on real radiographs (../shared/data; skipped when absent)."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
from mlflow import MlflowClient

from tests.conftest import shared_data, train_command
from training.data.adapters.kermany import KermanySource
from training.data.adapters.nih14 import NIH14Source
from training.data.datamodule import CXRDataModule
from training.data.findings import NIH14_LABELS

pytestmark = pytest.mark.realdata

# From ../shared/data/README.md.
NIH_COUNTS = {"No Finding": 499, "Effusion": 170, "Infiltration": 162, "Atelectasis": 95, "Cardiomegaly": 83,
              "Consolidation": 42, "Pneumothorax": 40, "Nodule": 39, "Emphysema": 37, "Mass": 35, "Fibrosis": 32,
              "Edema": 31, "Pleural_Thickening": 29, "Pneumonia": 11, "Hernia": 9}  # fmt: skip


def test_nih_adapter_counts_splits_and_images(tmp_path):
    source = NIH14Source(str(shared_data("nih1000")), out_dir=str(tmp_path / "m"))
    dm = CXRDataModule(source, NIH14_LABELS, image_size=64, batch_size=16, resize="pad",
                       extra_columns=(), cache_root=str(tmp_path / "cache"))  # fmt: skip
    dm.prepare_data()
    dm.setup()
    table = dm.manifest.table
    assert len(table) == 1000
    assert {name: int(table[name].sum()) for name in NIH14_LABELS} == NIH_COUNTS
    assert table.groupby("patient_id")["split"].nunique().max() == 1  # patient-disjoint
    assert set(table["split"]) == {"train", "val", "test"}
    images = dm.datasets["train"].images
    assert images.shape[1:] == (64, 64) and images.dtype == np.uint8
    assert images.reshape(len(images), -1).std(axis=1).min() > 10  # radiographs, not blanks


def test_kermany_adapter_matches_the_release_table(tmp_path):
    root = shared_data("kermany-dev")
    table = pd.read_csv(KermanySource(str(root), out_dir=str(tmp_path)).prepare(), dtype=str, keep_default_na=False)
    reference = pd.read_csv(root / "labels.csv", dtype=str).set_index("image")
    assert len(table) == 5216
    rows = reference.loc[table["path"]]
    assert (table["patient_id"].to_numpy() == rows["patient_key"].to_numpy()).all()
    assert (table["Pneumonia"].to_numpy() == rows["pneumonia"].to_numpy()).all()
    assert (table["subtype"].to_numpy() == rows["subtype"].to_numpy()).all()
    test = table[table["split"] == "test"]
    assert len(test) == 624 and test["Pneumonia"].value_counts().to_dict() == {"1": 390, "0": 234}
    assert set(rows.loc[test["path"], "dev_split"]) == {"dev_test"}
    assert table.groupby("patient_id")["split"].nunique().max() == 1
    train, val = (table[table["split"] == s]["Pneumonia"].astype(int).mean() for s in ("train", "val"))
    assert abs(train - val) < 0.02  # stratified: the 3:1 ratio holds in both


@pytest.mark.parametrize(
    ("task", "data", "dataset", "labels"),
    [("nih14", "nih14", "nih1000", NIH14_LABELS), ("pneumonia", "kermany", "kermany-dev", ("Pneumonia",))],
)
def test_short_training_on_real_images_is_tracked(tmp_path, run_env, task, data, dataset, labels):
    root = shared_data(dataset)
    data_args = [f"data={data}", f"data.root={root}", "data.image_size=64", f"data.source.out_dir={tmp_path}/manifests",
                 f"+data.cache_root={tmp_path}/cache"]  # fmt: skip
    prepared = subprocess.run([sys.executable, "-m", "training.prepare", *data_args], env=run_env, capture_output=True,
                              text=True, timeout=300)  # fmt: skip
    assert prepared.returncode == 0 and " 0 unreadable" in prepared.stdout, prepared.stdout + prepared.stderr[-2000:]
    done = subprocess.run(
        train_command(tmp_path, f"task={task}", *data_args, "trainer.max_epochs=1", "model=resnet18",
                      "trainer.enable_progress_bar=false"),
        env=run_env, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "reading the preprocessed cache" in done.stdout + done.stderr
    client = MlflowClient(run_env["MLFLOW_TRACKING_URI"])
    (run,) = client.search_runs([client.get_experiment_by_name(task).experiment_id])
    assert run.info.status == "FINISHED" and run.data.tags["data_source"] == data
    assert 0 <= run.data.metrics["test/mAP"] <= 1 and 0 <= run.data.metrics["test/mAUROC"] <= 1
    assert f"test/ap/{labels[0]}" in run.data.metrics
