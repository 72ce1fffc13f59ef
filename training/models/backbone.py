"""timm backbones by name, single-channel input, without network access unless asked for."""

from __future__ import annotations

from pathlib import Path

import timm
from torch import nn

from training.models.weights import WeightsError, load_weights

#: ``model.weights`` prefixes naming hub weights rather than a file.
HUB_PREFIXES = ("hf-hub:", "timm:")


class PretrainedWeightsUnavailable(RuntimeError):
    """Pretrained weights were requested but could not be fetched (usually: no network)."""


def create_backbone(
    name: str,
    pretrained: bool = False,
    in_chans: int = 1,
    weights: str | Path | None = None,
    weights_format: str = "auto",
    weights_trust_pickle: bool = False,
    **kwargs,
) -> nn.Module:
    """Create a headless timm model returning pooled features ``(B, F)``.

    Args:
        pretrained: fetch ImageNet weights from the hub. Off by default: tests and the built-in data run offline.
        in_chans: 1 for radiographs; timm folds a pretrained RGB stem into one channel by summing its filters.
        weights: other weights than ImageNet's (docs/recipes.md, "Starting from other weights"): a local file,
            ``hf-hub:<repo>`` or ``timm:<model.tag>``.
        weights_trust_pickle: allow a file that must be unpickled (it can run code).
    """
    weights = str(weights) if weights not in (None, "") else None
    if weights is not None and pretrained:
        raise WeightsError(
            f"model.pretrained=true and model.weights={weights!r} both choose the starting weights; keep one"
        )
    hub = weights is not None and weights.startswith(HUB_PREFIXES)
    if hub:
        kwargs = {**kwargs, **_hub_arguments(name, weights)}
        name = kwargs.pop("model_name")
    fetch = bool(pretrained or hub)
    try:
        model = timm.create_model(name, pretrained=fetch, num_classes=0, in_chans=in_chans, **kwargs)
    except (OSError, RuntimeError, ValueError) as error:
        if not fetch:
            raise
        raise PretrainedWeightsUnavailable(
            f"could not load pretrained weights for {weights or name!r} ({error}); run with model.pretrained=false "
            "(and model.weights=null, or a local file), or put the weights in the Hugging Face cache on a machine "
            "with network access first"
        ) from error
    if weights is not None and not hub:
        load_weights(model, weights, weights_format, weights_trust_pickle)
    return model


def _hub_arguments(name: str, weights: str) -> dict:
    """``create_model`` arguments for hub weights of architecture ``name``.

    ``hf-hub:<repo>`` keeps the configured architecture and points its pretrained config at the repository;
    ``timm:<arch>.<tag>`` picks one of timm's own tags, which must be for the same architecture (otherwise the
    run's ``model.backbone`` would not describe the network it trained).
    """
    if weights.startswith("hf-hub:"):
        return {"model_name": name, "pretrained_cfg_overlay": {"hf_hub_id": weights.removeprefix("hf-hub:")}}
    tagged = weights.removeprefix("timm:")
    arch = tagged.split(".", 1)[0]
    if arch != name.split(".", 1)[0]:
        raise WeightsError(f"model.weights={weights!r} is for {arch!r}, but model.backbone={name!r}")
    return {"model_name": tagged}


def backbone_from_config(model_cfg: dict) -> nn.Module:
    """:func:`create_backbone` from a ``configs/model`` node: the one reading of its backbone keys."""
    return create_backbone(
        model_cfg["backbone"],
        pretrained=model_cfg.get("pretrained", False),
        weights=model_cfg.get("weights"),
        weights_format=model_cfg.get("weights_format", "auto"),
        weights_trust_pickle=model_cfg.get("weights_trust_pickle", False),
        **model_cfg.get("timm_kwargs", {}),
    )
