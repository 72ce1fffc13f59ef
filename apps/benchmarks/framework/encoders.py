"""What a benchmark needs from a model, whatever its kind: embeddings for the probe and, where it can, a zero-shot
score and decision for each of the protocol's findings.

One encoder answers every target of a protocol, so a model is loaded once and each image encoded once however
many findings are asked; its zero-shot outputs are ``(N, T)`` columns in :attr:`Encoder.targets` order. Every
image reaches a model as a square ``(size, size)`` uint8 grayscale array, stretched as in training (a centre
crop could cut off lung fields); each model kind then applies its own normalisation.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Target:
    """A finding a benchmark asks about, in the forms different models understand.

    ``outputs`` names a platform classifier's outputs that answer the finding, in any spelling (matched case-,
    space- and underscore-insensitively), because a protocol's finding is often several of a training
    vocabulary's labels (``Pleural_Thickening`` and ``Pleural Other``); empty means the label itself.
    """

    label: str
    positive_prompt: str
    negative_prompt: str
    outputs: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "outputs", tuple(self.outputs))  # a YAML list: hashable and comparable as a tuple

    @property
    def output_names(self) -> tuple[str, ...]:
        """The classifier outputs looked for: :attr:`outputs`, or the label alone."""
        return self.outputs or (self.label,)


@dataclass(frozen=True, eq=False)
class Encoded:
    """A model's outputs on a list of ``N`` images, for the ``T`` targets of its encoder (in their order).

    ``zero_shot`` is ``(N, T)`` float64, NaN in the column of a target the model cannot score, ``None`` when it
    scores none; ``decisions`` are the model's own ``(N, T)`` calls (False where it has no score).
    """

    embeddings: np.ndarray
    zero_shot: np.ndarray | None = None
    decisions: np.ndarray | None = None

    def __post_init__(self) -> None:
        if (self.zero_shot is None) != (self.decisions is None):
            raise ValueError("zero-shot scores and decisions come together")
        n = len(self.embeddings)
        for name in ("zero_shot", "decisions"):
            value = getattr(self, name)
            if value is not None and (value.ndim != 2 or len(value) != n):
                raise ValueError(f"{name} must be (N, T) with N = {n} images, got {value.shape}")
        if self.zero_shot is not None and self.zero_shot.shape != self.decisions.shape:
            raise ValueError(f"zero-shot scores {self.zero_shot.shape} and decisions {self.decisions.shape} differ")


class Encoder(ABC):
    """One model kind. Subclasses are chosen by the model spec's prefix (``apps.benchmarks.framework.models``).

    Every kind is built as ``Kind(spec, targets, tracking_uri, seed)`` and calls this ``__init__`` first; ``targets``
    fixes the column order of every :class:`Encoded` it returns.

    Attributes:
        zero_shot_kind: ``probability`` or ``margin``: what a score is, for the report.
        zero_shot_notes: target label -> why the model has no zero-shot score for it (absent: it has one).
        mapped: platform classifiers: target label -> the model's own output names its score uses, so a report can
            show how a protocol's findings met the model's vocabulary; empty for kinds that answer through prompts.
    """

    image_size: int
    resize: str = "stretch"
    zero_shot_kind: str = "probability"

    DECISION_RULES = {"probability": "at or above 0.5", "margin": "above 0"}

    def __init__(self, spec: str, targets: Sequence[Target], tracking_uri: str | None = None, seed: int = 0):
        self.spec = spec
        self.targets = tuple(targets)
        labels = [t.label for t in self.targets]
        if len(set(labels)) != len(labels):
            raise ValueError(f"target labels must be unique, got {labels}")
        self.zero_shot_notes: dict[str, str] = {}
        self.mapped: dict[str, tuple[str, ...]] = {}

    @property
    def target_labels(self) -> tuple[str, ...]:
        """The targets' labels, in column order (not a classifier's own output labels)."""
        return tuple(t.label for t in self.targets)

    def column(self, label: str) -> int:
        """The zero-shot column of target ``label``."""
        try:
            return self.target_labels.index(label)
        except ValueError:
            known = ", ".join(self.target_labels)
            raise KeyError(f"{label!r} is not a target of this encoder (its targets: {known})") from None

    def has_zero_shot(self, label: str) -> bool:
        self.column(label)  # an unknown label is a bug, not a missing score
        return label not in self.zero_shot_notes

    @property
    def any_zero_shot(self) -> bool:
        return any(self.has_zero_shot(label) for label in self.target_labels)

    def decision_rule(self, label: str) -> str:
        """When the model calls ``label`` positive, as a phrase for the report (``above 0``)."""
        return self.DECISION_RULES[self.zero_shot_kind]

    @property
    @abstractmethod
    def identity(self) -> str:
        """A string that changes whenever the model's outputs could (weights, preprocessing, how targets are
        answered); keys the cache together with the targets."""

    @property
    def description(self) -> str:
        """One line naming the model for the printed report."""
        return self.spec

    embed_texts: Callable[[Sequence[str]], np.ndarray] | None = None
    """Image-text models: ``texts -> (M, D)`` normalised embeddings in the image embeddings' space (zero-shot
    beyond one prompt pair, e.g. a progression prompt bank); ``None`` for a model without a text tower."""

    @abstractmethod
    def encode(self, images: np.ndarray) -> Encoded:
        """Embeddings (and zero-shot scores and decisions for every target) of a ``(B, size, size)`` uint8 batch."""
