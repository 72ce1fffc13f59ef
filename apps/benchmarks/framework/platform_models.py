"""Models trained by this platform, as benchmark encoders: a run id, or a registered model version
(``models:/name@alias``, ``models:/name/3``) resolved to the run it came from.

Loading is :func:`training.runs.load_finished`'s job, so a benchmark judges exactly the weights ``make
evaluate``, ``serve`` and ``submit`` would. Zero-shot is the largest probability of the outputs a target names,
and the call is positive when any of them reaches its run's validation threshold (0.5 when none was stored),
as ``make evaluate`` calls it. Probe features are the backbone's pooled embedding (the head's input).
"""

from __future__ import annotations

import json
from collections.abc import Sequence

import numpy as np
import torch

from apps.benchmarks.framework.encoders import Encoded, Encoder, Target
from training.data.label_names import normalise
from training.data.transforms import GRAY_MEAN, GRAY_STD
from training.runs import ModelNotFound, load_finished
from training.tracking.uri import tracking_client

__all__ = ["ModelNotFound", "PlatformRunEncoder", "combine", "map_outputs", "missing_outputs_note"]

DEFAULT_THRESHOLD = 0.5
"""A run without validation thresholds calls an output positive from this probability on."""


def map_outputs(model_labels: Sequence[str], target: Target) -> tuple[int, ...]:
    """Columns of the model's outputs that answer ``target``, in the model's order; empty when it has none.

    Spellings differ between vocabularies (``Pleural_Thickening``, ``pleural thickening``), so names are compared
    after :func:`training.data.label_names.normalise`.
    """
    wanted = {normalise(name) for name in target.output_names}
    return tuple(i for i, label in enumerate(model_labels) if normalise(label) in wanted)


def combine(probs: np.ndarray, indices: Sequence[int], thresholds: Sequence[float] | None) -> tuple[np.ndarray, ...]:
    """One target's ``(N,)`` scores and decisions from the model's ``(N, L)`` output probabilities.

    The score is the largest mapped probability (the finding is as likely as its likeliest form); the decision is
    positive when any mapped output reaches its own threshold (``thresholds`` aligned with the outputs, ``None``:
    0.5 each), since each output's threshold was tuned for that output alone. No mapped output: NaN and False.
    """
    probs = np.asarray(probs, dtype=np.float64)
    if not indices:
        return np.full(len(probs), np.nan), np.zeros(len(probs), dtype=bool)
    columns = list(indices)
    limits = np.array([DEFAULT_THRESHOLD if thresholds is None else thresholds[i] for i in columns], dtype=np.float64)
    return probs[:, columns].max(axis=1), (probs[:, columns] >= limits).any(axis=1)


def missing_outputs_note(model: str, model_labels: Sequence[str], target: Target) -> str:
    """Why ``target`` has no zero-shot score: what was looked for and what the model has instead."""
    looked = ", ".join(map(repr, target.output_names))
    if not target.outputs:
        what = f"no {target.label!r} output"
    elif len(target.outputs) == 1:
        what = f"no {looked} output (the one that answers {target.label!r})"
    else:
        what = f"none of the outputs {looked} (those that answer {target.label!r})"
    return f"{model} has {what} (its labels: {', '.join(model_labels)}), so it has no zero-shot score for it"


class PlatformRunEncoder(Encoder):
    """A finished platform training run or registered version, named as :mod:`training.runs` accepts.

    ``seed`` is unused (a trained model has no random initialisation); every kind takes the same arguments.
    ``thresholds`` are the run's per-output validation thresholds aligned with ``labels``, or ``None``.
    """

    def __init__(self, spec: str, targets: Sequence[Target], tracking_uri: str, seed: int = 0):
        super().__init__(spec, targets, tracking_uri, seed)
        self.finished = load_finished(spec, tracking_client(tracking_uri))
        self.model = self.finished.network
        self.run_id = self.finished.run_id
        self.checkpoint_sha256 = self.finished.checkpoint_sha256
        self.labels = list(self.finished.labels)
        self.thresholds = None if self.finished.thresholds is None else [float(t) for t in self.finished.thresholds]
        if self.thresholds is not None and len(self.thresholds) != len(self.labels):
            raise ValueError(f"run {self.run_id}: {len(self.thresholds)} thresholds for {len(self.labels)} labels")
        self.image_size = self.finished.image_size
        self.resize = self.finished.resize
        self.task = self.finished.task
        self.indices = {t.label: map_outputs(self.labels, t) for t in self.targets}
        self.mapped = {label: tuple(self.labels[i] for i in columns) for label, columns in self.indices.items()}
        for target in self.targets:
            if not self.indices[target.label]:
                self.zero_shot_notes[target.label] = missing_outputs_note(
                    f"run {self.run_id} (task {self.task})", self.labels, target
                )

    def threshold(self, column: int) -> float:
        return DEFAULT_THRESHOLD if self.thresholds is None else self.thresholds[column]

    @property
    def identity(self) -> str:
        # Decisions are cached too, so the thresholds of the outputs used are part of what the outputs depend on.
        answers = {label: [[self.labels[i], self.threshold(i)] for i in cols] for label, cols in self.indices.items()}
        return (f"platform-run:{self.checkpoint_sha256}:{self.image_size}:{self.resize}:"
                f"{json.dumps(answers, sort_keys=True)}")  # fmt: skip

    @property
    def description(self) -> str:
        where = f"version {self.finished.version}, run" if self.finished.version else "platform run"
        return f"{self.spec} ({where} {self.run_id}, task {self.task}, {self.image_size} px)"

    def decision_rule(self, label: str) -> str:
        columns = self.indices[label]
        source = "the run's validation threshold" if self.thresholds is not None else "the default threshold"
        if len(columns) == 1:
            (column,) = columns
            return f"the probability of {self.labels[column]} is at or above {source} {self.threshold(column):g}"
        each = ", ".join(f"{self.labels[i]} {self.threshold(i):g}" for i in columns)
        return f"any of these outputs is at or above its own threshold ({source}s: {each}; the score is their max)"

    @staticmethod
    def to_tensor(images: np.ndarray) -> torch.Tensor:
        """``(B, 1, S, S)`` network input: training's evaluation transform (build_transform(None)), vectorised."""
        x = torch.from_numpy(np.ascontiguousarray(images)).float() / 255.0
        return ((x - GRAY_MEAN) / GRAY_STD).unsqueeze(1)

    @torch.inference_mode()
    def encode(self, images: np.ndarray) -> Encoded:
        features, pooled = head_input(self.model, self.to_tensor(images))
        embeddings = pooled.float().numpy()  # (B, F) for the linear probe, whatever the head reads
        if not self.any_zero_shot:
            return Encoded(embeddings)
        probs = torch.sigmoid(self.model.head(features)).float().numpy()  # (B, L)
        answers = [combine(probs, self.indices[t.label], self.thresholds) for t in self.targets]
        scores = np.stack([score for score, _ in answers], axis=1)  # (B, T)
        decisions = np.stack([decision for _, decision in answers], axis=1)
        return Encoded(embeddings, scores, decisions)


def head_input(model: torch.nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(what model.head reads, the pooled (B, F) feature)`` for images ``x``.

    A head may read the backbone's unpooled map (``uses_feature_map``, the query head), so the platform's
    ``features``/``pooled`` decide; a bare ``backbone`` + ``head`` network (no ``pooled``) feeds pooled features.
    """
    if not hasattr(model, "pooled"):
        features = model.backbone(x)
        return features, features
    features = model.features(x)
    return features, model.pooled(features)
