"""The challenge's robustness set: a fixed perturbed copy of the evaluation images (docs/rules.md §4).

Every model must meet *the same* perturbed pixels, otherwise a robustness gap between two runs could come from
luckier draws rather than a better model. So the perturbation parameters are drawn from a fixed seed, per image
index only (never from image content or from how many images came before).

Perturbation, as specified by the challenge: affine about the image centre with scale chosen from {0.9, 1.1} and
a translation of -10% or +10% of the image size on each axis (discrete choices, each with probability 1/2), black
border; then, with probability 0.5, additive Gaussian noise with std uniform in [0.1, 0.2] on intensities in
[0, 1], clipped. No flip, no rotation. Plain OpenCV is used rather than albumentations so the exact matrix and
noise are visible here and cannot drift with a library's sampling conventions.

The test phase perturbs at the source resolution, before any model's resize, and caches that one copy for every
input size: :mod:`evaluation.perturbed_split`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import cv2
import numpy as np

PERTURB_SEED = 2026
SCALES = (0.9, 1.1)  # discrete affine scale choices
TRANSLATIONS = (-0.1, 0.1)  # discrete translation choices, fraction of width (x) / height (y)
NOISE_PROB = 0.5
NOISE_STD_RANGE = (0.1, 0.2)  # on intensities in [0, 1]
DEFAULT_CACHE_DIR = Path(__file__).resolve().parents[1] / "data" / "cache" / "perturbed"  # git-ignored /data/


class PerturbCacheError(ValueError):
    """A cached perturbed set exists under the requested key but does not belong to the requested images."""


@dataclass(frozen=True)
class PerturbParams:
    """Parameters of one image's perturbation.

    Attributes:
        scale: affine scale about the image centre, 0.9 or 1.1.
        tx: horizontal translation as a fraction of the width, -0.1 or +0.1 (positive moves content right).
        ty: vertical translation as a fraction of the height, -0.1 or +0.1 (positive moves content down).
        noise: whether Gaussian noise is added.
        noise_std: std of that noise on [0, 1] intensities; 0.0 when ``noise`` is false.
        noise_seed: seed of the image's noise field, so one image can be reproduced on its own.
    """

    scale: float
    tx: float
    ty: float
    noise: bool
    noise_std: float
    noise_seed: int


def draw_params(n: int, seed: int = PERTURB_SEED) -> list[PerturbParams]:
    """Draw the perturbation parameters of images ``0 .. n-1``.

    Each index gets its own generator seeded with ``(seed, index)``, so an image's parameters depend on nothing
    else: growing or truncating the set leaves the shared prefix unchanged, and image content never enters.

    Args:
        n: number of images.
        seed: the set's seed; :data:`PERTURB_SEED` for the official robustness report.
    """
    if n < 0 or seed < 0:
        raise ValueError(f"n and seed must be non-negative, got n={n}, seed={seed}")
    params = []
    for index in range(n):
        rng = np.random.default_rng([seed, index])
        # Every value is always drawn, in a fixed order, so no choice shifts the stream of the next one.
        scale = SCALES[int(rng.integers(2))]
        tx = TRANSLATIONS[int(rng.integers(2))]
        ty = TRANSLATIONS[int(rng.integers(2))]
        noise = bool(rng.random() < NOISE_PROB)
        std = float(rng.uniform(*NOISE_STD_RANGE))
        noise_seed = int(rng.integers(2**32))
        params.append(PerturbParams(scale, tx, ty, noise, std if noise else 0.0, noise_seed))
    return params


def affine_matrix(params: PerturbParams, height: int, width: int) -> np.ndarray:
    """The ``(2, 3)`` forward matrix (source -> destination pixel) of a perturbation.

    ``dst = scale * (src - centre) + centre + (tx * width, ty * height)``, with the centre at ``((W-1)/2, (H-1)/2)``
    in OpenCV's pixel-centre coordinates, so scaling alone keeps the image centred.
    """
    cx, cy = (width - 1) / 2.0, (height - 1) / 2.0
    s = params.scale
    return np.array(
        [[s, 0.0, (1.0 - s) * cx + params.tx * width], [0.0, s, (1.0 - s) * cy + params.ty * height]],
        dtype=np.float64,
    )


def perturb_image(image: np.ndarray, params: PerturbParams) -> np.ndarray:
    """Perturb one ``(H, W)`` uint8 image; returns ``(H, W)`` uint8.

    Affine first (linear interpolation, black outside the source), then noise, so the black border gets noise
    too, as it would on a noisy detector.
    """
    if image.ndim != 2 or image.dtype != np.uint8:
        raise ValueError(f"expected an (H, W) uint8 image, got shape {image.shape} dtype {image.dtype}")
    height, width = image.shape
    warped = cv2.warpAffine(
        image,
        affine_matrix(params, height, width),
        (width, height),
        flags=cv2.INTER_LINEAR,
        borderMode=cv2.BORDER_CONSTANT,
        borderValue=0,
    )  # (H, W) uint8
    if not params.noise:
        return warped
    rng = np.random.default_rng(params.noise_seed)
    noisy = warped.astype(np.float64) / 255.0 + rng.normal(0.0, params.noise_std, size=warped.shape)  # (H, W)
    return np.rint(np.clip(noisy, 0.0, 1.0) * 255.0).astype(np.uint8)
