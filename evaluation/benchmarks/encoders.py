"""What a benchmark needs from a model, whatever its kind: embeddings for the probe and, if it can, a zero-shot
score for the benchmark's finding.

Every image reaches a model as a square ``(size, size)`` uint8 grayscale array read by the platform's decoder
(:func:`training.data.images.read_grayscale`, ``stretch``: the whole film squashed to the square, as in
training; a centre crop could cut off lung fields). Each model kind then applies its own normalisation.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Target:
    """The finding a benchmark asks about, in the forms different models understand.

    Attributes:
        label: output name a native classifier must have (``Pneumonia``).
        positive_prompt: text an image-text model compares the image with (``a chest x-ray showing pneumonia``).
        negative_prompt: the contrasting text (``a normal chest x-ray``).
    """

    label: str
    positive_prompt: str
    negative_prompt: str


@dataclass(frozen=True)
class Encoded:
    """A model's outputs on a list of images.

    Attributes:
        embeddings: ``(N, F)`` float32 frozen image embeddings (the probe's features).
        zero_shot: ``(N,)`` zero-shot scores, or ``None`` when the model has none for the target.
    """

    embeddings: np.ndarray
    zero_shot: np.ndarray | None


class Encoder(ABC):
    """One model kind. Subclasses are chosen by the model spec's prefix (``evaluation.benchmarks.models``).

    Attributes:
        spec: the model as the user named it.
        image_size: side of the square uint8 images :meth:`encode` expects.
        resize: the platform decoder's resize mode for those images.
        zero_shot_kind: ``probability`` (decision: above 0.5) or ``margin`` (decision: above 0).
        zero_shot_note: why the model has no zero-shot score, or ``None`` when it has one.
    """

    spec: str
    image_size: int
    resize: str = "stretch"
    zero_shot_kind: str = "probability"
    zero_shot_note: str | None = None

    DECISION_THRESHOLDS = {"probability": 0.5, "margin": 0.0}

    @property
    def has_zero_shot(self) -> bool:
        return self.zero_shot_note is None

    @property
    def decision_threshold(self) -> float:
        """The model's own decision rule: a score strictly above this is a positive call for the target."""
        return self.DECISION_THRESHOLDS[self.zero_shot_kind]

    @property
    @abstractmethod
    def identity(self) -> str:
        """A string that changes whenever the model's outputs could (weights, preprocessing); keys the cache."""

    @property
    def description(self) -> str:
        """One line naming the model for the printed report."""
        return self.spec

    @abstractmethod
    def encode(self, images: np.ndarray) -> Encoded:
        """Embeddings (and zero-shot scores) of a ``(B, size, size)`` uint8 batch."""
