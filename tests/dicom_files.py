"""The one DICOM writer of the tests: decoding, acquisition headers and the REVEAL fixtures all need real files,
and three hand-copied writers had started to drift (SOP class, bit depth, where MONOCHROME1 inverts)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

BITS = {np.dtype(np.uint8): (8, 8, 7), np.dtype(np.uint16): (16, 12, 11)}
"""dtype of the stored values -> (BitsAllocated, BitsStored, HighBit): 16-bit files are 12-bit detectors, as in
most radiography."""


def write_dicom(path: Path, stored: np.ndarray, photometric: str = "MONOCHROME2",
                window: tuple[float, float] | None = None, tags: dict | None = None,
                pixel_data: bool = True) -> Path:  # fmt: skip
    """A minimal valid DX file holding ``stored`` as its pixel values, unchanged (MONOCHROME1 included).

    Args:
        path: where to write (parents are created).
        stored: ``(H, W)`` uint8 or uint16 values as the file stores them.
        photometric: ``MONOCHROME2`` (0 = black) or ``MONOCHROME1`` (0 = white).
        window: ``(centre, width)`` of the VOI window, or None for none.
        tags: further header keywords (``Manufacturer``, ``KVP``, ...).
        pixel_data: False leaves the pixel data out (a header-only file).
    """
    from pydicom.dataset import Dataset, FileMetaDataset
    from pydicom.uid import DigitalXRayImageStorageForPresentation, ExplicitVRLittleEndian, generate_uid

    stored = np.asarray(stored)
    meta = FileMetaDataset()
    meta.MediaStorageSOPClassUID = DigitalXRayImageStorageForPresentation
    meta.MediaStorageSOPInstanceUID = generate_uid()
    meta.TransferSyntaxUID = ExplicitVRLittleEndian
    ds = Dataset()
    ds.file_meta = meta
    ds.SOPClassUID, ds.SOPInstanceUID = meta.MediaStorageSOPClassUID, meta.MediaStorageSOPInstanceUID
    ds.Modality = "DX"
    ds.Rows, ds.Columns = stored.shape
    ds.SamplesPerPixel, ds.PhotometricInterpretation = 1, photometric
    ds.BitsAllocated, ds.BitsStored, ds.HighBit = BITS[stored.dtype]
    ds.PixelRepresentation = 0
    if window is not None:
        ds.WindowCenter, ds.WindowWidth = window
    for keyword, value in (tags or {}).items():
        setattr(ds, keyword, value)
    if pixel_data:
        ds.PixelData = np.ascontiguousarray(stored).tobytes()
    path.parent.mkdir(parents=True, exist_ok=True)
    ds.save_as(path, enforce_file_format=True)
    return path


def write_display_dicom(path: Path, pixels: np.ndarray, photometric: str = "MONOCHROME2", tags: dict | None = None,
                        pixel_data: bool = True) -> Path:  # fmt: skip
    """An 8-bit image as DICOM with the identity window (centre 128, width 256), so it decodes to ``pixels``:
    MONOCHROME1 stores the inverted values, as such a file would."""
    pixels = np.asarray(pixels, dtype=np.uint8)
    stored = 255 - pixels if photometric == "MONOCHROME1" else pixels
    return write_dicom(path, stored, photometric, (128, 256), tags, pixel_data)
