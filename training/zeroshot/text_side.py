"""From an adapter config to class text embeddings: bank + encoder + template ensembling + disk cache."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from training.components import build_component
from training.zeroshot.bank import DescriptionBank
from training.zeroshot.embeddings import CACHE_DIR, cached_class_embeddings


def text_embeddings(adapter_cfg: Mapping, names: Sequence[str], kind: str = "positive", encoder=None) -> np.ndarray:
    """``(C, D)`` unit class embeddings of ``names`` as the adapter config describes them.

    Args:
        adapter_cfg: ``configs/adapter`` node: ``bank`` (path or null), ``text_encoder`` (a component node),
            ``include_description``, ``cache_dir``.
        names: classes to embed; every one must be in the bank (the error names the missing ones).
        kind: ``positive`` or ``negative`` prompts.
        encoder: an already built ``TextEncoder`` (the clip adapter passes its own text tower).
    """
    bank = DescriptionBank.load(adapter_cfg.get("bank"))
    bank.require(names)
    encoder = encoder or build_component(adapter_cfg["text_encoder"])
    cache_dir = adapter_cfg.get("cache_dir", str(CACHE_DIR))
    return cached_class_embeddings(
        list(names), bank, encoder, kind, bool(adapter_cfg.get("include_description", True)), cache_dir
    )
