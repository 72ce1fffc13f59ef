"""Scoring requests: a path and the same file's base64 bytes decode to the training decoder's pixels."""

from __future__ import annotations

import base64

import cv2
import numpy as np
import pandas as pd
import pytest

from apps.serving import RequestError, decode_request
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
    images = decode_request(frame, 32, image_root=png.parent)
    expected = read_grayscale(png, 32)
    assert images.shape == (2, 32, 32) and images.dtype == np.uint8
    assert np.array_equal(images[0], expected) and np.array_equal(images[1], expected)


def test_raw_bytes_are_accepted(png):
    images = decode_request(pd.DataFrame({"image_b64": [png.read_bytes()]}), 16)
    assert np.array_equal(images[0], read_grayscale(png, 16))


@pytest.mark.parametrize(
    ("frame", "message"),
    [
        (pd.DataFrame({"file": ["a.png"]}), r"needs a column 'image' or 'image_b64'; got \['file'\]"),
        (pd.DataFrame({"image": ["a.png", None]}), "row 0, column 'image'"),
        (pd.DataFrame({"image_b64": [base64.b64encode(b"not an image").decode()]}), "row 0, column 'image_b64'"),
    ],
)
def test_bad_requests_name_row_and_column(frame, message, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(RequestError, match=message):
        decode_request(frame, 16, image_root=tmp_path)


def test_a_row_without_any_image_is_named(png):
    with pytest.raises(RequestError, match="row 1: no image"):
        decode_request(pd.DataFrame({"image": [str(png), ""]}), 16, image_root=png.parent)


def test_no_path_is_opened_without_an_image_root(png):
    """By default only the bytes sent are read: a path names a file of the server, which a client must not pick."""
    with pytest.raises(RequestError, match=r"row 0, column 'image': this server opens no file a request names; "
                                           r"send the image's bytes as 'image_b64'"):  # fmt: skip
        decode_request(pd.DataFrame({"image": [str(png)]}), 16)


def test_paths_are_read_only_under_the_image_root(png, tmp_path):
    root = tmp_path / "served"
    root.mkdir()
    (root / "in.png").write_bytes(png.read_bytes())
    (root / "link.png").symlink_to(png)  # a link inside the root to a file outside it
    assert np.array_equal(decode_request(pd.DataFrame({"image": ["in.png"]}), 16, image_root=root)[0],
                          read_grayscale(png, 16))  # relative to the root  # fmt: skip
    for named in ("../x.png", str(png), "link.png"):
        with pytest.raises(RequestError, match=r"row 0, column 'image': .* outside the server's image root"):
            decode_request(pd.DataFrame({"image": [named]}), 16, image_root=root)


def test_serving_uses_the_runs_resize_mode(tmp_path):
    """A model trained on padded radiographs is served padded ones, by path and by bytes alike."""
    wide = np.tile(np.linspace(0, 255, 80), (40, 1)).astype(np.uint8)  # 2:1, so pad and stretch differ
    path = tmp_path / "wide.png"
    cv2.imwrite(str(path), wide)
    encoded = base64.b64encode(path.read_bytes()).decode()
    frame = pd.DataFrame({"image": [str(path), None], "image_b64": [None, encoded]})
    padded = decode_request(frame, 32, "pad", tmp_path)
    expected = read_grayscale(path, 32, "pad")
    assert np.array_equal(padded[0], expected) and np.array_equal(padded[1], expected)
    assert (expected[:8] == 0).all()  # the black band the model saw in training
    assert not np.array_equal(decode_request(frame, 32, "stretch", tmp_path)[0], expected)


def test_registered_spec_round_trip_keeps_geometry_thresholds_and_outputs():
    """The served model is rebuilt from spec.json + weights alone: same resize mode, thresholds and outputs."""
    import torch

    from training.models.factory import build_model
    from training.runs import FinishedModel

    torch.manual_seed(0)
    model_cfg = {"backbone": "resnet18", "pretrained": False, "lr": 1e-3, "weight_decay": 0.0}
    network = build_model(model_cfg, {"_target_": "training.losses.bce.BCELoss"}, ["Mass", "Nodule"]).eval()
    finished = FinishedModel(
        network, ["Mass", "Nodule"], image_size=32, resize="pad", thresholds=[0.2, 0.7], run_id="r"
    )
    rebuilt = FinishedModel.from_spec(finished.spec(), network.state_dict())
    assert (rebuilt.resize, rebuilt.image_size, rebuilt.thresholds, rebuilt.labels) == (
        "pad",
        32,
        [0.2, 0.7],
        ["Mass", "Nodule"],
    )
    assert rebuilt.network.hparams["model_cfg"]["pretrained"] is False  # never a download when serving
    images = torch.randn(2, 1, 32, 32)
    with torch.no_grad():
        assert torch.equal(rebuilt.scoring_network(images), finished.scoring_network(images))


def test_an_answer_names_no_path_of_the_server(png, tmp_path):
    """Bytes are decoded through a temporary file and paths resolved under the root: neither reaches the client."""
    cut = base64.b64encode(png.read_bytes()[:60]).decode()
    with pytest.raises(RequestError) as sent:
        decode_request(pd.DataFrame({"image_b64": [cut]}), 32)
    assert "the image sent" in str(sent.value) and "/tmp" not in str(sent.value)
    (tmp_path / "bad.png").write_bytes(b"\x89PNG\r\n\x1a\n")
    with pytest.raises(RequestError) as named:
        decode_request(pd.DataFrame({"image": ["bad.png"]}), 32, image_root=tmp_path)
    assert str(tmp_path) not in str(named.value) and "bad.png" in str(named.value)
    with pytest.raises(RequestError, match=r"outside the server's image root$"):
        decode_request(pd.DataFrame({"image": ["../x.png"]}), 32, image_root=tmp_path)
