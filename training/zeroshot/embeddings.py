"""Class embeddings: template ensembling (docs/rules.md §8) and an on-disk cache keyed by encoder and bank content.

A class's embedding is the mean of the L2-normalised embeddings of all its texts (templates x phrasings, plus
its description), re-normalised: each text counts once whatever its length, and the result is again a unit
vector, so cosine scores stay comparable across classes with different numbers of texts.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from training.zeroshot.bank import DescriptionBank

log = logging.getLogger(__name__)

CACHE_DIR = Path("data/cache/text_embeddings")


def l2_normalise(x: np.ndarray, axis: int = -1) -> np.ndarray:
    return x / np.maximum(np.linalg.norm(x, axis=axis, keepdims=True), 1e-12)


def ensemble(embeddings: np.ndarray) -> np.ndarray:
    """``(T, D)`` text embeddings of one class -> its ``(D,)`` unit embedding (normalise, mean, re-normalise)."""
    return l2_normalise(l2_normalise(np.asarray(embeddings, dtype=np.float64)).mean(axis=0)).astype(np.float32)


def class_embeddings(
    names: Sequence[str],
    bank: DescriptionBank,
    encode: Callable[[Sequence[str]], np.ndarray],
    kind: str = "positive",
    include_description: bool = True,
) -> np.ndarray:
    """``(C, D)`` ensembled embeddings of ``names`` from one batched ``encode`` call over all their texts."""
    texts, spans = bank.flat_prompts(names, kind, include_description)
    encoded = np.asarray(encode(texts), dtype=np.float32)  # (T_total, D)
    return np.stack([ensemble(encoded[span]) for span in spans])  # (C, D)


def cache_key(encoder_key: str, bank: DescriptionBank, names: Sequence[str], kind: str, include_description: bool):
    """Hash of everything the embeddings depend on: encoder identity, bank content, class list, prompt side."""
    payload = json.dumps([encoder_key, bank.content_hash, list(names), kind, include_description])
    return hashlib.sha256(payload.encode()).hexdigest()[:20]


def cached_class_embeddings(
    names: Sequence[str],
    bank: DescriptionBank,
    encoder,
    kind: str = "positive",
    include_description: bool = True,
    cache_dir: str | Path | None = CACHE_DIR,
) -> np.ndarray:
    """``class_embeddings`` computed once per (encoder, bank content, classes, side) and then read from disk.

    Args:
        encoder: a ``TextEncoder``; one whose ``cache_key`` is None (e.g. randomly initialised) is never cached.
        cache_dir: folder of ``<key>.npy`` files; None disables the cache.
    """
    key = encoder.cache_key
    if cache_dir is None or key is None:
        return class_embeddings(names, bank, encoder.encode, kind, include_description)
    path = Path(cache_dir) / f"{cache_key(key, bank, names, kind, include_description)}.npy"
    if path.is_file():
        log.info("class embeddings (%s, %d classes, %s) read from %s", key, len(names), kind, path)
        return np.load(path)
    values = class_embeddings(names, bank, encoder.encode, kind, include_description)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp.npy")
    np.save(tmp, values)
    tmp.replace(path)  # atomic: concurrent runs never read half a file
    log.info("class embeddings (%s, %d classes, %s) computed and cached at %s", key, len(names), kind, path)
    return values
