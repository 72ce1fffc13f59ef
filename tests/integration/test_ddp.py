"""`trainer=ddp` with two CPU processes (gloo): one run, epochs logged once, metrics equal to one process's.

The reference values are recomputed in this (single) process from the run's stored ``config.yaml`` and
``best.ckpt``: validation with the module's own metric code over the whole split, test through
``evaluation.evaluate``. Padding a split for DDP would count some images twice and move ``val/mAP`` away from
the reference; a second run or a second logger would show up in the store.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import lightning.pytorch as L
import pytest
import torch
from lightning.fabric.utilities.rank_zero import rank_zero_only as fabric_rank_zero_only
from lightning.pytorch.utilities.rank_zero import rank_zero_only as pytorch_rank_zero_only
from mlflow import MlflowClient
from omegaconf import OmegaConf

from evaluation.evaluate import evaluate
from tests.conftest import PROJECT_ROOT, free_port, train_command
from training.data.datamodule import CXRDataModule
from training.data.sources import ManifestSource
from training.distributed import SHARED_ENV, Process, process_of, share_from_rank_zero
from training.models.factory import model_from_config
from training.pipeline import build_datamodule
from training.samplers.distributed import EvalShardSampler, TrainShardSampler
from training.samplers.random import RandomSampling

EPOCHS = 2
VAL_IMAGES = 81  # odd: two ranks cannot split it evenly, so padding would duplicate an image
OVERRIDES = (
    "debug=smoke", "trainer=ddp", "trainer.accelerator=cpu", "trainer.devices=2", f"trainer.max_epochs={EPOCHS}",
    f"+data.subset.val={VAL_IMAGES}", "trainer.enable_progress_bar=false", "tta.enabled=false",
    "evaluation.perturbation.enabled=false", "evaluation.n_boot=50", "evaluation.plots=false",
)  # fmt: skip


def _single_process_env(tmp: Path) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if key not in ("LOCAL_RANK", "NODE_RANK", "WORLD_SIZE")}
    return {**env, "MLFLOW_TRACKING_URI": f"sqlite:///{tmp}/mlflow.db", "PYTHONUNBUFFERED": "1"}


@pytest.fixture(scope="module")
def ddp_run(tmp_path_factory, smoke_data):
    tmp = tmp_path_factory.mktemp("ddp")
    env = _single_process_env(tmp)
    done = subprocess.run(train_command(tmp, *OVERRIDES, f"data.source.root={smoke_data[0]}"), env=env,
                          capture_output=True, text=True, timeout=600)  # fmt: skip
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-4000:]
    client = MlflowClient(env["MLFLOW_TRACKING_URI"])
    experiment = client.get_experiment_by_name("task1")
    return tmp, client, client.search_runs([experiment.experiment_id]), output


@pytest.mark.e2e
def test_two_processes_write_one_run_with_each_epoch_once(ddp_run):
    tmp, client, runs, output = ddp_run
    assert "GLOBAL_RANK: 1, MEMBER: 2/2" in output and "distributed_backend=gloo" in output  # really two processes
    assert len(runs) == 1
    (run,) = runs
    assert run.info.status == "FINISHED" and run.data.params["trainer.strategy"] == "ddp"
    for key in ("val/mAP", "val/mAUROC", "train/loss", "train/lr"):
        steps = [metric.step for metric in client.get_metric_history(run.info.run_id, key)]
        assert sorted(steps) == list(range(EPOCHS)), (key, steps)  # one value per epoch: rank 0 alone logs
    assert [a.path for a in client.list_artifacts(run.info.run_id, "checkpoints")] == ["checkpoints/best.ckpt"]
    # Both ranks used rank 0's run folder, removed once the run finished: no per-rank or stray folders remain.
    assert list((tmp / "checkpoints").iterdir()) == []


@pytest.fixture(scope="module")
def best_model(ddp_run, tmp_path_factory):
    """The run's best checkpoint and data, rebuilt in this single process from its stored config."""
    _, client, (run,), _ = ddp_run
    folder = tmp_path_factory.mktemp("download")
    cfg = OmegaConf.load(client.download_artifacts(run.info.run_id, "config.yaml", str(folder)))
    state = torch.load(client.download_artifacts(run.info.run_id, "checkpoints/best.ckpt", str(folder)),
                       map_location="cpu", weights_only=True)  # fmt: skip
    datamodule = build_datamodule(cfg)
    datamodule.prepare_data()
    datamodule.setup("test")
    model = model_from_config(cfg)
    model.load_state_dict(state["state_dict"])
    model.eval()
    return run, cfg, datamodule, model, state


