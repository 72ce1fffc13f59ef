"""Per-class targeted augmentation: extra augmentation steps only for the images of chosen findings.

Why: the tail findings have a few dozen training images each, so every epoch shows the network the same few
pictures; augmenting those images more strongly than the rest (more geometric and intensity variation) makes each
repeat a new view without changing what the head and common classes see. The overview's Table 2 row F names
"per-class targeted augmentation"; ``configs/augment/targeted.yaml`` is this platform's form of it.

The step reads the image's labels from the key :data:`CLASS_TARGETS` of the albumentations call, which the training
dataset fills with the image's target row (1 positive, 0 negative, -1 not labelled); a call without that key (an
evaluation transform, a bare test) leaves the image unchanged by these steps.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import albumentations as A
import numpy as np

from training.errors import UserError

#: The albumentations data key holding the image's ``(C,)`` target row.
CLASS_TARGETS = "class_targets"


class ClassTargeted(A.BaseCompose):
    """Apply ``transforms`` (in order) to an image positive for any of ``classes``, with probability ``p``.

    Args:
        transforms: albumentations steps (Hydra-instantiated from the YAML).
        classes: finding names whose positive images get the steps; each must be one of ``labels``.
        labels: the task's label names in column order (``${task.labels}`` in the YAML), to find the columns.
        p: probability of applying the steps to a targeted image.
    """

    def __init__(self, transforms: Sequence, classes: Sequence[str], labels: Sequence[str] | None, p: float = 1.0):
        labels = list(labels or [])
        unknown = [name for name in classes if name not in labels]
        if unknown or not classes:
            raise UserError(
                f"augment ClassTargeted: classes {unknown or list(classes)} are not labels of this task "
                f"({len(labels)} labels: {', '.join(labels[:6])}{', ...' if len(labels) > 6 else ''})"
            )
        super().__init__(list(transforms), p)
        self.classes = list(classes)
        self.columns = np.array([labels.index(name) for name in classes], dtype=np.int64)

    def targeted(self, targets: Any) -> bool:
        """Whether a ``(C,)`` target row is positive for any targeted class."""
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
