"""Shared fixtures: tiny manifests with real PNG files, paths to the shared real data, and test servers' lifecycle."""

from __future__ import annotations

import contextlib
import http.client
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import cv2
import numpy as np
import pandas as pd
import psutil
import pytest

from tests.process_budget import wait_working
from training.data.findings import CXRLT_FINDINGS, TASK1_LABELS

PROJECT_ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = PROJECT_ROOT.parent / "shared" / "data"

if "PYTEST_XDIST_WORKER" in os.environ:  # workers share the cores: one torch thread each, their subprocesses too
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch

    torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def no_tracking_uri_left_behind():
    """``mlflow.set_tracking_uri`` (``make register``'s code calls it) holds the URI in-process and also writes it to
    MLFLOW_TRACKING_URI, which every later subprocess inherits: unset, a test would write to the store of whichever
    test ran before it in the same worker."""
    outer = os.environ.get("MLFLOW_TRACKING_URI")
    yield
    if "mlflow" in sys.modules:
        import mlflow

        mlflow.set_tracking_uri(None)
    if outer is None:
        os.environ.pop("MLFLOW_TRACKING_URI", None)
    else:
        os.environ["MLFLOW_TRACKING_URI"] = outer


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


@pytest.fixture(scope="session")
def empty_store(tmp_path_factory) -> Path:
    """An MLflow SQLite store with its tables created, as a command's first contact leaves it: copied, it spares each
    test's first command the schema migrations (over a second of CPU). Tests of that first contact use their own."""
    from mlflow import MlflowClient

    path = tmp_path_factory.mktemp("empty-store") / "mlflow.db"
    MlflowClient(f"sqlite:///{path}").search_experiments()
    return path


@pytest.fixture
def run_env(tmp_path, empty_store):
    """Environment for a training subprocess whose MLflow store lives in ``tmp_path`` (a copy of ``empty_store``)."""
    shutil.copyfile(empty_store, tmp_path / "mlflow.db")
    env = dict(os.environ)
    env["MLFLOW_TRACKING_URI"] = f"sqlite:///{tmp_path}/mlflow.db"
    env["PYTHONUNBUFFERED"] = "1"
    return env


@pytest.fixture(scope="session")
def smoke_data(tmp_path_factory):
    """``(root, manifest)``: one parent folder of generated sets for every training of the session, holding the
    ``debug=smoke`` set already generated. Each set is keyed by its settings and generated under a lock
    (training/data/sources.py), so a training passed ``data.source.root=<root>`` reuses it instead of paying the
    generation again; one with other sizes adds a set of its own beside it."""
    from hydra import compose, initialize_config_dir
    from hydra.utils import instantiate

    from training.config_files import CONFIGS

    root = tmp_path_factory.mktemp("synthetic")
    with initialize_config_dir(config_dir=str(CONFIGS), version_base=None):
        cfg = compose("train", overrides=["debug=smoke", f"data.source.root={root}"])
    return root, Path(instantiate(cfg.data.source).prepare())


def train_command(tmp_path: Path, *overrides: str) -> list[str]:
    """``python -m training.train`` with every output (store, artifacts, checkpoints) under ``tmp_path``."""
    return [
        sys.executable, "-m", "training.train",
        f"tracking.artifact_root={tmp_path}/artifacts", f"tracking.checkpoint_root={tmp_path}/checkpoints",
        *overrides,
    ]  # fmt: skip


#: A task1 run on a ``make_manifest`` manifest at the smallest size that still trains a backbone end to end: what the
#: tests of a model option (a head, a checkpoint rule) add their overrides to.
TINY_MANIFEST_RUN = (
    "data=manifest", "data.image_size=32", "data.batch_size=8", "model=resnet18", "model.backbone=resnet10t",
    "trainer.enable_progress_bar=false", "tta.enabled=false", "evaluation.perturbation.enabled=false",
    "evaluation.heldout.enabled=false", "evaluation.n_boot=20", "tracking.system_metrics.enabled=false",
)  # fmt: skip


