"""Albumentations pipelines built from ``configs/augment/*.yaml``.

Grayscale handling: images stay single-channel end to end. Backbones are built with ``in_chans=1`` (timm sums a
pretrained RGB stem's filters into one input channel, which is exactly the response to a gray image replicated
three times), so there is no 3x copy of every image in memory or through the first convolution. Normalisation
uses the mean of ImageNet's channel statistics so pretrained weights see inputs on their usual scale.
"""

from __future__ import annotations

from collections.abc import Sequence

import albumentations as A
import numpy as np
from albumentations.pytorch import ToTensorV2
from hydra.utils import instantiate

from evaluation.normalisation import GRAY_MEAN, GRAY_STD


def build_transform(steps: Sequence | None) -> A.Compose:
    """Compose the configured augmentation steps, then normalise and convert to a ``(1, H, W)`` float tensor.

    Args:
        steps: Hydra nodes with ``_target_`` naming an albumentations transform; ``None`` or empty for evaluation.
    """
    transforms = [instantiate(step) for step in (steps or [])]
    transforms += [A.Normalize(mean=GRAY_MEAN, std=GRAY_STD, max_pixel_value=255.0), ToTensorV2()]
    return A.Compose(transforms)


def stream_seed(*keys: int) -> int:
    """A 32-bit seed mixed from ``keys`` (run seed, rank, worker seed), so related streams are unrelated.

    For :meth:`albumentations.Compose.set_random_seed`: albumentations 2 keeps its own random state and ignores the
    global seeds that ``seed_everything`` sets, so a pipeline that is not seeded this way augments differently on
    every run.
    """
    return int(np.random.SeedSequence([int(k) for k in keys]).generate_state(1)[0])
