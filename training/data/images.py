"""Decoding radiographs of any format and bit depth into the uint8 grayscale arrays the models see.

The one path every image takes (training, the cache, serving): decode -> grayscale -> intensity -> resize.

* **Truncated files** are refused, not decoded into a half-grey image (which OpenCV does with only a warning).
* **Canvas limit**: the canvas a header declares is refused above ``max_pixels`` *before* anything is
  allocated: a few KB of PNG can declare gigabytes in every loader worker, and no single decoder's cap covers
  the others (PIL's only warns, OpenCV and pydicom decode on their own).
* **Intensities**: 8-bit kept as stored; deeper images rarely use their range, so they are clipped to their
  0.5th-99.5th percentiles and scaled onto 0..255.
* **Geometry**: ``pad`` (real data default) keeps the whole field and aspect ratio; shrinking uses area
  interpolation so small findings are not aliased away.
"""

from __future__ import annotations

import io
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

import cv2
import numpy as np
from PIL import BmpImagePlugin, JpegImagePlugin, PngImagePlugin, TiffImagePlugin

from training.data.decode_errors import ImageDecodeError, check_canvas

#: Default of ``data.max_pixels``: five times a large radiography detector (43 x 43 cm at 100 um is 18.5
#: megapixels; CXR-LT's PadChest films are at most about 7), so no real radiograph is refused.
MAX_PIXELS = 100_000_000

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
PNG_END = b"IEND\xaeB`\x82"
JPEG_START, JPEG_END = b"\xff\xd8", b"\xff\xd9"
TAIL_BYTES = 4096  # encoders may pad after the end marker; look for it in the last few KB


def to_uint8(image: np.ndarray) -> np.ndarray:
    """Map an 8-bit, 16-bit or float grayscale image onto 0..255 (see the module docstring)."""
    if image.dtype == np.uint8:
        return image
    values = image.astype(np.float32)
    low, high = np.percentile(values, (0.5, 99.5))
    scaled = (values - low) / max(float(high - low), 1e-6)
    return (np.clip(scaled, 0.0, 1.0) * 255.0 + 0.5).astype(np.uint8)


def check_complete(path: Path, data: bytes) -> None:
    """Refuse PNG and JPEG files that end before their end marker (a truncated download or copy)."""
    tail = data[-TAIL_BYTES:]
    if data.startswith(PNG_SIGNATURE) and PNG_END not in tail:
        raise ImageDecodeError(f"truncated PNG (no IEND chunk): {path}")
    if data.startswith(JPEG_START) and JPEG_END not in tail:
        raise ImageDecodeError(f"truncated JPEG (no end-of-image marker): {path}")


SIGNATURES = {  # format -> (offset, magic bytes)
    "PNG": (0, PNG_SIGNATURE), "JPEG": (0, JPEG_START), "DICOM": (128, b"DICM"), "TIFF (little-endian)": (0, b"II*\x00"),
    "TIFF (big-endian)": (0, b"MM\x00*"), "BMP": (0, b"BM"),
}  # fmt: skip


#: PIL's parser of each raster format's header. Called directly rather than through ``Image.open``, which applies
#: PIL's process-wide limit (a warning, or an error at twice it) before this module can apply ``max_pixels``.
HEADER_READERS = {
    "PNG": PngImagePlugin.PngImageFile, "JPEG": JpegImagePlugin.JpegImageFile, "BMP": BmpImagePlugin.BmpImageFile,
    "TIFF (little-endian)": TiffImagePlugin.TiffImageFile, "TIFF (big-endian)": TiffImagePlugin.TiffImageFile,
}  # fmt: skip


def image_format(path: Path, head: bytes) -> str:
    """The format a file's first bytes announce (:data:`SIGNATURES`).

    Raises:
        ImageDecodeError: none of them (an empty file, text saved as ``.png``, a corrupt header).
    """
    kind = next((k for k, (at, magic) in SIGNATURES.items() if head[at : at + len(magic)] == magic), None)
    if kind is None:
        raise ImageDecodeError(f"not a recognised image format (empty or corrupt header): {path}")
    return kind


def declared_size(path: str | Path) -> tuple[int, int]:
    """``(width, height)`` of the canvas a file's header declares, read without decoding the pixels. For a DICOM
    the height counts every frame (``Rows`` x ``NumberOfFrames``), since pydicom decodes them all.
    """
    path = Path(path)
    if path.suffix.lower() in DECODERS:
        from training.data.dicom import dicom_size

        return dicom_size(path)
    with open(path, "rb") as handle:
        return raster_size(path, handle)


def raster_size(path: Path, stream: BinaryIO) -> tuple[int, int]:
    """``(width, height)`` from the header of a PNG, JPEG, TIFF or BMP held in ``stream`` (read from its start)."""
    kind = image_format(path, stream.read(132))
    if kind == "DICOM":
        raise ImageDecodeError(f"a DICOM file without the .dcm suffix (DICOM is read from .dcm files): {path}")
    stream.seek(0)
    try:
        return HEADER_READERS[kind](stream).size
    except Exception as error:  # PIL raises SyntaxError, struct.error, ... for a header it cannot parse
        raise ImageDecodeError(f"unreadable {kind} header ({error}): {path}") from None


