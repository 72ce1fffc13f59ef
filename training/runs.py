"""Finished runs and registered models, turned back into a model: the one owner of that job.

``make evaluate``, ``make register`` and the pyfunc behind ``make serve``, ``make submit``, cRT
(``stage=crt``) and the benchmarks all need the same things from a finished training: the network with its best
weights in eval mode, its label names and unseen classes, the image size and resize mode it was trained with,
the per-class thresholds chosen on its validation predictions, and its resolved config. Rebuilt by each on its
own, those would drift apart, so this module is the one place that does it. A model is named as

- ``<run id>`` (also ``run:<id>`` or ``runs:/<id>[/...]``): a finished run of this platform;
- ``models:/<name>@<alias>`` or ``models:/<name>/<version>``: a registered version, resolved to its source run;
- ``<run id>:rank<n>``: the ``n``-th best checkpoint the run kept (``checkpoint.save_top_k``,
  :mod:`training.top_checkpoints`); ``rank1`` is the run's own ``best.ckpt``.

Everything read back from a run is untrusted: the checkpoint is loaded with ``weights_only=True`` (data, never
code), and the stored ``config.yaml`` (or a registered model's ``spec.json``) may only name what the project's
own ``configs/`` name (:mod:`training.allowed_targets`) before anything is built from it (docs/architecture.md, "Finished
runs").
"""

from __future__ import annotations

import hashlib
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from mlflow import MlflowClient
from mlflow.exceptions import MlflowException
from omegaconf import DictConfig, OmegaConf
from torch import nn

from evaluation.thresholds import select_thresholds
from training.allowed_targets import check_targets
from training.checkpoint_io import load_weights_only
from training.data.images import read_grayscale
from training.data.transforms import GRAY_MEAN, GRAY_STD, build_transform
from training.models.factory import build_model
from training.models.module import MultiLabelClassifier
from training.run_lookup import (  # re-exported: resolved without torch, so a command refuses a bad reference fast
    MODEL_URI,  # noqa: F401
    ModelNotFound,
    RunNotFinished,  # noqa: F401
    finished_run,
    parse_reference,  # noqa: F401
    resolve_run,  # noqa: F401
    split_checkpoint,
)
from training.top_checkpoints import checkpoint_artifact, predictions_artifact
from training.tracking.artifacts import download
from training.tracking.redaction import redact
from training.tracking.uri import tracking_client
from training.zeroshot.text_side import FROM_CHECKPOINT

CONFIG = "config.yaml"
VAL_PREDICTIONS = "predictions/val.csv"


class SeenAndUnseen(nn.Module):
    """A zero-shot model as one network: ``(B, C + U)`` logits, the seen classes then the unseen ones."""

    def __init__(self, model: MultiLabelClassifier):
        super().__init__()
        self.model = model

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return torch.cat([self.model(images), self.model.unseen_logits(images)], dim=1)


@dataclass
class FinishedModel:
    """A trained network and what every consumer needs to use it as it was trained.

    Attributes:
        network: the module with the run's best weights, in eval mode (a ``MultiLabelClassifier`` or an adapter).
        labels: the seen output labels, in column order.
        unseen: the zero-shot classes scored by the adapter's transfer (empty for an ordinary run).
        image_size: square side the run's images were decoded to (``data.image_size``).
        resize: how the run made its images square (``data.resize``: pad, crop or stretch); every consumer must
            do the same, or a model trained on padded radiographs would be shown stretched ones.
        thresholds: per-class F1-maximising thresholds chosen on the run's validation predictions (seen labels),
            or None when the run stored none.
        config: the run's resolved config (None when rebuilt from a registered model's spec alone).
        run_id: the MLflow run the weights come from.
        checkpoint_sha256: hash of the weights file, the model's identity for caches.
        version: the registered version the model was named by, if any.
        adapter_cfg: the zero-shot adapter's config (``configs/adapter``), None for a plain classifier.
    """

    network: MultiLabelClassifier
    labels: list[str]
    unseen: list[str] = field(default_factory=list)
    image_size: int = 224
    resize: str = "stretch"
    thresholds: list[float] | None = None
    config: DictConfig | None = None
    run_id: str | None = None
    checkpoint_sha256: str | None = None
    version: str | None = None
    adapter_cfg: dict | None = None

    @property
    def output_labels(self) -> list[str]:
        """Columns of :attr:`scoring_network`'s output: the seen labels, then the unseen ones."""
        return self.labels + self.unseen

    @property
    def scoring_network(self) -> nn.Module:
        """One network scoring every output label (seen and unseen), in eval mode."""
        return SeenAndUnseen(self.network).eval() if self.unseen else self.network

    @property
    def task(self) -> str:
        return str(self.config.task.name) if self.config is not None else "?"

    def decode(self, path: str | Path) -> np.ndarray:
        """One image file as the run saw it: ``(size, size)`` uint8 through the training decoder."""
        return read_grayscale(path, self.image_size, self.resize)

    @property
    def transform(self):
        """The evaluation transform of training (normalise, to a ``(1, H, W)`` tensor; no augmentation)."""
        return build_transform(None)

    def spec(self) -> dict:
        """What :meth:`from_spec` rebuilds the model from, with the weights: the registered model's ``spec.json``,
        redacted (it is copied into the registry and served): rebuilding needs no secret, weights never download."""
        hparams = redact(dict(self.network.hparams))
        spec = {"run_id": self.run_id, "image_size": self.image_size, "resize": self.resize, "labels": self.labels,
                "thresholds": self.thresholds, "model_cfg": dict(hparams["model_cfg"]),
                "loss_cfg": dict(hparams["loss_cfg"]), "normalisation": {"mean": GRAY_MEAN, "std": GRAY_STD}}  # fmt: skip
        if self.adapter_cfg:
            spec.update(adapter_cfg=redact(self.adapter_cfg), unseen=self.unseen)
        return spec

    @classmethod
    def from_spec(cls, spec: dict, state_dict: dict) -> FinishedModel:
        """Rebuild from a registered model's spec and weights, with no tracking store at hand (the served model)."""
        check_targets(spec, "spec.json")
        adapter = spec.get("adapter_cfg") or None
        unseen = list(spec.get("unseen") or []) if adapter else []
        network = _network(spec["model_cfg"], spec["loss_cfg"], spec["labels"], adapter, unseen)
        network.load_state_dict(state_dict)
        return cls(network.eval(), list(spec["labels"]), unseen, int(spec["image_size"]), spec.get("resize", "stretch"),
                   spec.get("thresholds"), None, spec.get("run_id"), adapter_cfg=adapter)  # fmt: skip