@pytest.mark.e2e
def test_validation_metric_covers_the_whole_split_once(ddp_run, best_model):
    _, client, _, _ = ddp_run
    run, _, datamodule, model, state = best_model
    assert len(datamodule.datasets["val"]) == VAL_IMAGES
    with torch.no_grad():
        for batch in datamodule.eval_dataloader("val"):
            model.validation_step(batch, 0)
    values = model.val_metrics.compute()
    positives, _ = values["counts"]
    assert int(values["counts"][0].sum() + values["counts"][1].sum()) == VAL_IMAGES * len(model.labels)
    expected = torch.where(positives > 0, values["ap"], torch.nan).nanmean().item()
    logged = {m.step: m.value for m in client.get_metric_history(run.info.run_id, "val/mAP")}
    assert logged[state["epoch"]] == pytest.approx(expected, abs=1e-5)
    assert run.data.metrics["val/mAP_best"] == pytest.approx(logged[state["epoch"]], abs=1e-6)


@pytest.mark.e2e
def test_test_map_equals_a_single_process_evaluation_of_the_best_checkpoint(best_model):
    run, cfg, datamodule, model, _ = best_model
    reference = evaluate(model, datamodule, cfg).metrics
    assert run.data.metrics["test/mAP"] == pytest.approx(reference["test/mAP"], abs=1e-6)
    assert run.data.metrics["test/mAUROC"] == pytest.approx(reference["test/mAUROC"], abs=1e-6)


@pytest.mark.slow
def test_torchrun_starts_the_ranks_and_still_writes_one_run(tmp_path, smoke_data):
    """All ranks start together under torchrun: rank 0's run reaches the others by broadcast, not inheritance."""
    env = _single_process_env(tmp_path)
    command = train_command(tmp_path, *OVERRIDES, f"data.source.root={smoke_data[0]}")
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", "-m"]
    done = subprocess.run(
        torchrun + command[2:], env=env, capture_output=True, text=True, timeout=600, cwd=PROJECT_ROOT
    )
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    client = MlflowClient(env["MLFLOW_TRACKING_URI"])
    (run,) = client.search_runs([client.get_experiment_by_name("task1").experiment_id])
    assert run.info.status == "FINISHED"
    assert sorted(m.step for m in client.get_metric_history(run.info.run_id, "val/mAP")) == list(range(EPOCHS))


# Runs as one of two torchrun-style ranks (all processes started at once): rank 0 makes the facts or fails.
BROADCAST = """
import json, sys
import lightning.pytorch as L
from training.distributed import process_of, share_from_rank_zero

trainer = L.Trainer(strategy="ddp", accelerator="cpu", devices=2, logger=False, enable_progress_bar=False)
process = process_of(trainer)

def make():
    if sys.argv[1] == "fail":
        raise FileNotFoundError("manifest missing")
    return {"run_id": "abc", "made_by": process.rank}

try:
    print(json.dumps({"facts": share_from_rank_zero(trainer, process, make)}))
except Exception as error:
    print(json.dumps({"error": f"{type(error).__name__}: {error}"}))
import torch.distributed as dist
print(json.dumps({"group_left_open": dist.is_initialized()}))  # open for fit only when the facts arrived
if dist.is_initialized():
    dist.destroy_process_group()  # what the end of fit does
"""


@pytest.mark.e2e
@pytest.mark.parametrize("mode", ["ok", "fail"])
def test_ranks_started_together_get_rank_zero_facts_or_its_error(mode):
    """Under torchrun/SLURM the facts travel by broadcast; a rank 0 failure reaches the others instead of a hang."""
    port = str(free_port())
    ranks = []
    for rank in range(2):
        env = {**os.environ, "TORCHELASTIC_RUN_ID": "test", "RANK": str(rank), "LOCAL_RANK": str(rank),
               "GROUP_RANK": "0", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
               "MASTER_PORT": port, "PYTHONPATH": str(PROJECT_ROOT)}  # fmt: skip
        env.pop(SHARED_ENV, None)
        ranks.append(subprocess.Popen([sys.executable, "-c", BROADCAST, mode], env=env, cwd=PROJECT_ROOT,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))  # fmt: skip
    results = []
    for process in ranks:
        stdout, stderr = process.communicate(timeout=180)
        assert process.returncode == 0, stderr[-3000:]
        *_, result, group = stdout.strip().splitlines()
        results.append(json.loads(result))
        assert json.loads(group) == {"group_left_open": mode == "ok"}
    if mode == "ok":
        assert results == [{"facts": {"run_id": "abc", "made_by": 0}}] * 2
    else:
        assert results[0] == {"error": "FileNotFoundError: manifest missing"}
        assert results[1] == {
            "error": "RuntimeError: rank 0 failed before training: FileNotFoundError: manifest missing"
        }


