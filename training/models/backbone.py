"""timm backbones by name, single-channel input, without network access unless asked for."""

from __future__ import annotations

import timm
from torch import nn


class PretrainedWeightsUnavailable(RuntimeError):
    """Pretrained weights were requested but could not be fetched (usually: no network)."""


def create_backbone(name: str, pretrained: bool = False, in_chans: int = 1, **kwargs) -> nn.Module:
    """Create a headless timm model returning pooled features ``(B, F)``.

    Args:
        name: any ``timm.list_models()`` name.
        pretrained: fetch ImageNet weights from the hub. Off by default: tests and the built-in data run offline.
        in_chans: 1 for radiographs; timm folds a pretrained RGB stem into one channel by summing its filters.
        **kwargs: passed to ``timm.create_model`` (``drop_rate``, ``drop_path_rate``, ...).
    """
    try:
        return timm.create_model(name, pretrained=pretrained, num_classes=0, in_chans=in_chans, **kwargs)
    except (OSError, RuntimeError) as error:
        if not pretrained:
            raise
        raise PretrainedWeightsUnavailable(
            f"could not load pretrained weights for {name!r} ({error}); run with model.pretrained=false, or put the "
            "weights in the Hugging Face cache on a machine with network access first"
        ) from error
