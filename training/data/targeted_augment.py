"""Per-class targeted augmentation: extra augmentation steps only for the images of chosen findings.

Why: a tail finding has a few dozen training images, so every epoch shows the same few pictures; augmenting
those more strongly makes each repeat a new view without changing what the head classes see. The overview's
Table 2 row F ("per-class targeted augmentation", classes below 4,000 training images) is
``configs/augment/targeted.yaml``, with classes chosen from the training split's own counts.

The labels come from the albumentations key :data:`CLASS_TARGETS` (1 / 0 / -1 not labelled); a call without it
(an evaluation transform) leaves the image unchanged by these steps.
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

    Classes are named (``classes``) or chosen as those with fewer than ``below`` positive training images; the
    second form needs counts only the data module has, passed through :func:`select_targeted_classes`.
    ``labels`` is the task's label names in column order (``${task.labels}``).
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