def _network(model_cfg, loss_cfg, labels, adapter_cfg, unseen) -> MultiLabelClassifier:
    """The network without pretrained weights: the weights come from the run, never a download or a weights file."""
    model_cfg = {**model_cfg, "pretrained": False, "weights": None}
    adapter_cfg = {**adapter_cfg, FROM_CHECKPOINT: True} if adapter_cfg else None
    return build_model(model_cfg, loss_cfg, labels, adapter_cfg, unseen)


def load_finished(reference: str, client: MlflowClient | None = None) -> FinishedModel:
    """Load a finished run or registered model version (see the module docstring).

    Raises:
        ModelNotFound: no such run or version, or it lacks ``config.yaml`` / ``checkpoints/best.ckpt``.
        RunNotFinished: the run is not FINISHED (only a finished run has a tested best checkpoint).
        UnsafeConfig: the stored config names a class outside the allowed ones.
    """
    client = client or tracking_client()
    run, version = finished_run(reference, client)
    run_id = run.info.run_id
    rank = split_checkpoint(reference)[1]
    artifact = checkpoint_artifact(rank)
    with tempfile.TemporaryDirectory() as tmp:
        try:
            cfg = read_config(client, run_id, tmp)
            checkpoint = Path(download(client, run_id, artifact, tmp))
        except (MlflowException, OSError) as error:
            kept = " (a run keeps checkpoint.save_top_k checkpoints; checkpoints/top/index.json lists them)"
            raise ModelNotFound(
                f"run {run_id} has no {CONFIG} / {artifact} artifact (only finished platform training runs can "
                f"be loaded{kept if rank > 1 else ''}): {error}"
            ) from error
        sha256 = hashlib.sha256(checkpoint.read_bytes()).hexdigest()
        state = load_weights_only(checkpoint, f"run {run_id} {artifact}")
        labels = list(cfg.task.labels)
        thresholds = validation_thresholds(client, run_id, labels, tmp, predictions_artifact(rank, "val"))
    adapter = OmegaConf.to_container(cfg.adapter, resolve=True) if cfg.get("adapter") else None
    adapter = adapter if adapter and adapter.get("_target_") else None
    unseen = list(cfg.task.get("unseen") or []) if adapter else []
    network = _network(OmegaConf.to_container(cfg.model, resolve=True), OmegaConf.to_container(cfg.loss, resolve=True),
                       labels, adapter, unseen)  # fmt: skip
    network.load_state_dict(state["state_dict"])
    return FinishedModel(network.eval(), labels, unseen, int(cfg.data.image_size), str(cfg.data.get("resize", "stretch")),
                         thresholds, cfg, run_id, sha256, version, adapter)  # fmt: skip


def read_config(client: MlflowClient, run_id: str, folder: str) -> DictConfig:
    """A run's stored ``config.yaml``, checked by :func:`check_targets` before anyone builds from it."""
    cfg = OmegaConf.load(download(client, run_id, CONFIG, folder))
    check_targets(OmegaConf.to_container(cfg, resolve=False), f"run {run_id} {CONFIG}")
    return cfg


def validation_thresholds(client: MlflowClient, run_id: str, labels: list[str], folder: str,
                          predictions: str = VAL_PREDICTIONS) -> list[float] | None:  # fmt: skip
    """Per-class F1-maximising thresholds from the run's ``predictions/val.csv`` (or a kept checkpoint's
    ``predictions``), or None when it has none."""
    try:
        frame = pd.read_csv(download(client, run_id, predictions, folder), dtype={"image_id": str})
    except (MlflowException, OSError, ValueError):  # an older or partial run simply has no thresholds to carry
        return None
    if not all(name in frame and f"true/{name}" in frame for name in labels):
        return None
    targets = frame[[f"true/{name}" for name in labels]].to_numpy(dtype=float)  # (N, C), -1 = not labelled
    return [float(t) for t in select_thresholds(targets, frame[labels].to_numpy(dtype=float))]
