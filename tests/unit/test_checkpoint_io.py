"""Checkpoint IO: a kill mid-write leaves the previous checkpoint usable; pickled code is never run on load."""

from __future__ import annotations

import hashlib
import os
import signal
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import lightning.pytorch as L
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from tests.conftest import PROJECT_ROOT
from training.checkpoint_io import TEMP_SUFFIX, AtomicCheckpointIO, UnsafeCheckpoint, is_local_path

STEPS_PER_EPOCH = 4


class Tiny(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = nn.Linear(3, 1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.mse_loss(self.layer(x), y)

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=0.01)

    def train_dataloader(self):
        generator = torch.Generator().manual_seed(0)
        x = torch.randn(8 * STEPS_PER_EPOCH, 3, generator=generator)
        return DataLoader(TensorDataset(x, x.sum(dim=1, keepdim=True)), batch_size=8)


def _fit(folder: Path, epochs: int, ckpt_path: Path | None = None) -> L.Trainer:
    trainer = L.Trainer(
        max_epochs=epochs, accelerator="cpu", logger=False, enable_progress_bar=False, enable_model_summary=False,
        callbacks=[ModelCheckpoint(dirpath=folder, save_last=True, save_top_k=0)], plugins=[AtomicCheckpointIO()],
    )  # fmt: skip
    trainer.fit(Tiny(), ckpt_path=ckpt_path)
    return trainer


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# Runs in a child process: AtomicCheckpointIO saving a new checkpoint over `last.ckpt`, with torch.save made slow
# (half the bytes, flushed, then a pause) so the parent can SIGKILL it mid-write.
SLOW_SAVE = textwrap.dedent(
    """
    import io, sys, time
    from pathlib import Path
    import torch
    from training.checkpoint_io import AtomicCheckpointIO

    target, started = Path(sys.argv[1]), Path(sys.argv[2])
    real_save = torch.save

    def slow_save(obj, stream):
        buffer = io.BytesIO()
        real_save(obj, buffer)
        data = buffer.getvalue()
        stream.write(data[: len(data) // 2])
        stream.flush()
        started.touch()
        time.sleep(120)
        stream.write(data[len(data) // 2 :])

    torch.save = slow_save
    AtomicCheckpointIO().save_checkpoint({"state_dict": {"w": torch.ones(256, 256)}, "epoch": 99}, target)
    """
)


def test_a_kill_during_the_write_leaves_the_previous_checkpoint_and_resume_works(tmp_path):
    folder = tmp_path / "checkpoints"
    _fit(folder, epochs=1)
    last = folder / "last.ckpt"
    before, epoch_before = _digest(last), AtomicCheckpointIO().load_checkpoint(last)["epoch"]

    started = tmp_path / "started"
    writer = subprocess.Popen([sys.executable, "-c", SLOW_SAVE, str(last), str(started)], cwd=PROJECT_ROOT,
                              env={**os.environ, "PYTHONPATH": str(PROJECT_ROOT)}, stderr=subprocess.PIPE)  # fmt: skip
    deadline = time.monotonic() + 120
    while not started.exists():
        assert writer.poll() is None, writer.stderr.read().decode()[-3000:]
        assert time.monotonic() < deadline, "the writer never started writing"
        time.sleep(0.05)
    writer.send_signal(signal.SIGKILL)
    writer.wait()

    (partial,) = folder.glob(f".last.ckpt.*{TEMP_SUFFIX}")  # the interrupted write went to a temporary file
    assert partial.stat().st_size > 0
    with pytest.raises(Exception):  # noqa: B017 - a torn file fails in torch's zip reader, whatever the message
        torch.load(partial, weights_only=True)
    assert _digest(last) == before  # the previous checkpoint, byte for byte
    assert AtomicCheckpointIO().load_checkpoint(last)["epoch"] == epoch_before  # not the killed write's 99

    resumed = _fit(folder, epochs=2, ckpt_path=last)
    assert resumed.current_epoch == 2 and resumed.global_step == 2 * STEPS_PER_EPOCH  # continued, not restarted
    assert AtomicCheckpointIO().load_checkpoint(last)["epoch"] > epoch_before


def test_save_replaces_the_file_and_leaves_no_temporary(tmp_path):
    target = tmp_path / "deeper" / "last.ckpt"
    io = AtomicCheckpointIO()
    io.save_checkpoint({"epoch": 1, "state_dict": {"w": torch.zeros(2)}}, target)
    io.save_checkpoint({"epoch": 2, "state_dict": {"w": torch.ones(2)}}, target)
    loaded = io.load_checkpoint(target)
    assert loaded["epoch"] == 2 and torch.equal(loaded["state_dict"]["w"], torch.ones(2))
    assert [p.name for p in target.parent.iterdir()] == ["last.ckpt"]
    plain = tmp_path / "plain"
    plain.write_bytes(b"")
    assert stat.S_IMODE(target.stat().st_mode) == stat.S_IMODE(plain.stat().st_mode)  # not mkstemp's owner-only
    with pytest.raises(TypeError, match="storage_options"):
        io.save_checkpoint({}, target, storage_options={"x": 1})


class RunsCode:
    """Unpickling this calls ``open(marker, "w")``: a stand-in for any code a tampered checkpoint could run."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return open, (str(self.marker), "w")


@pytest.fixture
def tampered(tmp_path):
    marker = tmp_path / "code-ran"
    path = tmp_path / "tampered.ckpt"
    torch.save({"state_dict": {"w": torch.zeros(1)}, "epoch": 0, "payload": RunsCode(marker)}, path)
    return path, marker


def test_a_checkpoint_with_a_pickled_object_is_refused(tampered):
    path, marker = tampered
    with pytest.raises(
        UnsafeCheckpoint, match=rf"checkpoint {path} holds pickled Python objects \(\S+\), not only tensors"
    ):
        AtomicCheckpointIO().load_checkpoint(path)  # one line naming the file and the object, no torch essay
    with pytest.raises(ValueError, match="weights_only=False"):
        AtomicCheckpointIO().load_checkpoint(path, weights_only=False)
    assert not marker.exists()
    torch.load(path, weights_only=False)  # the payload is live: a plain unpickling runs it
    assert marker.exists()


def test_resuming_from_a_tampered_checkpoint_fails_before_running_it(tampered, tmp_path):
    path, marker = tampered
    with pytest.raises(UnsafeCheckpoint, match="refusing to load it"):
        _fit(tmp_path / "checkpoints", epochs=1, ckpt_path=path)  # Lightning's fit(ckpt_path) goes through the plugin
    assert not marker.exists()


@pytest.mark.parametrize(
    "path", ["/runs/last.ckpt", "runs/last.ckpt", "file:///runs/last.ckpt", "s3://bucket/last.ckpt",
             "memory://runs/last.ckpt", "simplecache::s3://bucket/last.ckpt", "C:/runs/last.ckpt"],
)  # fmt: skip
def test_local_paths_are_those_fsspec_reads_as_local(path):
    from fsspec.utils import get_protocol

    assert is_local_path(path) == (get_protocol(path) == "file")


def test_a_remote_path_is_written_by_lightnings_writer(tmp_path, monkeypatch):
    """No atomic rename exists off the local disk: a ``memory://`` checkpoint lands in fsspec's store, and no local
    folder named after the URL is made."""
    import fsspec

    monkeypatch.chdir(tmp_path)
    AtomicCheckpointIO().save_checkpoint({"epoch": 3}, "memory://runs/last.ckpt")
    memory = fsspec.filesystem("memory")
    try:
        assert memory.exists("/runs/last.ckpt")
        assert not any(tmp_path.iterdir())
        assert AtomicCheckpointIO().load_checkpoint("memory://runs/last.ckpt")["epoch"] == 3
    finally:
        memory.rm("/runs", recursive=True)
