"""Models trained by this platform: a run id, or a registered model version (``models:/name@alias``,
``models:/name/3``) resolved to the run it came from.

The model is rebuilt exactly as ``make evaluate`` does: the run's ``config.yaml`` artifact builds a
:class:`~training.models.module.MultiLabelClassifier`, and its one ``checkpoints/best.ckpt`` artifact fills in
the weights (``torch.load(weights_only=True)``: a checkpoint is data, never code to run). Pretrained-weight
download is switched off while rebuilding: the weights come from the checkpoint.

Zero-shot is the classifier's own probability for the benchmark's label, when it has that output; otherwise
there is no zero-shot score, and the report says so. Probe features are the backbone's pooled embedding (the
input of the linear head).
"""

from __future__ import annotations

import hashlib
import re
import tempfile
from pathlib import Path

import numpy as np
import torch
from mlflow import MlflowClient
from mlflow.exceptions import MlflowException
from omegaconf import OmegaConf

from evaluation.benchmarks.encoders import Encoded, Encoder, Target
from training.data.transforms import GRAY_MEAN, GRAY_STD

CHECKPOINT = "checkpoints/best.ckpt"
CONFIG = "config.yaml"


class ModelNotFound(LookupError):
    """The named run, model version or one of its artifacts does not exist in the tracking store."""


class PlatformRunEncoder(Encoder):
    """A finished platform training run, by id (``<run id>`` or ``run:<run id>``).

    Args:
        spec: the model as named by the user.
        target: the benchmark's finding.
        tracking_uri: the MLflow store holding the run.
        seed: unused (a trained model has no random initialisation); every kind takes the same arguments.
        run_id: the run to load; defaults to ``spec`` without a ``run:`` prefix.
    """

    def __init__(self, spec: str, target: Target, tracking_uri: str, seed: int = 0, *, run_id: str | None = None):
        from training.pipeline import build_model  # heavy (Lightning); only this model kind needs it

        self.spec = spec
        self.run_id = run_id or spec.removeprefix("run:")
        client = MlflowClient(tracking_uri)
        try:
            client.get_run(self.run_id)
        except MlflowException as error:
            raise ModelNotFound(f"no run {self.run_id!r} in the tracking store {tracking_uri}") from error
        with tempfile.TemporaryDirectory() as tmp:
            try:
                cfg = OmegaConf.load(client.download_artifacts(self.run_id, CONFIG, tmp))
                checkpoint = Path(client.download_artifacts(self.run_id, CHECKPOINT, tmp))
            except (MlflowException, OSError) as error:
                raise ModelNotFound(
                    f"run {self.run_id} has no {CONFIG} / {CHECKPOINT} artifact (only finished platform training "
                    f"runs can be benchmarked): {error}"
                ) from error
            self.checkpoint_sha256 = hashlib.sha256(checkpoint.read_bytes()).hexdigest()
            state = torch.load(checkpoint, map_location="cpu", weights_only=True)
        cfg.model.pretrained = False
        self.model = build_model(cfg).eval()
        self.model.load_state_dict(state["state_dict"])
        self.labels = list(self.model.labels)
        self.image_size = int(cfg.data.image_size)
        self.resize = str(cfg.data.get("resize", "stretch"))
        self.task = str(cfg.task.name)
        self.label_index = self.labels.index(target.label) if target.label in self.labels else None
        if self.label_index is None:
            self.zero_shot_note = (
                f"run {self.run_id} (task {self.task}) has no {target.label!r} output (its labels: "
                f"{', '.join(self.labels)}), so it has no zero-shot score; only the probe is reported"
            )

    @property
    def identity(self) -> str:
        return f"platform-run:{self.checkpoint_sha256}:{self.image_size}:{self.resize}:{self.label_index}"

    @property
    def description(self) -> str:
        return f"{self.spec} (platform run {self.run_id}, task {self.task}, {self.image_size} px)"

    @torch.inference_mode()
    def encode(self, images: np.ndarray) -> Encoded:
        # The evaluation transform of training (build_transform(None)), vectorised: Normalize then to tensor.
        x = (torch.from_numpy(np.ascontiguousarray(images)).float() / 255.0 - GRAY_MEAN) / GRAY_STD
        features = self.model.backbone(x.unsqueeze(1))  # (B, F)
        zero_shot = None
        if self.label_index is not None:
            zero_shot = torch.sigmoid(self.model.head(features)[:, self.label_index]).numpy()  # (B,)
        return Encoded(features.float().numpy(), zero_shot)


MODEL_URI = re.compile(r"^models:/(?P<name>[^/@]+)(?:@(?P<alias>[^/]+)|/(?P<version>\d+))$")


class RegisteredModelEncoder(PlatformRunEncoder):
    """A registered model version, ``models:/<name>@<alias>`` or ``models:/<name>/<version>``.

    The version's source run is looked up with ``MlflowClient`` and loaded like a run: the benchmark judges the
    weights the registry points at, through the same code path as a run id.
    """

    def __init__(self, spec: str, target: Target, tracking_uri: str, seed: int = 0):
        match = MODEL_URI.match(spec)
        if not match:
            raise ValueError(f"{spec!r}: expected models:/<name>@<alias> or models:/<name>/<version>")
        client = MlflowClient(tracking_uri)
        try:
            if match["alias"]:
                version = client.get_model_version_by_alias(match["name"], match["alias"])
            else:
                version = client.get_model_version(match["name"], match["version"])
        except MlflowException as error:
            raise ModelNotFound(f"{spec}: no such registered model version in {tracking_uri}") from error
        if not version.run_id:
            raise ModelNotFound(f"{spec} (version {version.version}) was not logged from a run; nothing to load")
        self.version = version.version
        super().__init__(spec, target, tracking_uri, run_id=version.run_id)

    @property
    def description(self) -> str:
        return f"{self.spec} (version {self.version}, run {self.run_id}, task {self.task}, {self.image_size} px)"
