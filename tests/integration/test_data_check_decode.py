"""``make data-check`` judges an image as training does: it decodes every file with training's decoder, so the
files a header check lets through (a DICOM without pixel data, a 16-bit PNG whose pixel data is cut short but
still ends in IEND) are refused by both, on their manifest lines."""

import struct
import subprocess
import zlib
from pathlib import Path

import cv2
import numpy as np
import pandas as pd
import pytest

from tests.conftest import PROJECT_ROOT
from tests.dicom_files import write_dicom
from training.data.images import ImageDecodeError, check_file, read_grayscale
from training.data.row_tasks import progress_lines


def _chunk(kind: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))


def cut_png16(path: Path) -> Path:
    """A valid 16-bit PNG rebuilt with half of its compressed pixels, every chunk's length and CRC right."""
    data = cv2.imencode(".png", np.random.default_rng(0).integers(0, 65535, (64, 64), dtype=np.uint16))[1].tobytes()
    chunks, pos = [], 8
    while pos < len(data):
        (size,) = struct.unpack(">I", data[pos : pos + 4])
        chunks.append((data[pos + 4 : pos + 8], data[pos + 8 : pos + 8 + size]))
        pos += 12 + size
    pixels = b"".join(body for kind, body in chunks if kind == b"IDAT")
    head = b"".join(_chunk(kind, body) for kind, body in chunks if kind not in (b"IDAT", b"IEND"))
    path.write_bytes(data[:8] + head + _chunk(b"IDAT", pixels[: len(pixels) // 2]) + _chunk(b"IEND", b""))
    return path


@pytest.mark.e2e  # the command as typed: make test-e2e
def test_make_data_check_refuses_what_training_refuses(make_manifest, tmp_path, run_env):
    manifest = make_manifest(n=12)
    cut_png16(tmp_path / "images" / "1.png")
    table = pd.read_csv(manifest)
    table.loc[2, "path"] = "images/no-pixels.dcm"
    write_dicom(tmp_path / "images" / "no-pixels.dcm", np.zeros((32, 32), np.uint16), pixel_data=False)
    table.to_csv(manifest, index=False)
    for broken in ("1.png", "no-pixels.dcm"):
        check_file(tmp_path / "images" / broken)  # the header check alone lets both through
        with pytest.raises(ImageDecodeError):
            read_grayscale(tmp_path / "images" / broken, 32)  # training's decoder does not

    done = subprocess.run(["make", "--no-print-directory", "-C", str(PROJECT_ROOT), "data-check", "DATA=manifest",
                           f"ARGS=data.source.manifest={manifest} data.source.root={tmp_path}"],
                          env=run_env, capture_output=True, text=True, timeout=300)  # fmt: skip
    out = done.stdout + done.stderr
    assert done.returncode != 0 and "Traceback" not in out, out[-3000:]
    assert "10 of 12 readable (decoded)" in out
    assert "line 3, column 'path', image 'img1': cannot decode image file" in out
    assert "line 4, column 'path', image 'img2': cannot decode DICOM file" in out


def test_progress_lines_come_once_per_interval_with_rate_and_eta(capsys):
    readings = iter([0.0, 10.0, 31.0, 40.0, 62.0])  # start, then one reading per finished task of rows
    report = progress_lines("decoded", interval_s=30, clock=lambda: next(readings))
    for done in (512, 1024, 1536, 2048):
        report(done, 4096)
    assert capsys.readouterr().err.splitlines() == [
        "files: 1,024 of 4,096 decoded, 33/s, ETA 0:01:33",
        "files: 2,048 of 4,096 decoded, 33/s, ETA 0:01:02",
    ]
