"""Checkpoint files that survive a kill mid-write and never unpickle arbitrary objects.

Lightning's ``TorchCheckpointIO`` rewrites ``last.ckpt`` in place every epoch, so a kill during the write leaves
a torn file and the run cannot resume. A temporary file in the same folder, flushed and renamed over the old one,
makes the swap all-or-nothing. Loading is ``weights_only=True`` whatever the caller asks: a checkpoint folder on
shared storage is writable by more people than the code is, and unpickling runs code.
"""

from __future__ import annotations

import logging
import os
import pickle
import random
import re
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch
from lightning.pytorch.plugins.io import TorchCheckpointIO

from training.errors import UserError

log = logging.getLogger(__name__)

TEMP_SUFFIX = ".partial"
#: What torch names in its refusal: ``Unsupported global: GLOBAL os.system was not an allowed global``.
UNSUPPORTED_GLOBAL = re.compile(r"Unsupported global: GLOBAL (\S+)")


class UnsafeCheckpoint(UserError, pickle.UnpicklingError):
    """A checkpoint holds pickled Python objects, not only tensors: loading it would run code, so it is refused."""


def load_weights_only(path, what: str, map_location: Any = "cpu") -> Any:
    """``torch.load(path, weights_only=True)``, with torch's multi-paragraph refusal turned into one line that names
    the file (``what``) and the object it would have had to build; how to load it anyway is deliberately not offered.
    """
    try:
        return torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as error:
        raise refusal(error, what) from error


def refusal(error: pickle.UnpicklingError, what: str) -> UnsafeCheckpoint:
    found = UNSUPPORTED_GLOBAL.search(str(error))
    holds = f" ({found.group(1)})" if found else ""
    return UnsafeCheckpoint(
        f"{what} holds pickled Python objects{holds}, not only tensors; refusing to load it, since unpickling "
        "would run code from the file (platform checkpoints hold tensors and plain containers only)"
    )


def _current_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


# mkstemp creates files readable by their owner only; a checkpoint gets the permissions an ordinary write would
# give it (teammates read checkpoints on shared storage, and MLflow copies the mode into the artifact store).
FILE_MODE = 0o666 & ~_current_umask()


class AtomicCheckpointIO(TorchCheckpointIO):
    """``TorchCheckpointIO`` with write-to-temporary, fsync, rename saves and weights-only loads.

    Remote paths (``s3://`` and other fsspec URLs) have no atomic rename; they fall back to Lightning's writer.
    """

    def save_checkpoint(self, checkpoint: dict[str, Any], path, storage_options: Any | None = None) -> None:
        if storage_options is not None:
            raise TypeError(f"{type(self).__name__} takes no storage_options, got {storage_options!r}")
        if not is_local_path(path):
            super().save_checkpoint(checkpoint, path)
            return
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        # Same folder as the target: os.replace is only atomic within one file system.
        handle, temporary = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=TEMP_SUFFIX)
        try:
            os.chmod(temporary, FILE_MODE)
            with os.fdopen(handle, "wb") as stream:
                torch.save(checkpoint, stream)
                stream.flush()
                os.fsync(stream.fileno())  # the bytes are on disk before the name points at them
            os.replace(temporary, target)
        except BaseException:
            Path(temporary).unlink(missing_ok=True)
            raise
        _fsync_folder(target.parent)  # and the rename itself survives a power cut

    def load_checkpoint(self, path, map_location: Any | None = None, weights_only: bool | None = None) -> dict:
        """Load with ``weights_only=True``; an explicit ``weights_only=False`` is refused rather than obeyed.

        Lightning passes ``weights_only=None``, leaving it to torch's default and an environment variable; the platform
        does not leave it open.
        """
        if weights_only is False:
            raise ValueError(
                f"refusing to unpickle {path} with weights_only=False: platform checkpoints hold tensors and plain "
                "containers only"
            )
        where = {} if map_location is None else {"map_location": map_location}  # None: Lightning's default
        try:
            return super().load_checkpoint(path, weights_only=True, **where)
        except pickle.UnpicklingError as error:
            raise refusal(error, f"checkpoint {path}") from error


def is_local_path(path) -> bool:
    """Whether ``path`` names this machine's file system, read as fsspec reads it (the protocol before the first
    ``://`` or ``::``, ``file`` when there is none), so the same paths take the atomic writer as Lightning would
    treat as local."""
    protocol = re.split(r"://|::", str(path), maxsplit=1)
    return len(protocol) == 1 or protocol[0] == "file"


def _fsync_folder(folder: Path) -> None:
    try:
        descriptor = os.open(folder, os.O_RDONLY)
    except OSError:  # some platforms cannot open a folder; the file itself is already synced
        return
    try:
        os.fsync(descriptor)
    except OSError:
        log.debug("fsync of folder %s not supported", folder)
    finally:
        os.close(descriptor)


def global_rng_state() -> dict[str, Any]:
    """The global random states of torch (CPU and CUDA), numpy and Python, as tensors and plain values.

    Lightning does not checkpoint them, and their native forms (a numpy array in numpy's tuple, Python's tuple of
    625 ints) are not all loadable with ``weights_only=True``; the number arrays become int64 tensors here.
    """
    kind, key, position, has_gauss, gauss = np.random.get_state(legacy=True)
    numpy = {"kind": str(kind), "key": torch.from_numpy(key.astype(np.int64)), "position": int(position)}
    version, internal, gauss_next = random.getstate()
    return {
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        "numpy": {**numpy, "has_gauss": int(has_gauss), "gauss": float(gauss)},
        "python": {"version": int(version), "internal": torch.tensor(internal, dtype=torch.int64), "gauss": gauss_next},
    }


def restore_global_rng_state(state: dict[str, Any]) -> None:
    """Set the global random states saved by :func:`global_rng_state`.

    CUDA states are restored only onto as many devices as were saved; a run resumed on other hardware cannot
    repeat its GPU draws anyway.
    """
    torch.set_rng_state(state["torch"].cpu())
    cuda = state.get("cuda") or []
    if cuda and torch.cuda.is_available() and len(cuda) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all([s.cpu() for s in cuda])
    numpy = state["numpy"]
    key = numpy["key"].cpu().numpy().astype(np.uint32)
    np.random.set_state((numpy["kind"], key, numpy["position"], numpy["has_gauss"], numpy["gauss"]))
    python = state["python"]
    random.setstate((python["version"], tuple(python["internal"].tolist()), python["gauss"]))
