"""From an adapter config to class text embeddings: bank + encoder + template ensembling + disk cache (+ centring).

Centring (``center: true``): every class embedding of a general-purpose sentence encoder carries the same prompt
context ("a chest x-ray showing ..."), which dominates it: with all-MiniLM-L6-v2 any two classes of the bank sit
at cosine 0.5-0.87 and ``Normal`` is among the nearest neighbours of every unseen class. A zero-shot score
``z . t_u`` then mostly measures how "chest-x-ray-like" the image embedding is, the same for every class, and
inverts rankings (normal images score high on everything). Subtracting the mean embedding of *all bank classes*
(a fixed reference set of text, independent of which classes a task holds out) and re-normalising keeps what
tells classes apart: Scoliosis' nearest seen classes become Kyphosis and Vertebral Degenerative Changes, Bulla's
Bronchiectasis and Emphysema. It is off for CLIP models, whose image and text spaces are aligned as trained.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from training.components import build_component
from training.zeroshot.bank import DescriptionBank
from training.zeroshot.embeddings import CACHE_DIR, cached_class_embeddings, l2_normalise


def text_embeddings(adapter_cfg: Mapping, names: Sequence[str], kind: str = "positive", encoder=None) -> np.ndarray:
    """``(C, D)`` unit class embeddings of ``names`` as the adapter config describes them.

    Every bank class is embedded (one cache entry per encoder, bank content and prompt side), then ``names`` are
    picked, so the centring reference never depends on the task's split into seen and unseen classes.

    Args:
        adapter_cfg: ``configs/adapter`` node: ``bank`` (path or null), ``text_encoder`` (a component node),
            ``include_description``, ``cache_dir``, ``center``.
        names: classes to embed; every one must be in the bank (the error names the missing ones).
        kind: ``positive`` or ``negative`` prompts.
        encoder: an already built ``TextEncoder`` (the clip adapter passes its own text tower).
    """
    bank = DescriptionBank.load(adapter_cfg.get("bank"))
    bank.require(names)
    encoder = encoder or build_component(adapter_cfg["text_encoder"])
    cache_dir = adapter_cfg.get("cache_dir", str(CACHE_DIR))
    every = list(bank.classes)
    values = cached_class_embeddings(every, bank, encoder, kind, bool(adapter_cfg.get("include_description", True)),
                                     cache_dir)  # fmt: skip  # (K, D) over the whole bank
    if adapter_cfg.get("center", False):
        values = l2_normalise(values - values.mean(axis=0, keepdims=True))
    index = {name: i for i, name in enumerate(every)}
    return np.ascontiguousarray(values[[index[name] for name in names]], dtype=np.float32)
