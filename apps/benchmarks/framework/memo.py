"""A disk memo for what a protocol fits on a model's outputs: the same inputs give the same arrays back.

The embedding cache keeps what the model says about the images; a protocol then fits heads on those outputs
(CheXTemporal's out-of-fold logistic heads take longer than encoding at a small image size). Those fits are
deterministic functions of their inputs, so :func:`memo_arrays` keeps their result beside the embeddings, keyed
by a hash of every input (arrays by dtype, shape and bytes), and a rerun of the benchmark or the card reads it.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np


def memo_key(name: str, parts: Sequence[object]) -> str:
    """``<name>-<24 hex>``: a hash of ``parts`` (numpy arrays by content, anything else as JSON)."""
    digest = hashlib.sha256(name.encode())
    for part in parts:
        if isinstance(part, np.ndarray):
            array = np.ascontiguousarray(part)
            digest.update(f"|array {array.dtype.str} {array.shape}|".encode())
            digest.update(array.astype(str).tobytes() if array.dtype == object else array.tobytes())
        else:
            digest.update(f"|{json.dumps(part, sort_keys=True)}".encode())
    return f"{name}-{digest.hexdigest()[:24]}"


def memo_arrays(cache_dir: str | Path | None, name: str, parts: Sequence[object],
                compute: Callable[[], dict[str, np.ndarray]]) -> dict[str, np.ndarray]:  # fmt: skip
    """``compute()``, or what it returned for the same ``parts`` before (``cache_dir`` ``None``: always computed).

    The arrays must not need pickling (numbers, booleans, text), so an entry is read with ``allow_pickle=False``;
    entries are written atomically, as the embedding cache's are.
    """
    path = None if cache_dir is None else Path(cache_dir) / f"{memo_key(name, parts)}.npz"
    if path is not None and path.is_file():
        with np.load(path, allow_pickle=False) as stored:
            return {key: stored[key] for key in stored.files}
    arrays = {key: np.asarray(value) for key, value in compute().items()}
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.stem}.tmp{os.getpid()}.npz")
        np.savez(tmp, **arrays)
        os.replace(tmp, path)
    return arrays
