"""Scoring requests: a path and the same file's base64 bytes decode to the training decoder's pixels."""

from __future__ import annotations

import base64

import cv2
import numpy as np
import pandas as pd
import pytest

from evaluation.serving import RequestError, decode_request
from training.data.images import read_grayscale


@pytest.fixture
def png(tmp_path):
    rng = np.random.default_rng(0)
    path = tmp_path / "x.png"
    cv2.imwrite(str(path), rng.integers(0, 65535, (40, 50), dtype=np.uint16))  # 16-bit, not square
    return path


def test_path_and_base64_give_the_training_decoding(png):
    b64 = base64.b64encode(png.read_bytes()).decode()
    frame = pd.DataFrame({"image": [str(png), None], "image_b64": [None, b64]})
    images = decode_request(frame, 32)
    expected = read_grayscale(png, 32)
    assert images.shape == (2, 32, 32) and images.dtype == np.uint8
    assert np.array_equal(images[0], expected) and np.array_equal(images[1], expected)


def test_raw_bytes_are_accepted(png):
    images = decode_request(pd.DataFrame({"image_b64": [png.read_bytes()]}), 16)
    assert np.array_equal(images[0], read_grayscale(png, 16))


@pytest.mark.parametrize(
    ("frame", "message"),
    [
        (pd.DataFrame({"file": ["a.png"]}), "needs a column"),
        (pd.DataFrame({"image": ["a.png", None]}), "row 0, column 'image'"),
        (pd.DataFrame({"image_b64": [base64.b64encode(b"not an image").decode()]}), "row 0, column 'image_b64'"),
    ],
)
def test_bad_requests_name_row_and_column(frame, message, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(RequestError, match=message):
        decode_request(frame, 16)


def test_a_row_without_any_image_is_named(png):
    with pytest.raises(RequestError, match="row 1: no image"):
        decode_request(pd.DataFrame({"image": [str(png), ""]}), 16)
