"""`debug=smoke` on every data source: the synthetic set is generated small, every other source is cut small."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from mlflow import MlflowClient
from omegaconf import OmegaConf

from tests.conftest import PROJECT_ROOT, shared_data, train_command
from training.pipeline import build_datamodule

CONFIGS = PROJECT_ROOT / "configs"
#: What each data config needs besides the preset to be composed and built (no data is read).
REQUIRED = {
    "manifest": ["data.source.manifest=m.csv"],
    "pseudo_labelled": ["data.source.manifest=m.csv"],
    "synthetic": [],
}


def smoke_config(data: str, *overrides: str):
    with initialize_config_dir(config_dir=str(CONFIGS), version_base="1.3"):
        required = REQUIRED.get(data, ["data.root=/nowhere"])
        return compose("train", overrides=["debug=smoke", f"data={data}", *required, *overrides])


def test_smoke_generates_the_small_synthetic_set_and_cuts_nothing():
    cfg = smoke_config("synthetic")
    sizes = OmegaConf.to_container(cfg.data.debug_size)
    generator = OmegaConf.to_container(cfg.data.source.generator, resolve=True)
    assert {"n_train": generator["n_train"], "n_val": generator["n_val"], "n_test": generator["n_test"]} == {
        f"n_{split}": n for split, n in sizes.items()
    }
    assert generator["image_size"] == cfg.data.image_size == 64
    assert build_datamodule(cfg).subset == {}  # the generated set is used whole, as before
    # Without the preset the default set is generated, and the preset's keys reach no other source.
    with initialize_config_dir(config_dir=str(CONFIGS), version_base="1.3"):
        default = compose("train")
    assert default.data.source.generator.n_train > generator["n_train"] and default.data.debug_size is None


@pytest.mark.parametrize("data", sorted(p.stem for p in (CONFIGS / "data").glob("*.yaml") if p.stem != "synthetic"))
def test_smoke_cuts_every_other_source_to_the_preset_size(data):
    cfg = smoke_config(data)
    assert "generator" not in cfg.data.source
    assert build_datamodule(cfg).subset == OmegaConf.to_container(cfg.data.debug_size)
    assert smoke_config(data, "data.subset={train:5}").data.subset == {"train": 5}  # an explicit cut still wins


def smoke_run(tmp_path: Path, run_env: dict, *overrides: str) -> tuple[str, MlflowClient]:
    done = subprocess.run(
        train_command(tmp_path, "debug=smoke", *overrides, "trainer.enable_progress_bar=false", "evaluation.n_boot=20",
                      "evaluation.perturbation.enabled=false", "tta.enabled=false"),
        env=run_env, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout + done.stderr, MlflowClient(run_env["MLFLOW_TRACKING_URI"])


@pytest.mark.e2e
def test_smoke_runs_on_a_manifest(make_manifest, tmp_path, run_env):
    path = make_manifest(n=12)
    output, client = smoke_run(tmp_path, run_env, "data=manifest", f"data.source.manifest={path}")
    (run,) = client.search_runs([client.get_experiment_by_name("task1").experiment_id])
    assert run.info.status == "FINISHED" and "test/mAP" in run.data.metrics
    assert "train split: 4 images" in output  # smaller than the preset: kept whole


@pytest.mark.realdata
def test_smoke_runs_on_nih14_cut_to_the_preset_size(tmp_path, run_env):
    root = shared_data("nih1000")
    output, client = smoke_run(tmp_path, run_env, "task=nih14", "data=nih14", f"data.root={root}",
                               f"data.source.out_dir={tmp_path}/manifests")  # fmt: skip
    (run,) = client.search_runs([client.get_experiment_by_name("nih14").experiment_id])
    assert run.info.status == "FINISHED" and "test/mAP" in run.data.metrics
    cfg = smoke_config("nih14")
    for split in ("train", "test"):  # the subset has more than the preset in these splits
        assert f"{split} split: {cfg.data.debug_size[split]} images" in output
