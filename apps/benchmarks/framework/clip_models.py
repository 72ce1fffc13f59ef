"""Image-text models through open_clip: ``clip:<model>[:<pretrained tag or weights file>]``,
``clip:hf-hub:<org/repo>`` or ``clip:local-dir:<folder>``.

Zero-shot is, per target, the margin ``cos(image, positive) - cos(image, negative)`` on L2-normalised embeddings;
a positive margin is the call. A softmax over the two scaled similarities is monotone in this margin and above
0.5 exactly when it is positive, so AUROC, AP and the decisions are the same either way. Without a pretrained
tag the weights are randomly initialised with the protocol's seed: a reproducible sanity floor.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from apps.benchmarks.framework.encoders import Encoded, Encoder, Target

PREFIX = "clip:"
SCHEMAS = ("hf-hub:", "local-dir:")


def parse_clip_spec(spec: str) -> tuple[str, str | None]:
    """``clip:<model>[:<pretrained>]`` -> (open_clip model name, pretrained tag/file or None).

    A model named with an open_clip schema (``hf-hub:``, ``local-dir:``) carries its own weights, so everything
    after ``clip:`` is the model name.
    """
    rest = spec.removeprefix(PREFIX)
    if not rest:
        raise ValueError(f"{spec!r}: expected clip:<open_clip model>[:<pretrained tag>] or clip:hf-hub:<repo>")
    if rest.startswith(SCHEMAS):
        return rest, None
    name, _, pretrained = rest.partition(":")
    return name, pretrained or None


def _files_stamp(paths: list[Path]) -> str:
    """Name, size and modification time of local files: enough to notice replaced weights or configs."""
    stats = [f"{p.name}:{p.stat().st_size}:{p.stat().st_mtime_ns}" for p in sorted(paths) if p.is_file()]
    return hashlib.sha256("\n".join(stats).encode()).hexdigest()[:16]


class ClipEncoder(Encoder):
    """An open_clip model scoring images against each target's two prompts.

    Args:
        spec: ``clip:...`` as named by the user.
        targets: the benchmark's findings and their prompts.
        tracking_uri: unused (open_clip models do not live in MLflow); every kind takes the same arguments.
        seed: seeds the random initialisation of a model loaded without weights.
    """

    zero_shot_kind = "margin"

    def __init__(self, spec: str, targets: Sequence[Target], tracking_uri: str | None = None, seed: int = 0):
        import open_clip  # optional heavy dependency, only for this model kind

        super().__init__(spec, targets, tracking_uri, seed)
        self.name, self.pretrained = parse_clip_spec(spec)
        self.seed = seed
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            self.model = open_clip.create_model(self.name, pretrained=self.pretrained, device="cpu").eval()
        self.tokenizer = open_clip.get_tokenizer(self.name)
        cfg = open_clip.get_model_preprocess_cfg(self.model)
        size = cfg.get("size", 224)
        height, width = (size, size) if isinstance(size, int) else tuple(size)
        if height != width:
            raise ValueError(f"{spec}: non-square input size {height}x{width} is not supported")
        self.image_size = int(height)
        self.mean = torch.tensor(cfg.get("mean", open_clip.OPENAI_DATASET_MEAN), dtype=torch.float32).view(1, 3, 1, 1)
        self.std = torch.tensor(cfg.get("std", open_clip.OPENAI_DATASET_STD), dtype=torch.float32).view(1, 3, 1, 1)
        self.prompts = tuple((t.positive_prompt, t.negative_prompt) for t in self.targets)
        self.text_directions = None  # (D, T): margin = image . (t_pos - t_neg), one column per target
        if self.prompts:
            with torch.inference_mode():
                tokens = self.tokenizer([prompt for pair in self.prompts for prompt in pair])
                text = self.model.encode_text(tokens, normalize=True).float()  # (2T, D): pos, neg, pos, neg, ...
            self.text_directions = (text[0::2] - text[1::2]).T.contiguous()

    @property
    def identity(self) -> str:
        prompts = "|".join(f"{pos}|{neg}" for pos, neg in self.prompts)
        parts = [PREFIX + self.name, str(self.pretrained), f"{self.image_size}", prompts]
        if self.name.startswith("local-dir:"):
            parts.append(_files_stamp(list(Path(self.name.removeprefix("local-dir:")).iterdir())))
        elif self.pretrained and os.path.isfile(self.pretrained):
            parts.append(_files_stamp([Path(self.pretrained)]))
        if self._random_init:
            parts.append(f"random-init-seed{self.seed}")
        return "::".join(parts)

    @property
    def _random_init(self) -> bool:
        """No weights named: neither a pretrained tag/file nor a schema that brings its own."""
        if self.pretrained:
            return False
        if self.name.startswith("local-dir:"):
            folder = Path(self.name.removeprefix("local-dir:"))
            return not any(p.suffix in (".bin", ".pt", ".pth", ".safetensors") for p in folder.iterdir())
        return not self.name.startswith("hf-hub:")

    @property
    def description(self) -> str:
        weights = f"random init (seed {self.seed})" if self._random_init else (self.pretrained or "bundled weights")
        return f"{self.spec} (open_clip {self.name}, {weights}, {self.image_size} px)"

    @torch.inference_mode()
    def embed_texts(self, texts: Sequence[str]) -> np.ndarray:
        """``(M, D)`` L2-normalised text embeddings, in the space :meth:`encode`'s image embeddings live in."""
        return self.model.encode_text(self.tokenizer(list(texts)), normalize=True).float().numpy()

    def to_tensor(self, images: np.ndarray) -> torch.Tensor:
        """``(B, 3, S, S)`` model input: the grey film in every channel, with the model's own normalisation."""
        x = torch.from_numpy(np.ascontiguousarray(images)).float().div(255.0)  # (B, H, W)
        return (x.unsqueeze(1).expand(-1, 3, -1, -1) - self.mean) / self.std

    @torch.inference_mode()
    def encode(self, images: np.ndarray) -> Encoded:
        embeddings = self.model.encode_image(self.to_tensor(images), normalize=True).float()  # (B, D)
        if self.text_directions is None:
            return Encoded(embeddings.numpy())
        margin = (embeddings @ self.text_directions).numpy()  # (B, T)
        return Encoded(embeddings.numpy(), margin.astype(np.float64), margin > 0)
