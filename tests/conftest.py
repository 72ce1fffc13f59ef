"""Shared fixtures: tiny manifests with real PNG files, and paths to the shared real data."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import cv2
import numpy as np
import pandas as pd
import pytest

from training.data.findings import CXRLT_FINDINGS, TASK1_LABELS

PROJECT_ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = PROJECT_ROOT.parent / "shared" / "data"


@pytest.fixture
def make_manifest(tmp_path):
    """Factory writing ``n`` random 32x32 PNGs and their manifest; returns the manifest path.

    Every third image goes to val or test; patients are one image each, so splits are patient-disjoint. Labels
    are seeded random with a per-class prevalence, and ``Normal`` is 1 exactly when nothing else is.
    """

    def build(n: int = 30, size: int = 32, seed: int = 0, labels=CXRLT_FINDINGS) -> Path:
        rng = np.random.default_rng(seed)
        (tmp_path / "images").mkdir(exist_ok=True)
        rows = []
        for i in range(n):
            y = (rng.random(len(labels)) < 0.2).astype(int)
            if "Normal" in labels:
                others = [j for j, name in enumerate(labels) if name != "Normal"]
                y[labels.index("Normal")] = int(y[others].sum() == 0)
            cv2.imwrite(str(tmp_path / "images" / f"{i}.png"), rng.integers(0, 255, (size, size), dtype=np.uint8))
            rows.append(
                {"image_id": f"img{i}", "path": f"images/{i}.png", "split": ("train", "val", "test")[i % 3],
                 "patient_id": f"p{i}", "source": "centre_a", "view": "PA", **dict(zip(labels, y, strict=True))}
            )  # fmt: skip
        path = tmp_path / "manifest.csv"
        pd.DataFrame(rows).to_csv(path, index=False)
        return path

    return build


@pytest.fixture
def task1_labels():
    return list(TASK1_LABELS)


@pytest.fixture
def run_env(tmp_path):
    """Environment for a training subprocess whose MLflow store lives in ``tmp_path``."""
    env = dict(os.environ)
    env["MLFLOW_TRACKING_URI"] = f"sqlite:///{tmp_path}/mlflow.db"
    env["PYTHONUNBUFFERED"] = "1"
    return env


def train_command(tmp_path: Path, *overrides: str) -> list[str]:
    """``python -m training.train`` with every output (store, artifacts, checkpoints) under ``tmp_path``."""
    return [
        sys.executable, "-m", "training.train",
        f"tracking.artifact_root={tmp_path}/artifacts", f"tracking.checkpoint_root={tmp_path}/checkpoints",
        *overrides,
    ]  # fmt: skip


def shared_data(name: str) -> Path:
    """A folder of ../shared/data, skipping the test when it is absent (the suite passes on any machine)."""
    path = SHARED_DATA / name
    if not path.is_dir():
        pytest.skip(f"real data not available: {path}")
    return path


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free right now (for a test server)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_for_http(url: str, server: subprocess.Popen, timeout: float, what: str) -> None:
    """Poll ``url`` until it answers; fail the test (with the server's stderr, if piped) if it dies or times out."""
    deadline = time.time() + timeout
    while True:
        try:
            urllib.request.urlopen(url, timeout=2)
            return
        except OSError:
            if time.time() > deadline or server.poll() is not None:
                stderr = server.stderr.read().decode()[-3000:] if server.stderr else ""
                pytest.fail(f"{what} did not come up: {stderr}")
            time.sleep(0.5)
