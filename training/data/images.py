"""Decoding radiographs of any bit depth into the uint8 grayscale arrays the models see."""

from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np


class ImageDecodeError(OSError):
    """An image file exists but cannot be decoded; the message names the file."""


def to_uint8(image: np.ndarray) -> np.ndarray:
    """Map an 8- or 16-bit (or float) grayscale image onto 0..255.

    16-bit radiographs rarely use the full range, so they are stretched between their 0.5th and 99.5th
    percentiles instead of divided by 257: dividing would leave a dim, low-contrast image.
    """
    if image.dtype == np.uint8:
        return image
    values = image.astype(np.float32)
    low, high = np.percentile(values, (0.5, 99.5))
    scaled = (values - low) / max(float(high - low), 1e-6)
    return (np.clip(scaled, 0.0, 1.0) * 255.0 + 0.5).astype(np.uint8)


def read_grayscale(path: str | Path, size: int) -> np.ndarray:
    """Read one image as a ``(size, size)`` uint8 array.

    Colour files (some exports are RGB) are converted to luminance. Resizing uses area interpolation, which
    averages rather than skips pixels when shrinking, so small findings are not aliased away.

    Raises:
        FileNotFoundError: the file is missing.
        ImageDecodeError: the file is not a readable image.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"image file not found: {path}")
    image = cv2.imread(str(path), cv2.IMREAD_UNCHANGED)
    if image is None:
        raise ImageDecodeError(f"cannot decode image file: {path}")
    if image.ndim == 3:
        image = cv2.cvtColor(image[..., :3], cv2.COLOR_BGR2GRAY)
    image = to_uint8(image)
    if image.shape != (size, size):
        image = cv2.resize(image, (size, size), interpolation=cv2.INTER_AREA)
    return image
