"""Per-class targeted augmentation: extra augmentation steps only for the images of chosen findings.

Why: the tail findings have a few dozen training images each, so every epoch shows the network the same few
pictures; augmenting those images more strongly than the rest makes each repeat a new view without changing what
the head and common classes see. The overview's Table 2 row F names "per-class targeted augmentation" (rotations
and horizontal flips for the classes below 4,000 training images); ``configs/augment/targeted.yaml`` is that
setting, with the classes chosen from the training split's own counts so it holds for any data set.

The step reads the image's labels from the key :data:`CLASS_TARGETS` of the albumentations call, which the training
dataset fills with the image's target row (1 positive, 0 negative, -1 not labelled); a call without that key (an
evaluation transform, a bare test) leaves the image unchanged by these steps.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import albumentations as A
import numpy as np

from training.errors import UserError

log = logging.getLogger(__name__)

#: The albumentations data key holding the image's ``(C,)`` target row.
CLASS_TARGETS = "class_targets"


class ClassTargeted(A.BaseCompose):
    """Apply ``transforms`` (in order) to an image positive for any targeted class, with probability ``p``.

    The targeted classes are either named (``classes``) or chosen from the training labels (``below``: every class
    with fewer positive training images than that). The second form needs the counts, which only the data module
    has when it builds the training split; it passes them through :func:`select_targeted_classes`.

    Args:
        transforms: albumentations steps (Hydra-instantiated from the YAML).
        classes: finding names whose positive images get the steps; each must be one of ``labels``.
        labels: the task's label names in column order (``${task.labels}`` in the YAML), to find the columns.
        p: probability of applying the steps to a targeted image.
        below: instead of ``classes``, target each class with fewer than this many positive training images.
    """

    def __init__(
        self,
        transforms: Sequence,
        classes: Sequence[str] | None = None,
        labels: Sequence[str] | None = None,
        p: float = 1.0,
        below: int | None = None,
    ):
        labels = list(labels or [])
        if (classes is None) == (below is None):
            raise UserError("augment ClassTargeted: give exactly one of classes (names) and below (a count)")
        super().__init__(list(transforms), p)
        self.labels, self.below = labels, below
        self.classes: list[str] = []
        self.columns: np.ndarray | None = None
        if classes is not None:
            self._target(list(classes))

    def _target(self, classes: list[str]) -> None:
        unknown = [name for name in classes if name not in self.labels]
        if unknown or (not classes and self.below is None):
            labels = self.labels
            raise UserError(
                f"augment ClassTargeted: classes {unknown or classes} are not labels of this task "
                f"({len(labels)} labels: {', '.join(labels[:6])}{', ...' if len(labels) > 6 else ''})"
            )
        self.classes = classes
        self.columns = np.array([self.labels.index(name) for name in classes], dtype=np.int64)

    def fit_counts(self, counts: Sequence[int]) -> None:
        """Target the classes with fewer than ``below`` positives in ``counts`` (``(C,)``, label order)."""
        if self.below is None:
            return
        counts = np.asarray(counts)
        if len(counts) != len(self.labels):
            raise ValueError(f"ClassTargeted: {len(counts)} class counts for {len(self.labels)} labels")
        self._target([name for name, count in zip(self.labels, counts, strict=True) if count < self.below])
        log.info("targeted augmentation for %d classes with fewer than %d training images: %s",
                 len(self.classes), self.below, ", ".join(self.classes))  # fmt: skip

    def targeted(self, targets: Any) -> bool:
        """Whether a ``(C,)`` target row is positive for any targeted class."""
        if self.columns is None:
            raise RuntimeError("ClassTargeted(below=...) has no class counts yet: call select_targeted_classes")
        return bool(np.any(np.asarray(targets)[self.columns] == 1))

    def __call__(self, *args: Any, force_apply: bool = False, **data: Any) -> dict[str, Any]:
        targets = data.get(CLASS_TARGETS)
        if targets is None or not self.targeted(targets):
            return data
        if force_apply or self.py_random.random() < self.p:
            for transform in self.transforms:
                data = transform(**data)
                data = self.check_data_post_transform(data)
        return data


def select_targeted_classes(pipeline: A.BaseCompose, targets: np.ndarray) -> None:
    """Give every count-chosen :class:`ClassTargeted` step of ``pipeline`` the training split's ``(N, C)`` targets.

    Positives are the entries equal to 1; unlabelled (-1) entries do not count.
    """
    counts = (np.asarray(targets) == 1).sum(axis=0)
    for step in pipeline.transforms:
        if isinstance(step, ClassTargeted):
            step.fit_counts(counts)
