"""Decoding every input kind the adapters meet: bit depths, colour modes, DICOM, and broken files."""

from __future__ import annotations

import cv2
import numpy as np
import pytest

from tests.dicom_files import write_dicom, write_display_dicom
from training.data.images import ImageDecodeError, decode, read_grayscale, resize_crop, resize_pad, to_uint8

pydicom = pytest.importorskip("pydicom")


def gradient(height=40, width=60, high=255, dtype=np.uint8):
    """Left-to-right ramp, so orientation and inversion are visible in one row."""
    return np.tile(np.linspace(0, high, width), (height, 1)).astype(dtype)


def test_16bit_png_is_stretched_between_percentiles(tmp_path):
    image = gradient(high=4000, dtype=np.uint16) + 1000  # a narrow slice of the 16-bit range
    cv2.imwrite(str(tmp_path / "a.png"), image)
    decoded = decode(tmp_path / "a.png")
    assert decoded.dtype == np.uint16 and decoded.max() == 5000  # native depth, not cut to 8 bits
    out = read_grayscale(tmp_path / "a.png", 60, resize="stretch")
    assert out[0, 0] == 0 and out[0, -1] == 255  # full display range used
    assert (np.diff(out[0].astype(int)) >= 0).all()  # monotone: orientation kept


def test_8bit_png_and_jpeg_keep_their_values(tmp_path):
    image = gradient()
    cv2.imwrite(str(tmp_path / "a.png"), image)
    cv2.imwrite(str(tmp_path / "a.jpg"), image, [cv2.IMWRITE_JPEG_QUALITY, 100])
    assert np.array_equal(decode(tmp_path / "a.png"), image)  # 8-bit is not re-stretched
    assert np.abs(decode(tmp_path / "a.jpg").astype(int) - image).max() <= 3


@pytest.mark.parametrize("channels", [3, 4])
def test_colour_and_alpha_become_luminance(tmp_path, channels):
    gray = gradient()
    colour = np.dstack([gray] * 3 + ([np.full_like(gray, 7)] if channels == 4 else []))
    cv2.imwrite(str(tmp_path / "c.png"), colour)
    decoded = decode(tmp_path / "c.png")
    assert decoded.shape == gray.shape
    assert np.abs(decoded.astype(int) - gray).max() <= 1  # alpha (7) did not leak into the intensities


def test_monochrome1_dicom_is_inverted(tmp_path):
    stored = gradient(high=4000, dtype=np.uint16)
    mono2 = decode(write_dicom(tmp_path / "m2.dcm", stored))
    mono1 = decode(write_dicom(tmp_path / "m1.dcm", stored, photometric="MONOCHROME1"))
    assert mono2[0, 0] < mono2[0, -1] and mono1[0, 0] > mono1[0, -1]
    np.testing.assert_allclose(mono1, mono2.max() + mono2.min() - mono2)


def test_dicom_window_is_applied(tmp_path):
    stored = gradient(high=4000, dtype=np.uint16)
    values = decode(write_dicom(tmp_path / "w.dcm", stored, window=(1000, 200)))
    below, above = stored < 850, stored > 1150
    assert np.unique(values[below]).size == 1 and np.unique(values[above]).size == 1  # clipped outside the window
    assert values[below].max() < values[above].min()


def test_truncated_files_are_refused_by_name(tmp_path):
    for name, params in (("t.png", []), ("t.jpg", [cv2.IMWRITE_JPEG_QUALITY, 90])):
        path = tmp_path / name
        cv2.imwrite(str(path), np.random.default_rng(0).integers(0, 255, (64, 64), dtype=np.uint8), params)
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
        with pytest.raises(ImageDecodeError, match=f"truncated .*{name}"):
            decode(path)


def test_missing_and_non_image_files(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.png"):
        decode(tmp_path / "nope.png")
    (tmp_path / "text.png").write_text("not an image")
    with pytest.raises(ImageDecodeError, match="text.png"):
        decode(tmp_path / "text.png")
    (tmp_path / "bad.dcm").write_bytes(b"\x00" * 200)
    with pytest.raises(ImageDecodeError, match="bad.dcm"):
        decode(tmp_path / "bad.dcm")


def test_pad_keeps_aspect_and_crop_keeps_centre():
    wide = np.full((50, 100), 200, np.uint8)
    padded = resize_pad(wide, 64)
    assert padded.shape == (64, 64)
    assert (padded[:16] == 0).all() and (padded[-16:] == 0).all() and (padded[16:48] == 200).all()
    marked = np.zeros((50, 100), np.uint8)
    marked[:, 25:75] = 255  # the centre square is all white
    assert (resize_crop(marked, 32) == 255).all()


def test_to_uint8_constant_image_does_not_divide_by_zero():
    assert (to_uint8(np.full((4, 4), 1234, np.uint16)) == 0).all()


@pytest.mark.parametrize("photometric", ["MONOCHROME2", "MONOCHROME1"])
def test_8bit_dicom_with_the_identity_window_decodes_to_its_png_pixels(tmp_path, photometric):
    image = np.random.default_rng(1).integers(0, 256, (30, 20)).astype(np.uint8)
    image[0, 0], image[0, 1] = 37, 200  # neither extreme needed: no stretch between the image's own min and max
    image = np.clip(image, 20, 230).astype(np.uint8)
    cv2.imwrite(str(tmp_path / "a.png"), image)
    decoded = decode(write_display_dicom(tmp_path / "a.dcm", image, photometric))
    assert decoded.dtype == np.uint8 and np.array_equal(decoded, image)
    assert np.array_equal(read_grayscale(tmp_path / "a.dcm", 16), read_grayscale(tmp_path / "a.png", 16))


def test_a_window_maps_onto_the_display_range_with_monochrome1_inverted_within_it(tmp_path):
    stored = gradient(high=4000, dtype=np.uint16)
    mono2 = decode(write_dicom(tmp_path / "m2.dcm", stored, window=(2048, 4096)))
    mono1 = decode(write_dicom(tmp_path / "m1.dcm", stored, photometric="MONOCHROME1", window=(2048, 4096)))
    # the window covers 0..4095, so a stored 4000 shows at 4000/4095 of the display range, not at its top
    assert mono2.dtype == np.uint8 and mono2[0, 0] == 0 and mono2[0, -1] == round(4000 / 4095 * 255)
    assert np.array_equal(mono1.astype(int), 255 - mono2.astype(int))
