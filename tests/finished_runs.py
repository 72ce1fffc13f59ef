"""A FINISHED platform run made without training: what the read-back tests tamper with."""

from __future__ import annotations

from pathlib import Path

import torch
from hydra import compose, initialize_config_dir
from mlflow import MlflowClient
from omegaconf import OmegaConf

from training.config_files import CONFIGS
from training.models.factory import model_from_config
from training.runs import load_finished


class Payload:
    """Unpickling this writes ``marker``: what ``torch.load(weights_only=False)`` of an attacker's file does."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return Path.touch, (self.marker,)


def fabricate_finished_run(tmp: Path) -> tuple[MlflowClient, str, dict]:
    """``(client, run id, its plain config)``: a FINISHED task1 smoke run in a sqlite store under ``tmp``, with the
    ``config.yaml`` and ``checkpoints/best.ckpt`` (a freshly built network's weights) that loading needs."""
    client = MlflowClient(f"sqlite:///{tmp}/mlflow.db")
    experiment = client.create_experiment("task1", artifact_location=(tmp / "artifacts").as_uri())
    with initialize_config_dir(config_dir=str(CONFIGS), version_base=None):
        cfg = compose("train", overrides=["task=task1", "debug=smoke", f"data.source.root={tmp}/synthetic",
                                          "model.pretrained=false"])  # fmt: skip
    plain = OmegaConf.to_container(cfg, resolve=False)
    plain.pop("hydra", None)
    checkpoint = tmp / "best.ckpt"
    torch.save({"state_dict": model_from_config(cfg).state_dict()}, checkpoint)
    run_id = client.create_run(experiment).info.run_id
    client.log_artifact(run_id, str(checkpoint), "checkpoints")
    client.log_text(run_id, OmegaConf.to_yaml(plain), "config.yaml")
    client.set_terminated(run_id, "FINISHED")
    load_finished(run_id, client)  # the untampered run loads: a refusal of a tampered copy is the tampering's doing
    return client, run_id, plain