def check_file(path: str | Path, max_pixels: int | None = MAX_PIXELS) -> str:
    """Cheap integrity check without decoding: the file exists, starts like a known image format, declares a
    canvas within ``max_pixels`` and, for PNG and JPEG, ends with its end marker. Reads a few KB whatever the
    image size.

    Returns the detected format; raises as :func:`decode` would, for the problems visible from the ends.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"image file not found: {path}")
    if path.stat().st_size == 0:
        raise ImageDecodeError(f"empty image file: {path}")
    with open(path, "rb") as handle:
        head = handle.read(132)
        handle.seek(max(0, path.stat().st_size - TAIL_BYTES))
        tail = head if len(head) < 132 else handle.read()
    kind = image_format(path, head)
    check_complete(path, head[:8] + tail)
    check_canvas(path, declared_size(path), max_pixels)
    return kind


def _decode_raster(path: Path, max_pixels: int | None) -> np.ndarray:
    data = path.read_bytes()
    if not data:
        raise ImageDecodeError(f"empty image file: {path}")
    check_complete(path, data)
    check_canvas(path, raster_size(path, io.BytesIO(data)), max_pixels)
    try:
        image = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_UNCHANGED)
    except cv2.error as error:  # OpenCV refuses some files by raising rather than returning None
        raise ImageDecodeError(f"cannot decode image file ({error.err}): {path}") from None
    if image is None:
        raise ImageDecodeError(f"cannot decode image file (not an image, or an unsupported format): {path}")
    return image


def _decode_dicom(path: Path, max_pixels: int | None) -> np.ndarray:
    from training.data.dicom import read_dicom

    return read_dicom(path, max_pixels)


DECODERS: dict[str, Callable[[Path, int | None], np.ndarray]] = {".dcm": _decode_dicom, ".dicom": _decode_dicom}


def decode(path: str | Path, max_pixels: int | None = MAX_PIXELS) -> np.ndarray:
    """Decode one file to a 2-D grayscale array at its native bit depth.

    Raises:
        FileNotFoundError: the file is missing.
        ImageDecodeError: the file is truncated, empty, not a decodable image, or declares a canvas above
            ``max_pixels`` (None: no limit).
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"image file not found: {path}")
    image = DECODERS.get(path.suffix.lower(), _decode_raster)(path, max_pixels)
    if image.ndim == 3 and image.shape[2] == 1:
        image = image[..., 0]
    elif image.ndim == 3:  # BGR or BGRA: luminance of the colour channels, alpha dropped
        image = cv2.cvtColor(np.ascontiguousarray(image[..., :3]), cv2.COLOR_BGR2GRAY)
    if image.ndim != 2 or min(image.shape) == 0:
        raise ImageDecodeError(f"unexpected image shape {image.shape}: {path}")
    return image


def _scaled(image: np.ndarray, scale: float) -> np.ndarray:
    height, width = image.shape
    size = (max(1, round(width * scale)), max(1, round(height * scale)))
    interpolation = cv2.INTER_AREA if scale < 1 else cv2.INTER_LINEAR
    return cv2.resize(image, size, interpolation=interpolation)


def resize_stretch(image: np.ndarray, size: int) -> np.ndarray:
    """Each axis to ``size`` independently (the aspect ratio is not kept)."""
    if image.shape == (size, size):
        return image
    interpolation = cv2.INTER_AREA if max(image.shape) > size else cv2.INTER_LINEAR
    return cv2.resize(image, (size, size), interpolation=interpolation)


def resize_pad(image: np.ndarray, size: int) -> np.ndarray:
    """Longer side to ``size``, the shorter one centred on a black square."""
    if image.shape == (size, size):
        return image
    scaled = _scaled(image, size / max(image.shape))[:size, :size]
    out = np.zeros((size, size), dtype=image.dtype)
    top, left = (size - scaled.shape[0]) // 2, (size - scaled.shape[1]) // 2
    out[top : top + scaled.shape[0], left : left + scaled.shape[1]] = scaled
    return out


def resize_crop(image: np.ndarray, size: int) -> np.ndarray:
    """Shorter side to ``size``, then the centre square."""
    if image.shape == (size, size):
        return image
    scaled = _scaled(image, size / min(image.shape))
    top, left = max(0, (scaled.shape[0] - size) // 2), max(0, (scaled.shape[1] - size) // 2)
    return resize_stretch(scaled[top : top + size, left : left + size], size)


RESIZERS: dict[str, Callable[[np.ndarray, int], np.ndarray]] = {
    "pad": resize_pad,
    "crop": resize_crop,
    "stretch": resize_stretch,
}


def read_grayscale(
    path: str | Path, size: int, resize: str = "stretch", max_pixels: int | None = MAX_PIXELS
) -> np.ndarray:
    """Read one image as a ``(size, size)`` uint8 array: decode, normalise, resize (see module docstring).

    Raises ``FileNotFoundError``, ``ImageDecodeError`` (undecodable, or canvas above ``max_pixels``) or ``KeyError``
    (an unknown ``resize`` mode).
    """
    if resize not in RESIZERS:
        raise KeyError(f"unknown resize mode {resize!r}; choose one of {sorted(RESIZERS)}")
    return RESIZERS[resize](to_uint8(decode(path, max_pixels)), size)
