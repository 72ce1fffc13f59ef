"""Models trained by this platform, as benchmark encoders: a run id, or a registered model version
(``models:/name@alias``, ``models:/name/3``) resolved to the run it came from.

Loading is :func:`training.runs.load_finished`'s job, the same code ``make evaluate``, ``make serve`` and
``make submit`` use, so a benchmark judges exactly the weights those commands would.

Zero-shot is the classifier's own probability for the benchmark's label, when it has that output; otherwise
there is no zero-shot score, and the report says so. Probe features are the backbone's pooled embedding (the
input of the linear head).
"""

from __future__ import annotations

import numpy as np
import torch

from evaluation.benchmarks.encoders import Encoded, Encoder, Target
from training.data.transforms import GRAY_MEAN, GRAY_STD
from training.runs import ModelNotFound, load_finished
from training.tracking.uri import tracking_client

__all__ = ["ModelNotFound", "PlatformRunEncoder"]


class PlatformRunEncoder(Encoder):
    """A finished platform training run or registered version, named as :mod:`training.runs` accepts.

    Args:
        spec: the model as named by the user.
        target: the benchmark's finding.
        tracking_uri: the MLflow store holding the run.
        seed: unused (a trained model has no random initialisation); every kind takes the same arguments.
    """

    def __init__(self, spec: str, target: Target, tracking_uri: str, seed: int = 0):
        self.spec = spec
        self.finished = load_finished(spec, tracking_client(tracking_uri))
        self.model = self.finished.network
        self.run_id = self.finished.run_id
        self.checkpoint_sha256 = self.finished.checkpoint_sha256
        self.labels = list(self.finished.labels)
        self.image_size = self.finished.image_size
        self.resize = self.finished.resize
        self.task = self.finished.task
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
        where = f"version {self.finished.version}, run" if self.finished.version else "platform run"
        return f"{self.spec} ({where} {self.run_id}, task {self.task}, {self.image_size} px)"

    @torch.inference_mode()
    def encode(self, images: np.ndarray) -> Encoded:
        # The evaluation transform of training (build_transform(None)), vectorised: Normalize then to tensor.
        x = (torch.from_numpy(np.ascontiguousarray(images)).float() / 255.0 - GRAY_MEAN) / GRAY_STD
        features = self.model.backbone(x.unsqueeze(1))  # (B, F)
        zero_shot = None
        if self.label_index is not None:
            zero_shot = torch.sigmoid(self.model.head(features)[:, self.label_index]).numpy()  # (B,)
        return Encoded(features.float().numpy(), zero_shot)
