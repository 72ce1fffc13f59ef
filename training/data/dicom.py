"""DICOM radiographs: pixel data to display intensities, as a radiologist's viewer would show them."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from training.data.decode_errors import ImageDecodeError


def read_dicom(path: str | Path) -> np.ndarray:
    """Decode a DICOM file to a float32 2-D array where brighter means more attenuation.

    The modality LUT (rescale slope/intercept) and then the first VOI LUT or window stored in the file are
    applied, so the intensities are those the acquiring site chose to display. MONOCHROME1 images store
    attenuation as dark; they are inverted so every image shares MONOCHROME2's convention (bone bright),
    otherwise a model sees two opposite kinds of radiograph.

    Raises:
        ImageDecodeError: not a DICOM file, no pixel data, an unsupported compression, or truncated pixel data.
    """
    import pydicom
    from pydicom.pixels import apply_modality_lut, apply_voi_lut

    try:
        dataset = pydicom.dcmread(str(path))
        pixels = dataset.pixel_array
    except Exception as error:  # pydicom raises many types for unreadable files; all mean "cannot decode"
        raise ImageDecodeError(f"cannot decode DICOM file {path}: {error}") from error
    if pixels.ndim == 3 and getattr(dataset, "SamplesPerPixel", 1) == 1:
        pixels = pixels[0]  # multi-frame: the first frame is the radiograph
    values = apply_voi_lut(apply_modality_lut(pixels, dataset), dataset, index=0).astype(np.float32)
    if values.ndim == 3:  # colour DICOM (secondary captures): mean of the channels
        values = values.mean(axis=2)
    if str(getattr(dataset, "PhotometricInterpretation", "")).upper() == "MONOCHROME1":
        values = values.max() + values.min() - values
    return values
