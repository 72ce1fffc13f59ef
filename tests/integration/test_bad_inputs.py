"""Bad images, DICOMs, labels, ids and paths (issue 30, points 10-13): each ends as one named message, before any
training starts, with no run left behind; a decompression bomb is refused before it is allocated.

The inputs are generated here. Each kind is checked on the functions every command shares (decoding, the
header check of ``make data-check`` and lazy loading, the manifest validation), and a few end to end through
``python -m training.train`` and ``python -m training.data_check``, the commands ``make train`` and
``make data-check`` run.
"""

from __future__ import annotations

import functools
import re
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import cv2
import numpy as np
import pandas as pd
import pytest
import torch
from mlflow import MlflowClient

from tests.conftest import PROJECT_ROOT, train_command
from tests.dicom_files import write_dicom
from training.data.dataset import ManifestDataset
from training.data.findings import KNOWN_FINDINGS, TASK1_LABELS
from training.data.images import ImageDecodeError, check_file, read_grayscale
from training.data.manifest import ManifestError, load_manifest
from training.errors import UserError

#: Peak resident memory allowed to a command that meets a decompression bomb (issue 30, 11): 1 GiB for
#: ``make data-check``; for training, its own footprint (about 1.1 GiB of libraries before any image is read)
#: plus less than the bomb's 800 MB pixel buffer, which decoding it would allocate first (8.8 GiB before the fix).
MEMORY_CEILING_MIB, TRAINING_CEILING_MIB = 1024, 1536


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)


def bomb_png(path: Path, width: int = 20000, height: int = 20000, depth: int = 16) -> Path:
    """A valid grayscale PNG of zeros: under 1 MB on disk, 800 MB once decoded at 16 bits (and several GB on the
    way to uint8: the 8.8 GB peak measured before the fix)."""
    path.write_bytes(_bomb_bytes(width, height, depth))
    return path


def bomb_jpeg(path: Path) -> Path:
    """A 32 x 32 JPEG whose frame header (SOF0) is rewritten to declare 60000 x 60000."""
    data = bytearray(_jpeg(path))
    at = data.index(b"\xff\xc0") + 5  # marker, length (2), precision (1), then height and width
    data[at : at + 4] = struct.pack(">HH", 60000, 60000)
    path.write_bytes(bytes(data))
    return path


