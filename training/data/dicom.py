"""DICOM radiographs: pixel data to display intensities, as a radiologist's viewer would show them."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from training.data.decode_errors import ImageDecodeError, check_canvas


def window_output_range(dataset) -> tuple[float, float]:
    """The range a linear VOI window maps onto, by the rule pydicom's ``apply_windowing`` follows (DICOM PS3.3
    C.11.2.1.2): the stored bit depth's range, signed or not, moved by the rescale slope and intercept."""
    bits = int(dataset.BitsStored)
    if dataset.get("ModalityLUTSequence"):
        low, high = 0.0, float(2 ** int(dataset.ModalityLUTSequence[0].LUTDescriptor[2]) - 1)
    elif int(getattr(dataset, "PixelRepresentation", 0)) == 0:
        low, high = 0.0, float(2**bits - 1)
    else:
        low, high = float(-(2 ** (bits - 1))), float(2 ** (bits - 1) - 1)
    slope, intercept = dataset.get("RescaleSlope"), dataset.get("RescaleIntercept")
    if slope is not None and intercept is not None:
        low, high = sorted((low * float(slope) + float(intercept), high * float(slope) + float(intercept)))
    return low, high


def dicom_size(path: str | Path, dataset=None) -> tuple[int, int]:
    """``(Columns, Rows x NumberOfFrames)``: the canvas a DICOM header declares, all frames stacked (pydicom decodes
    every frame), read without the pixel data.

    Raises:
        ImageDecodeError: not a DICOM file, or a header without ``Rows``/``Columns``.
    """
    import pydicom

    try:
        dataset = dataset if dataset is not None else pydicom.dcmread(str(path), stop_before_pixels=True)
        return int(dataset.Columns), int(dataset.Rows) * int(dataset.get("NumberOfFrames") or 1)
    except Exception as error:  # pydicom raises many types for unreadable files; all mean "cannot decode"
        raise ImageDecodeError(f"cannot decode DICOM file {path}: {error}") from None


def read_dicom(path: str | Path, max_pixels: int | None = None) -> np.ndarray:
    """Decode a DICOM file to a 2-D array where brighter means more attenuation.

    Modality LUT, then the file's first VOI LUT or window, so intensities are those the site chose to display.
    MONOCHROME1 is inverted, otherwise a model sees two opposite kinds of radiograph. A windowed file is returned
    as uint8 display values and not stretched again (so an 8-bit image saved with the identity window decodes to
    exactly its PNG's pixels); without a window the modality floats are returned for
    :func:`training.data.images.to_uint8` to stretch. Pixel data is read only after the header's canvas passed
    ``max_pixels``, so a file declaring a huge canvas costs no more than its header.
    """
    import pydicom

    try:
        dataset = pydicom.dcmread(str(path), defer_size="64 KB")
    except Exception as error:  # pydicom raises many types for unreadable files; all mean "cannot decode"
        raise ImageDecodeError(f"cannot decode DICOM file {path}: {error}") from None
    check_canvas(Path(path), dicom_size(path, dataset), max_pixels)
    try:
        return _display_values(dataset)
    except Exception as error:  # a header the pixel data or the LUTs contradict (bit depth, lengths, missing tags)
        raise ImageDecodeError(f"cannot decode DICOM file {path}: {error}") from None


def _display_values(dataset) -> np.ndarray:
    """The modality and VOI LUTs applied, MONOCHROME1 inverted (see :func:`read_dicom`)."""
    from pydicom.pixels import apply_modality_lut, apply_voi_lut

    pixels = dataset.pixel_array
    if pixels.ndim == 3 and getattr(dataset, "SamplesPerPixel", 1) == 1:
        pixels = pixels[0]  # multi-frame: the first frame is the radiograph
    values = apply_voi_lut(apply_modality_lut(pixels, dataset), dataset, index=0).astype(np.float32)
    if values.ndim == 3:  # colour DICOM (secondary captures): mean of the channels
        values = values.mean(axis=2)
    inverted = str(getattr(dataset, "PhotometricInterpretation", "")).upper() == "MONOCHROME1"
    if "WindowCenter" in dataset and "WindowWidth" in dataset and not dataset.get("VOILUTSequence"):
        low, high = window_output_range(dataset)
        display = np.clip((values.astype(np.float64) - low) / max(high - low, 1e-12), 0.0, 1.0)
        display = 1.0 - display if inverted else display
        return np.round(display * 255.0).astype(np.uint8)
    if inverted:
        values = values.max() + values.min() - values
    return values
