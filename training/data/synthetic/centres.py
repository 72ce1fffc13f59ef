"""Acquisition look per source: how each centre turns a density map into an 8-bit film.

The two centres differ the way hospitals do, so a model trained mostly on one meets a domain shift on the other:

* ``centre_a``: drawn at 1.5x the output size and downsampled (sharp), near-linear contrast, little noise.
* ``centre_b``: an older detector: drawn at 0.6x and upsampled (blurry), a flatter, brighter contrast curve with
  raised blacks, more quantum noise, and a burned-in side marker ("R") in a corner. Its view mix also holds more
  portable AP films (see :mod:`labels`).

Patient positioning (small rotation, scale and shift) is applied here as well, on the density map.
"""

from __future__ import annotations

from dataclasses import dataclass

import cv2
import numpy as np


@dataclass(frozen=True)
class Centre:
    """Acquisition parameters of one source (ranges are sampled per image)."""

    name: str
    native_scale: float  # canvas size / output size (< 1: drawn small and upsampled)
    exposure: tuple[float, float]  # attenuation-to-brightness gain
    gamma: tuple[float, float]
    black: float  # output level of air
    white: float  # output level of the densest bone
    noise: float  # quantum-noise sigma (fraction of full scale)
    blur: float  # extra blur sigma in output pixels, as a fraction of 128 px
    marker: bool


CENTRES: dict[str, Centre] = {
    "centre_a": Centre("centre_a", 1.5, (1.2, 1.55), (0.9, 1.15), 0.02, 1.0, 0.012, 0.0, False),
    "centre_b": Centre("centre_b", 0.6, (0.95, 1.25), (0.65, 0.85), 0.1, 0.93, 0.022, 0.5, True),
}


def native_size(source: str, image_size: int) -> int:
    """Canvas size the anatomy is drawn at for this centre."""
    return max(32, int(round(image_size * CENTRES[source].native_scale)))


def develop(density: np.ndarray, source: str, rng: np.random.Generator, image_size: int, noiseless: bool = False):
    """Position, expose, resample and add noise: density ``(n, n)`` float32 -> film ``(S, S)`` uint8.

    Args:
        density: attenuation map at the centre's native size.
        source: centre name.
        rng: acquisition stream of the image.
        image_size: output size ``S``.
        noiseless: skip quantum noise and the marker (for measurements in tests).
    """
    centre = CENTRES[source]
    n = density.shape[0]
    angle, scale = rng.normal(0.0, 2.0), rng.uniform(0.94, 1.04)
    shift = rng.normal(0.0, 0.015, 2) * n
    matrix = cv2.getRotationMatrix2D((n / 2.0, n / 2.0), angle, scale)
    matrix[:, 2] += shift
    d = cv2.warpAffine(density, matrix, (n, n), flags=cv2.INTER_LINEAR, borderMode=cv2.BORDER_REPLICATE)
    gain = rng.uniform(*centre.exposure)
    film = (1.0 - np.exp(-gain * np.clip(d, 0.0, None))) / (1.0 - np.exp(-gain * 1.3))
    film = np.clip(film, 0.0, 1.0) ** rng.uniform(*centre.gamma)
    interp = cv2.INTER_AREA if n > image_size else cv2.INTER_LINEAR
    film = cv2.resize(film, (image_size, image_size), interpolation=interp)
    if centre.blur > 0:
        film = cv2.GaussianBlur(film, (0, 0), centre.blur * image_size / 128.0)
    film = centre.black + (centre.white - centre.black) * film
    if not noiseless:
        grain = rng.standard_normal((image_size, image_size)).astype(np.float32)
        film += centre.noise * grain * (0.4 + 0.6 * np.sqrt(np.clip(film, 0, 1)))
    out = np.clip(film * 255.0 + 0.5, 0, 255).astype(np.uint8)
    if centre.marker and not noiseless:
        scale_txt = image_size / 420.0
        x = int(image_size * rng.uniform(0.04, 0.1))
        y = int(image_size * rng.uniform(0.1, 0.16))
        cv2.putText(out, "R", (x, y), cv2.FONT_HERSHEY_SIMPLEX, scale_txt, 245, max(1, image_size // 128), cv2.LINE_AA)
    return out
