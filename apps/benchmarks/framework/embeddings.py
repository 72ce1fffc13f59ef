"""Encode a subset's images once per model and subset, and keep the result on disk.

Embedding hundreds of radiographs is the slow part of a benchmark; the probe and the bootstrap take seconds. The
outputs are stored as ``<cache_dir>/<key>.npz``, ``key = sha256(model identity | targets | subset fingerprint |
image size | resize mode)[:24]``: the key changes with the weights, any finding's prompts or outputs, and the
images and labels, so a stale entry is never read. Entries are written atomically and checked against the
subset's image ids when read. The cache lives in the git-ignored ``data/cache`` by default, never next to the
(often read-only) images.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pandas as pd

from apps.benchmarks.framework.encoders import Encoded, Encoder, Target
from apps.benchmarks.framework.options import DEFAULT_CACHE_DIR
from training.data.images import read_grayscale

__all__ = ["DEFAULT_CACHE_DIR", "cache_key", "encode_subset", "encode_table", "read_images", "targets_key"]


def targets_key(targets: Sequence[Target]) -> str:
    """Every target's label, prompts and outputs, in column order: what the zero-shot columns answer."""
    return json.dumps([[t.label, t.positive_prompt, t.negative_prompt, list(t.outputs)] for t in targets])


def cache_key(encoder: Encoder, subset_fingerprint: str) -> str:
    """The cache entry name of one model on one subset (see module docstring)."""
    parts = [encoder.identity, targets_key(encoder.targets), subset_fingerprint, str(encoder.image_size)]
    text = "|".join([*parts, encoder.resize])
    return hashlib.sha256(text.encode()).hexdigest()[:24]


def read_images(root: Path, paths: list[str], size: int, resize: str, threads: int = 4) -> np.ndarray:
    """``(N, size, size)`` uint8 images decoded in threads (OpenCV releases the GIL while decoding)."""
    with ThreadPoolExecutor(threads) as pool:
        images = list(pool.map(lambda rel: read_grayscale(root / rel, size, resize=resize), paths))
    return np.stack(images) if images else np.zeros((0, size, size), np.uint8)


def encode_table(encoder: Encoder, root: Path, table: pd.DataFrame, batch_size: int = 64) -> Encoded:
    """Run the encoder over every image of ``table`` (column ``path``), in batches, in table order."""
    embeddings, zero_shot, decisions = [], [], []
    paths = table["path"].tolist()
    for start in range(0, len(paths), batch_size):
        batch = read_images(root, paths[start : start + batch_size], encoder.image_size, encoder.resize)
        out = encoder.encode(batch)
        embeddings.append(np.asarray(out.embeddings, dtype=np.float32))
        if out.zero_shot is not None:
            zero_shot.append(np.asarray(out.zero_shot, dtype=np.float64))
            decisions.append(np.asarray(out.decisions, dtype=bool))
    if not embeddings:
        raise ValueError("no images to encode")
    if zero_shot and len(zero_shot) != len(embeddings):
        raise ValueError(f"{encoder.spec}: zero-shot scores for some batches only")
    if not zero_shot:
        return Encoded(np.concatenate(embeddings))
    return Encoded(np.concatenate(embeddings), np.concatenate(zero_shot), np.concatenate(decisions))


def encode_subset(
    encoder: Encoder,
    root: str | Path,
    table: pd.DataFrame,
    subset_fingerprint: str,
    cache_dir: str | Path | None = DEFAULT_CACHE_DIR,
    batch_size: int = 64,
) -> tuple[Encoded, bool]:
    """The encoder's outputs on a subset, from the cache when present; returns ``(outputs, cache_hit)``.

    ``table`` (``image_id``, ``path``) fixes the order the outputs follow; ``cache_dir=None`` always encodes and
    stores nothing.
    """
    ids = np.asarray(table["image_id"].astype(str).tolist(), dtype=str)  # fixed-width unicode: no pickling
    labels = np.asarray(encoder.target_labels, dtype=str)  # the zero-shot columns' order
    path = Path(cache_dir) / f"{cache_key(encoder, subset_fingerprint)}.npz" if cache_dir is not None else None
    if path is not None and path.is_file():
        with np.load(path, allow_pickle=False) as stored:
            if np.array_equal(stored["image_ids"], ids) and np.array_equal(stored["labels"], labels):
                if bool(stored["has_zero_shot"]):
                    return Encoded(stored["embeddings"], stored["zero_shot"], stored["decisions"]), True
                return Encoded(stored["embeddings"]), True
    encoded = encode_table(encoder, Path(root), table, batch_size)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.stem}.tmp{os.getpid()}.npz")
        has = encoded.zero_shot is not None
        np.savez(
            tmp, image_ids=ids, labels=labels, embeddings=encoded.embeddings, has_zero_shot=has,
            zero_shot=encoded.zero_shot if has else np.zeros((0, 0)),
            decisions=encoded.decisions if has else np.zeros((0, 0), bool), identity=encoder.identity,
        )  # fmt: skip
        os.replace(tmp, path)
    return encoded, False
