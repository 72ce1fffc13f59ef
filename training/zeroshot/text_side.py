"""From an adapter config to class text embeddings: bank + encoder + template ensembling + disk cache (+ centring).

Why centring (``center: true``): a general-purpose sentence encoder's class embeddings all carry the same prompt
context, which dominates them (``Normal`` is near every unseen class), so a zero-shot score mostly measures how
"chest-x-ray-like" an image is and inverts rankings. Subtracting the mean of *all bank classes* (independent of
which classes a task holds out) and re-normalising keeps what tells classes apart (Scoliosis' nearest seen
classes become Kyphosis and Vertebral Degenerative Changes). Off for CLIP models, whose spaces are aligned.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from training.components import build_component
from training.zeroshot.bank import DescriptionBank
from training.zeroshot.embeddings import CACHE_DIR, cached_class_embeddings, l2_normalise

#: Set in an adapter config by whoever rebuilds a network only to load a checkpoint into it: the class embeddings
#: are buffers of that checkpoint, so the bank is not encoded (through a random CLIP ViT-L/14 text tower, a minute
#: of CPU) for values the checkpoint overwrites; placeholders of the right shape stand in.
FROM_CHECKPOINT = "text_from_checkpoint"


def text_embeddings(adapter_cfg: Mapping, names: Sequence[str], kind: str = "positive", encoder=None) -> np.ndarray:
    """``(C, D)`` unit class embeddings of ``names`` as the adapter config describes them.

    Every bank class is embedded, then ``names`` are picked, so the centring reference never depends on the task's
    split into seen and unseen classes. ``encoder``: an already built one (the clip adapter passes its text tower).
    """
    bank = DescriptionBank.load(adapter_cfg.get("bank"))
    bank.require(names)
    encoder = encoder or build_component(adapter_cfg["text_encoder"])
    if adapter_cfg.get(FROM_CHECKPOINT):
        width = encoder.encode(list(names[:1])).shape[1]
        return np.full((len(names), width), width**-0.5, dtype=np.float32)  # unit rows, to be overwritten
    cache_dir = adapter_cfg.get("cache_dir", str(CACHE_DIR))
    every = list(bank.classes)
    values = cached_class_embeddings(every, bank, encoder, kind, bool(adapter_cfg.get("include_description", True)),
                                     cache_dir)  # fmt: skip  # (K, D) over the whole bank
    if adapter_cfg.get("center", False):
        values = l2_normalise(values - values.mean(axis=0, keepdims=True))
    index = {name: i for i, name in enumerate(every)}
    return np.ascontiguousarray(values[[index[name] for name in names]], dtype=np.float32)