# Rank bookkeeping without starting processes: the environment variables each launcher sets.


def _ddp_trainer(monkeypatch, env: dict[str, str], **kwargs) -> L.Trainer:
    for key in ("LOCAL_RANK", "NODE_RANK", "GROUP_RANK", "WORLD_SIZE", "RANK", SHARED_ENV):
        monkeypatch.setenv(key, "")  # recorded, so the test's own writes are undone too
        monkeypatch.delenv(key)
    # Setting ranks updates Lightning's process-wide rank-zero switch; put it back for the tests that follow.
    for switch in (pytorch_rank_zero_only, fabric_rank_zero_only):
        monkeypatch.setattr(switch, "rank", getattr(switch, "rank", 0))
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    return L.Trainer(strategy="ddp", accelerator="cpu", logger=False, enable_progress_bar=False, **kwargs)


@pytest.mark.parametrize(
    ("env", "kwargs", "expected"),
    [
        ({}, {"devices": 2}, Process(0, 2)),  # the process make train starts
        ({"LOCAL_RANK": "1", "NODE_RANK": "0", "WORLD_SIZE": "2"}, {"devices": 2}, Process(1, 2)),  # its child
        ({"LOCAL_RANK": "1", "NODE_RANK": "1"}, {"devices": 2, "num_nodes": 2}, Process(3, 4)),
        ({"SLURM_NTASKS": "4", "SLURM_PROCID": "2", "SLURM_LOCALID": "0", "SLURM_NODEID": "1", "SLURM_JOB_ID": "7",
          "SLURM_JOB_NAME": "train", "SLURM_NODELIST": "node[1-2]", "SLURM_NTASKS_PER_NODE": "2"}, {"devices": 2, "num_nodes": 2}, Process(2, 4)),
        ({}, {"devices": 1}, Process(0, 1)),
    ],
)  # fmt: skip
def test_rank_is_known_before_fit(monkeypatch, env, kwargs, expected):
    assert process_of(_ddp_trainer(monkeypatch, env, **kwargs)) == expected


def test_rank_zero_hands_its_run_to_the_ranks_it_spawns(monkeypatch):
    trainer = _ddp_trainer(monkeypatch, {}, devices=2)
    calls = []
    facts = share_from_rank_zero(trainer, Process(0, 2), lambda: calls.append(1) or {"run_id": "abc"})
    assert facts == {"run_id": "abc"} and calls == [1]
    assert json.loads(os.environ[SHARED_ENV]) == {"run_id": "abc"}  # what the spawned ranks inherit
    child = _ddp_trainer(monkeypatch, {"LOCAL_RANK": "1", "WORLD_SIZE": "2", SHARED_ENV: json.dumps(facts)}, devices=2)
    assert share_from_rank_zero(child, process_of(child), lambda: pytest.fail("only rank 0 opens the run")) == facts


def test_a_rank_without_rank_zero_run_fails_clearly(monkeypatch):
    trainer = _ddp_trainer(monkeypatch, {"LOCAL_RANK": "0", "NODE_RANK": "1"}, devices=2, num_nodes=2)
    with pytest.raises(RuntimeError, match="torchrun or SLURM"):
        share_from_rank_zero(trainer, process_of(trainer), lambda: pytest.fail("only rank 0 opens the run"))


def test_datamodule_shards_trainer_loaders_but_not_the_final_evaluation(make_manifest, task1_labels):
    path = make_manifest(n=33)  # 11 images per split
    shares = {}
    for rank in range(2):
        datamodule = CXRDataModule(ManifestSource(str(path)), task1_labels, image_size=24, batch_size=4,
                                   sampler=RandomSampling(), seed=5)  # fmt: skip
        datamodule.setup("fit")
        cpu = SimpleNamespace(root_device=torch.device("cpu"))  # the loaders ask where the batches go (pinning)
        datamodule.trainer = SimpleNamespace(world_size=2, global_rank=rank, strategy=cpu)
        train, val = datamodule.train_dataloader(), datamodule.val_dataloader()
        assert isinstance(train.sampler, TrainShardSampler) and isinstance(val.sampler, EvalShardSampler)
        train.sampler.set_epoch(0)
        shares[rank] = (list(train.sampler), [int(i) for b in val for i in b["index"]])
        whole = [int(i) for b in datamodule.eval_dataloader("val") for i in b["index"]]
        assert whole == list(range(11))  # rank 0's final evaluation: every image, in manifest order
    assert len(shares[0][0]) == len(shares[1][0]) == 11 // 2 and not set(shares[0][0]) & set(shares[1][0])
    assert sorted(shares[0][1] + shares[1][1]) == whole
