"""Model specs -> encoders: one class per model kind, chosen by the spec's prefix.

| spec | kind | class |
|---|---|---|
| ``<run id>`` or ``run:<run id>`` | a platform training run | :class:`PlatformRunEncoder` |
| ``models:/<name>@<alias>``, ``models:/<name>/<version>`` | a registered model version | :class:`PlatformRunEncoder` |
| ``clip:<open_clip model>[:<pretrained>]`` | an open_clip image-text model | :class:`ClipEncoder` |

A new kind is one :class:`~apps.benchmarks.framework.encoders.Encoder` subclass and one entry in :data:`MODEL_KINDS`.
"""

from __future__ import annotations

from collections.abc import Sequence

from apps.benchmarks.framework.clip_models import ClipEncoder
from apps.benchmarks.framework.encoders import Encoder, Target
from apps.benchmarks.framework.platform_models import PlatformRunEncoder

MODEL_KINDS: dict[str, type[Encoder]] = {
    "run": PlatformRunEncoder,
    "models": PlatformRunEncoder,
    "clip": ClipEncoder,
}
"""Spec prefix (the text before the first ``:``; ``run`` when there is none) -> encoder class."""


def model_kind(spec: str) -> str:
    """The prefix that selects a spec's encoder class (``run`` for a bare run id)."""
    prefix, colon, _ = spec.partition(":")
    return prefix if colon else "run"


def load_encoder(spec: str, targets: Sequence[Target], tracking_uri: str, seed: int = 0) -> Encoder:
    """Build the encoder a spec names, answering every one of ``targets``.

    Raises:
        ValueError: an unknown prefix.
    """
    kind = model_kind(spec.strip())
    if kind not in MODEL_KINDS:
        raise ValueError(
            f"unknown model kind {kind!r} in {spec!r}; expected a run id, models:/<name>@<alias> or "
            f"models:/<name>/<version>, or clip:<open_clip model>[:<pretrained>]"
        )
    return MODEL_KINDS[kind](spec.strip(), targets, tracking_uri, seed)
