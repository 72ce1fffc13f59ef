"""Every configs/model/*.yaml composes through Hydra as `make train` composes it and builds the network it names.

The networks are built on PyTorch's meta device: every constructor and every shape check of a forward pass runs,
but no weight is allocated or initialised, which is what makes ConvNeXt-L and Swin-L (about 195M parameters,
over 10 s each to initialise on two CPU cores) as cheap to check as the small ones. The last test builds the
default model for real and shows the meta build describes the same network.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir

from training.models.factory import model_from_config

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
MODELS = sorted(path.stem for path in (CONFIGS / "model").glob("*.yaml"))
SIZE = 32


def train_config(model: str, *overrides: str):
    with initialize_config_dir(str(CONFIGS), version_base="1.3"):
        return compose("train", overrides=[f"model={model}", f"data.image_size={SIZE}", *overrides])


def timm_architectures(network: torch.nn.Module) -> set[str]:
    """The timm models inside a network, by the architecture name timm records on each."""
    return {module.pretrained_cfg["architecture"] for module in network.modules() if hasattr(module, "pretrained_cfg")}


@pytest.mark.parametrize("model", MODELS)
def test_every_model_config_builds_the_backbone_it_names(model):
    # Soft routing sends every image through every expert, so the forward needs no data-dependent selection
    # (which has no meta implementation); the network built is the same for either routing.
    cfg = train_config(model)
    if "routing" in cfg.model:
        cfg.model.routing = "soft"
    assert not cfg.model.pretrained, "a shipped model config must not download weights (tests run offline)"
    with torch.device("meta"):
        network = model_from_config(cfg).eval()
        logits = network(torch.zeros(2, 1, SIZE, SIZE))
    assert logits.shape == (2, len(cfg.task.labels))
    assert sum(parameter.numel() for parameter in network.parameters()) > 0
    named = {cfg.model.backbone, *([cfg.model.router.backbone] if "router" in cfg.model else [])}
    assert timm_architectures(network) == {name.split(".")[0] for name in named}


def test_the_meta_build_is_the_network_a_real_build_makes():
    cfg = train_config("regnetx_004")
    with torch.device("meta"):
        meta = model_from_config(cfg)
    real = model_from_config(cfg).eval()
    shapes = {name: tuple(parameter.shape) for name, parameter in real.named_parameters()}
    assert {name: tuple(parameter.shape) for name, parameter in meta.named_parameters()} == shapes
    with torch.no_grad():
        logits = real(torch.rand(2, 1, SIZE, SIZE))
    assert logits.shape == (2, len(cfg.task.labels)) and torch.isfinite(logits).all()
