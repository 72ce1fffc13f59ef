"""Every recipe preset in configs/experiment (docs/recipes.md): its resolved config as `make train ... --cfg job`
prints it carries what the preset selects, and it trains, tests and reloads at smoke size on CPU.

Presets are discovered from the folder, so a new one is tested without touching this file.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
import yaml
from mlflow import MlflowClient

from tests.conftest import PROJECT_ROOT, train_command
from training.runs import load_finished

PRESETS = sorted(path.stem for path in (PROJECT_ROOT / "configs" / "experiment").glob("*.yaml"))


def preset_file(name: str) -> dict:
    return yaml.safe_load((PROJECT_ROOT / "configs" / "experiment" / f"{name}.yaml").read_text())


def selections(name: str) -> dict[str, str]:
    """``{group: option}`` for each ``override /group: option`` line of a preset."""
    return {key.removeprefix("override /"): option for entry in preset_file(name).get("defaults", [])
            for key, option in entry.items()}  # fmt: skip


def location(group: str, option: str) -> list[str]:
    """Where an option's node lands in the composed config: its ``# @package`` line, or the group's name; a
    ``_global_`` group (ema, two_phase) adds a callback under ``callbacks.<group>``."""
    first = (PROJECT_ROOT / "configs" / group / f"{option}.yaml").read_text().splitlines()[0]
    package = first.removeprefix("# @package ").strip() if first.startswith("# @package ") else group
    return ["callbacks", group] if package == "_global_" else package.split(".")


def image_files(tmp: Path, rows: pd.DataFrame) -> list[Path]:
    """The files of ``rows``' image ids in the synthetic set generated under ``tmp`` (one folder per parameters)."""
    paths = {}
    for manifest in (tmp / "synthetic").rglob("manifest.csv"):
        table = pd.read_csv(manifest, dtype={"image_id": str}, usecols=["image_id", "path"])
        paths.update({i: manifest.parent / p for i, p in zip(table["image_id"], table["path"], strict=True)})
    return [paths[i] for i in rows["image_id"].astype(str)]


def task_of(name: str) -> str:
    return selections(name).get("task", "task1")


def resolved(name: str) -> dict:
    """The config `make train TASK=<task> ARGS="experiment=<name> --cfg job"` prints, parsed."""
    result = subprocess.run(
        ["make", "-s", "train", f"TASK={task_of(name)}", f"ARGS=experiment={name} --cfg job"],
        capture_output=True, text=True, timeout=300, cwd=PROJECT_ROOT,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    return yaml.safe_load(result.stdout[result.stdout.index("seed:") :])


def test_presets_exist():
    """One preset per Table 2 row the platform expresses, plus the from-scratch small-real-set recipe."""
    task2 = {f"cxrlt2026_task2_{row}" for row in "abg"}  # Table 2's Task 2 rows
    task1 = {f"cxrlt2026_task1_{row}" for row in "abcdef"}  # Table 2's Task 1 rows
    assert task1 | task2 | {"small_real_scratch"} <= set(PRESETS)


@pytest.mark.parametrize("name", PRESETS)
def test_cfg_job_prints_the_preset(name):
    """Each group the preset overrides resolves to the option it names, and the preset's own keys are there."""
    cfg = resolved(name)
    for group, option in selections(name).items():
        node = cfg
        for part in location(group, option):
            node = node[part]
        assert node["name"] == option, (group, node)
    own = preset_file(name)
    assert cfg["tags"]["preset"] == name
    if "data" in own and "image_size" in own["data"]:
        assert cfg["data"]["image_size"] == own["data"]["image_size"]


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("presets")
    return tmp, {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{tmp}/mlflow.db", "PYTHONUNBUFFERED": "1"}


#: A tenth of `debug=smoke`'s 320/160/160 images: each preset's network still trains, validates, tests (with its TTA
#: views, the perturbed set and a held-out draw) and reloads, while the large networks' CPU passes, which set this
#: suite's length, cover a tenth of the images.
FEW_IMAGES = ("data.debug_size.train=32", "data.debug_size.val=16", "data.debug_size.test=16",
              "evaluation.heldout.size=8")  # fmt: skip


def smaller_tower_input(name: str) -> tuple[str, ...]:
    """A preset that sizes its image tower's input (the CLIP ones: ``adapter.image_size``) gets 32 px at smoke size:
    the same images, resized down inside the network, so ViT-L-14 sees 2x2 patches rather than 4x4, a third of the
    tokens through the same layers, on each of its dozen passes (train, validation, test, TTA, perturbed, held-out)."""
    return ("adapter.image_size=32",) if "image_size" in preset_file(name).get("adapter", {}) else ()


@pytest.mark.presets
@pytest.mark.parametrize("name", PRESETS)
def test_preset_smoke_run(name, store, monkeypatch):
    """`experiment=<name> debug=smoke` trains and tests on CPU; the run reloads to the network that wrote its test
    predictions (head, router, temperature and all), so evaluation, serving and submission see the trained model."""
    tmp, env = store
    run_name = f"smoke-{name}"
    done = subprocess.run(
        train_command(tmp, f"task={task_of(name)}", f"experiment={name}", "debug=smoke", f"run_name={run_name}",
                      f"data.source.root={tmp}/synthetic", *FEW_IMAGES, *smaller_tower_input(name), "evaluation.n_boot=100",
                      "evaluation.plots=false", "trainer.enable_progress_bar=false"),
        env=env, capture_output=True, text=True, timeout=1200, cwd=PROJECT_ROOT,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    monkeypatch.setenv("MLFLOW_TRACKING_URI", env["MLFLOW_TRACKING_URI"])
    client = MlflowClient(env["MLFLOW_TRACKING_URI"])
    (run,) = client.search_runs(
        [e.experiment_id for e in client.search_experiments()], f"attributes.run_name LIKE 'debug-{run_name}-%'"
    )
    assert run.info.status == "FINISHED"
    assert run.data.tags["cxrlt.preset"] == name
    assert np.isfinite(run.data.metrics["test/mAP"])
    model = load_finished(run.info.run_id, client)
    predictions = pd.read_csv(client.download_artifacts(run.info.run_id, "predictions/test.csv", str(tmp)))
    first = predictions.head(4)
    images = torch.stack([model.transform(image=model.decode(path))["image"] for path in image_files(tmp, first)])
    with torch.no_grad():
        probs = torch.sigmoid(model.scoring_network(images)).numpy()
    np.testing.assert_allclose(probs[:, : len(model.labels)], first[model.labels].to_numpy(), atol=1e-4)