@functools.cache
def _bomb_bytes(width: int, height: int, depth: int) -> bytes:
    row = b"\x00" * (1 + depth // 8 * width)  # filter byte + the pixels
    packer = zlib.compressobj(9)
    block = row * 64
    data = b"".join([packer.compress(block) for _ in range(height // 64)] + [packer.compress(row * (height % 64))])
    header = struct.pack(">IIBBBBB", width, height, depth, 0, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", header) + _chunk(b"IDAT", data + packer.flush())
            + _chunk(b"IEND", b""))  # fmt: skip


def _png(path: Path) -> bytes:
    cv2.imwrite(str(path), np.random.default_rng(0).integers(0, 255, (32, 32), dtype=np.uint8))
    return path.read_bytes()


def _jpeg(path: Path) -> bytes:
    cv2.imwrite(str(path), np.random.default_rng(0).integers(0, 255, (32, 32), dtype=np.uint8))
    return path.read_bytes()


def _corrupt_idat(path: Path) -> None:
    """A PNG whose compressed pixels are garbage while its header and end marker are intact: only decoding sees it."""
    data = bytearray(_png(path))
    start = data.index(b"IDAT") + 4
    data[start : start + 40] = b"\xff" * 40
    path.write_bytes(bytes(data))


def _dicom(path: Path, **kwargs) -> Path:
    return write_dicom(path, np.arange(32 * 32, dtype=np.uint16).reshape(32, 32) % 4096, **kwargs)


def _edit_dicom(path: Path, change) -> None:
    import pydicom

    _dicom(path)
    dataset = pydicom.dcmread(str(path))
    change(dataset)
    dataset.save_as(path)


def _jpeg_syntax(dataset) -> None:
    from pydicom.encaps import encapsulate
    from pydicom.uid import JPEGBaseline8Bit

    dataset.file_meta.TransferSyntaxUID = JPEGBaseline8Bit  # says JPEG, holds a frame that is not one
    dataset.PixelData = encapsulate([b"\xff\xd8\xff\xdb not a JPEG frame \xff\xd9"])
    dataset["PixelData"].VR = "OB"


#: name -> (writer, a fragment of the message); every writer makes one broken file at the given path.
BROKEN = {
    "zero-byte.png": (lambda p: p.write_bytes(b""), "empty image file"),
    "truncated.png": (lambda p: p.write_bytes(_png(p)[:200]), "truncated PNG (no IEND chunk)"),
    "text.png": (lambda p: p.write_text("not an image\n"), "not a recognised image format"),
    "header-only.png": (lambda p: p.write_bytes(_png(p)[:33]), "truncated PNG"),
    "truncated.jpg": (lambda p: p.write_bytes(_jpeg(p)[:300]), "truncated JPEG"),
    "corrupt-pixels.png": (_corrupt_idat, "cannot decode image file"),
    "bomb.png": (bomb_png, "declares a 20000 x 20000 canvas (400,000,000 pixels), above the limit of 100,000,000"),
    "bomb-8bit.png": (lambda p: bomb_png(p, depth=8), "declares a 20000 x 20000 canvas"),
    "bomb.jpg": (bomb_jpeg, "declares a 60000 x 60000 canvas"),
    "zero-byte.dcm": (lambda p: p.write_bytes(b""), "cannot decode DICOM file"),
    "text.dcm": (lambda p: p.write_text("not a dicom\n" * 20), "cannot decode DICOM file"),
    "no-pixels.dcm": (lambda p: _dicom(p, pixel_data=False), "cannot decode DICOM file"),
    "truncated.dcm": (lambda p: p.write_bytes(_dicom(p).read_bytes()[:-700]), "cannot decode DICOM file"),
    "no-rows.dcm": (lambda p: _edit_dicom(p, lambda d: delattr(d, "Rows")), "cannot decode DICOM file"),
    "wrong-bits.dcm": (lambda p: _edit_dicom(p, lambda d: setattr(d, "BitsAllocated", 32)), "cannot decode DICOM"),
    "no-bits-stored.dcm": (
        lambda p: _edit_dicom(
            p, lambda d: (setattr(d, "WindowCenter", 100), setattr(d, "WindowWidth", 50), delattr(d, "BitsStored"))
        ),
        "cannot decode DICOM",
    ),  # fmt: skip
    "fake-jpeg.dcm": (lambda p: _edit_dicom(p, _jpeg_syntax), "cannot decode DICOM file"),
    "bomb.dcm": (
        lambda p: _edit_dicom(p, lambda d: (setattr(d, "Rows", 60000), setattr(d, "Columns", 60000))),
        "declares a 60000 x 60000 canvas",
    ),  # fmt: skip
}


@pytest.mark.parametrize("name", sorted(BROKEN))
def test_every_broken_file_is_one_named_user_error(tmp_path, name):
    """Decoding (training, the cache, serving) raises the one user error naming the file and the reason."""
    writer, reason = BROKEN[name]
    path = tmp_path / name
    writer(path)
    with pytest.raises(ImageDecodeError) as raised:
        read_grayscale(path, 32)
    assert isinstance(raised.value, UserError) and reason in str(raised.value) and str(path) in str(raised.value)


@pytest.mark.parametrize("name", ["zero-byte.png", "truncated.png", "text.png", "bomb.png", "bomb.jpg", "bomb.dcm"])
def test_the_header_check_names_what_decoding_would(tmp_path, name):
    """``make data-check`` and lazy loading read a few KB per file and refuse these with decoding's own reason."""
    writer, reason = BROKEN[name]
    path = tmp_path / name
    writer(path)
    with pytest.raises(ImageDecodeError, match=re.escape(reason)):
        check_file(path)


def test_the_pixel_limit_is_a_setting(tmp_path):
    path = tmp_path / "a.png"
    _png(path)
    assert read_grayscale(path, 16, max_pixels=32 * 32).shape == (16, 16)
    with pytest.raises(ImageDecodeError, match=r"32 x 32 canvas \(1,024 pixels\), above the limit of 1,023"):
        read_grayscale(path, 16, max_pixels=32 * 32 - 1)
    with pytest.raises(ImageDecodeError, match="above the limit of 1,023"):
        read_grayscale(_dicom(tmp_path / "a.dcm"), 16, max_pixels=32 * 32 - 1)


def _dataset(root: Path, names, preload: bool, max_pixels=10**8) -> ManifestDataset:
    from training.data.transforms import build_transform

    return ManifestDataset(root, names, np.zeros((len(names), 1)), [f"img{i}" for i in range(len(names))], 32,
                           build_transform(None), preload=preload, max_pixels=max_pixels)  # fmt: skip


@pytest.mark.parametrize("preload", [True, False])
def test_a_dataset_refuses_a_bomb_before_training_in_either_mode(tmp_path, preload):
    _png(tmp_path / "good.png")
    bomb_png(tmp_path / "bomb.png")
    with pytest.raises(ImageDecodeError, match=r"1 of 2 images cannot be read .*\n  image 'img1': declares a 20000"):
        _dataset(tmp_path, ["good.png", "bomb.png"], preload)


def test_a_loader_worker_applies_the_limit_and_its_error_stays_one_line(tmp_path):
    """Lazily loaded images are decoded in the workers: the limit travels with the dataset, and the error PyTorch
    re-raises in the training process is the worker's message, not its traceback."""
    for name in ("a.png", "b.png"):
        _png(tmp_path / name)
    dataset = _dataset(tmp_path, ["a.png", "b.png"], preload=False, max_pixels=32 * 32)
    bomb_png(tmp_path / "b.png", 40, 40)  # replaced after the up-front check, as a file changed mid-run would be
    loader = torch.utils.data.DataLoader(dataset, batch_size=1, num_workers=1)
    with pytest.raises(ImageDecodeError) as raised:
        list(loader)
    assert str(raised.value) == (f"declares a 40 x 40 canvas (1,600 pixels), above the limit of 1,024 "
                                 f"(data.max_pixels); not decoded: {tmp_path / 'b.png'}")  # fmt: skip


def _manifest(root: Path, n: int = 12, **rows) -> Path:
    """``n`` good 32-px PNGs under ``root/images`` and their manifest; ``rows`` overrides cells: {column: {row: value}}."""
    (root / "images").mkdir(parents=True, exist_ok=True)
    labels = list(TASK1_LABELS)
    table = pd.DataFrame({"image_id": [f"img{i}" for i in range(n)], "path": [f"images/{i}.png" for i in range(n)],
                          "split": [("train", "val", "test")[i % 3] for i in range(n)],
                          "patient_id": [f"p{i}" for i in range(n)], **{c: ["0"] * n for c in labels}})  # fmt: skip
    for i in range(n):
        _png(root / "images" / f"{i}.png")
    for column, cells in rows.items():
        for row, value in cells.items():
            table.loc[row, column] = value
    table.to_csv(root / "manifest.csv", index=False)
    return root / "manifest.csv"


def test_paths_leaving_the_data_root_are_refused_unless_allowed(tmp_path):
    """Issue 30 (13): ``..`` and absolute paths outside the root are refused by line; the opt-out reads them."""
    secret = tmp_path / "elsewhere" / "secret.png"
    secret.parent.mkdir()
    _png(secret)
    root = tmp_path / "data"
    inside = str(root / "images" / "2.png")
    path = _manifest(root, path={0: "../elsewhere/secret.png", 1: str(secret), 2: inside, 4: "images/../images/4.png"})
    with pytest.raises(ManifestError) as raised:
        load_manifest(path, ["Nodule"], KNOWN_FINDINGS, root=root, image_roots=(root,))
    message = str(raised.value)
    assert "3 problem(s)" in message
    for line, value in ((2, "../elsewhere/secret.png"), (3, str(secret)), (6, "images/../images/4.png")):
        assert f"line {line}, column 'path': {value!r} leaves the data root {root}" in message
    assert "line 4" not in message  # an absolute path inside the root is fine
    assert len(load_manifest(path, ["Nodule"], KNOWN_FINDINGS, root=root, image_roots=None).table) == 12


def test_a_symlink_inside_the_data_root_is_followed(tmp_path):
    target = tmp_path / "disk2" / "x.png"
    target.parent.mkdir()
    _png(target)
    root = tmp_path / "data"
    path = _manifest(root, path={0: "images/linked.png"})
    (root / "images" / "linked.png").symlink_to(target)
    manifest = load_manifest(path, ["Nodule"], KNOWN_FINDINGS, root=root, image_roots=(root,))
    assert manifest.table.at[0, "path"] == "images/linked.png"


def _no_runs(env: dict) -> bool:
    client = MlflowClient(env["MLFLOW_TRACKING_URI"])
    experiment = client.get_experiment_by_name("task1")
    return experiment is None or not client.search_runs([experiment.experiment_id])


def _peak_memory_run(command: list[str], env: dict) -> tuple[subprocess.CompletedProcess, int]:
    """Run ``command`` under a fresh Python whose only child it is; returns it with its peak RSS in MiB (the
    largest of the process and its loader workers: ``RUSAGE_CHILDREN``'s ``ru_maxrss`` is in KiB on Linux)."""
    probe = ("import resource, subprocess, sys; done = subprocess.run(sys.argv[1:]); "
             "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss // 1024); sys.exit(done.returncode)")  # fmt: skip
    done = subprocess.run([sys.executable, "-c", probe, *command], env=env, capture_output=True, text=True,
                          timeout=180, cwd=PROJECT_ROOT)  # fmt: skip
    return done, int(done.stdout.strip().splitlines()[-1])


@pytest.mark.e2e
@pytest.mark.parametrize(("name", "preload"), [("zero-byte.png", "true"), ("bomb.png", "false"),
                                               pytest.param("no-pixels.dcm", "true", marks=pytest.mark.slow)])  # fmt: skip
def test_training_ends_a_bad_image_in_one_named_message_and_no_run(tmp_path, run_env, name, preload):
    """``make train ARGS="data=manifest ..."``: exit 1, the file and reason, no traceback, no run; a bomb is refused
    before it is allocated (preloading: the dataset tests above; here lazily, with loader workers)."""
    root = tmp_path / "data"
    path = _manifest(root, path={4: f"images/{name}"})
    BROKEN[name][0](root / "images" / name)
    command = train_command(tmp_path, "data=manifest", f"data.source.manifest={path}", "data.image_size=32",
                            f"data.preload={preload}", "data.num_workers=1", "data.cache=false")  # fmt: skip
    done, peak = _peak_memory_run(command, run_env)
    assert done.returncode == 1, done.stderr[-3000:]
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    assert f"image 'img4': {BROKEN[name][1]}" in done.stderr and str(root / "images" / name) in done.stderr
    assert peak < TRAINING_CEILING_MIB, f"peak RSS {peak} MiB"
    assert _no_runs(run_env)


@pytest.mark.e2e
def test_data_check_reports_each_bad_input_by_line(tmp_path, run_env):
    """``make data-check``: the same refusals as training, each on its manifest line, exit 1, no traceback."""
    root = tmp_path / "data"
    path = _manifest(root, path={1: "images/bomb.png", 2: "../../etc/hostname", 3: "images/empty.png"},
                     Nodule={4: "Yes "}, image_id={5: "img0 "})  # fmt: skip
    bomb_png(root / "images" / "bomb.png")
    (root / "images" / "empty.png").write_bytes(b"")
    done, peak = _peak_memory_run([sys.executable, "-m", "training.data_check", "data=manifest",
                                   f"data.source.manifest={path}", f"data.source.root={root}"], run_env)  # fmt: skip
    out = done.stdout + done.stderr
    assert done.returncode == 1, out[-3000:]
    assert "Traceback" not in out, out[-3000:]
    for expected in (
        "line 3, column 'path', image 'img1': declares a 20000 x 20000 canvas",
        "line 4, column 'path': '../../etc/hostname' leaves the data root",
        "line 5, column 'path', image 'img3': empty image file",
        "line 6, column 'Nodule': 'Yes ' is not a manifest label",
        "column 'image_id': 'img0' duplicated on lines [2, 7]",
    ):
        assert expected in out, out[-3000:]
    assert peak < MEMORY_CEILING_MIB, f"peak RSS {peak} MiB"