def train_tiny_manifest_run(tmp_path: Path, manifest: Path, env: dict, *overrides: str):
    """Train ``TINY_MANIFEST_RUN`` plus ``overrides`` on ``manifest`` into ``env``'s store; returns ``(client, run)``."""
    from mlflow import MlflowClient

    done = subprocess.run(
        train_command(tmp_path, *TINY_MANIFEST_RUN, f"data.source.manifest={manifest}", *overrides),
        env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    client = MlflowClient(env["MLFLOW_TRACKING_URI"])
    (run,) = client.search_runs([client.get_experiment_by_name("task1").experiment_id])
    return client, run


@pytest.fixture(scope="session")
def smoke_champion(tmp_path_factory, smoke_data):
    """``(env, client, run)``: a task1 smoke run (no TTA, perturbation or plots) registered as
    ``cxrlt-task1@champion`` in a store of its own, trained once per session for the benchmark and card CLI tests.

    They share the store, so neither reads what the other writes: each logs runs of its own model reference or
    experiment name and reads only those, and only the card writes to the run (``card/``) and the version.
    """
    from mlflow import MlflowClient

    tmp = tmp_path_factory.mktemp("champion")
    env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{tmp}/mlflow.db", "PYTHONUNBUFFERED": "1"}
    log = tmp / "train.log"
    with log.open("w") as sink:  # a file, not a pipe: a pipe nobody reads fills up and stalls the training
        trained = subprocess.Popen(
            train_command(tmp, "debug=smoke", f"data.source.root={smoke_data[0]}", "tta.enabled=false",
                          "evaluation.perturbation.enabled=false", "evaluation.plots=false",
                          "trainer.enable_progress_bar=false"),
            env=env, stdout=sink, stderr=subprocess.STDOUT, cwd=PROJECT_ROOT,
        )  # fmt: skip
    wait_working(trained, "the smoke champion's training", cpu_seconds=900)  # a busy session slows it, no more
    assert trained.returncode == 0, log.read_text()[-3000:]
    client = MlflowClient(env["MLFLOW_TRACKING_URI"])
    (run,) = client.search_runs([client.get_experiment_by_name("task1").experiment_id])
    client.create_registered_model("cxrlt-task1")
    version = client.create_model_version("cxrlt-task1", f"runs:/{run.info.run_id}/model", run.info.run_id)
    client.set_registered_model_alias("cxrlt-task1", "champion", version.version)
    return env, client, run


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
    deadline = time.monotonic() + timeout
    while True:
        try:
            urllib.request.urlopen(url, timeout=5)
            return
        except (OSError, http.client.HTTPException):  # refused, reset, half-started server, timeout
            if time.monotonic() > deadline or server.poll() is not None:
                pytest.fail(f"{what} did not come up within {timeout:.0f}s: {_pending_output(server.stderr)}")
            time.sleep(0.5)


def _pending_output(stream) -> str:
    """What a piped stream holds now, without blocking: a live server (or a child of a dead one that inherited
    the pipe) would keep a plain ``read()`` waiting for an end of file forever."""
    if stream is None:
        return ""
    os.set_blocking(stream.fileno(), False)
    try:
        return (stream.read() or b"").decode(errors="replace")[-3000:]
    except OSError:
        return ""


def stop_process_group(process: subprocess.Popen, grace: float = 20.0, kill_wait: float = 30.0) -> None:
    """Stop ``process`` (started with ``start_new_session=True``), its process group and any other descendant.

    A SIGTERM to the leader alone is not enough: ``mlflow ui``/``server`` forwards it to uvicorn and waits for a
    graceful shutdown, and MLflow 3 also runs job-consumer processes; on a loaded machine that takes longer than a
    test can wait, and a worker left behind keeps its port and CPU. So every process of the group gets SIGTERM,
    and whatever is left after ``grace`` seconds gets SIGKILL. A process that has exited but is not yet reaped
    (a zombie) counts as stopped. Calling it again, or on a process that already ended, is harmless.

    Raises:
        RuntimeError: something survived SIGKILL for ``kill_wait`` seconds (named, so the leak can be found).
    """
    pgid = process.pid  # the leader of a new session leads its process group: the group id is its pid
    with contextlib.suppress(ProcessLookupError):
        if os.getpgid(process.pid) != pgid:
            raise ValueError(f"process {process.pid} is not a group leader: start it with start_new_session=True")
    try:
        leader = psutil.Process(process.pid)
        descendants = leader.children(recursive=True)  # including any that started sessions of their own
    except psutil.NoSuchProcess:
        descendants = []
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, kill_wait)):
        _signal_all(pgid, descendants, sig)
        survivors = _await_stopped(process, pgid, descendants, wait)
        if not survivors:
            return
    raise RuntimeError(f"still running after SIGKILL: {survivors}")


def _signal_all(pgid: int, descendants: list[psutil.Process], sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):  # the group is already empty
        os.killpg(pgid, sig)
    for child in descendants:  # also those outside the group; psutil checks it is still the same process
        with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
            child.send_signal(sig)


def _await_stopped(process: subprocess.Popen, pgid: int, descendants: list[psutil.Process], timeout: float) -> list:
    """Poll until the leader is reaped and nothing of the group or the descendants runs; returns what still runs."""
    deadline = time.monotonic() + timeout
    while True:
        survivors = {p.pid: p for p in [*_group_members(pgid), *descendants] if _running(p)}
        leader_done = process.poll() is not None  # reaps the leader, our own child
        if leader_done and not survivors:
            return []
        if time.monotonic() > deadline:
            return [f"{pid} {_name(p)}" for pid, p in survivors.items()] or [f"{process.pid} (leader)"]
        time.sleep(0.2)


def _group_members(pgid: int) -> list[psutil.Process]:
    members = []
    for candidate in psutil.process_iter():
        try:
            if os.getpgid(candidate.pid) == pgid:
                members.append(candidate)
        except (ProcessLookupError, PermissionError):
            continue
    return members


def _running(process: psutil.Process) -> bool:
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _name(process: psutil.Process) -> str:
    try:
        return " ".join(process.cmdline())[:200]
    except psutil.Error:
        return "?"
