"""Every Table 2 preset carries the settings the CXR-LT 2026 overview (arXiv 2602.22092) states for its row.

``PAPER`` is the overview's stated settings per preset, one entry per sentence (its short paraphrase is the
comment), each a config key of the composed preset and the value it must hold, or a check on that value where the
sentence states a property rather than a number. What the overview leaves open (angles, switch points, which
layers are "last") is not here: docs/recipes.md, "Table 2 rows", lists those as ours. Row A's winner recipe beyond
backbone and size is checked with its own preset's tests.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

import training  # noqa: F401  (registers the config's resolvers, which the composed preset resolves)
from evaluation.tta import build_views

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
PRESETS = sorted(path.stem for path in (CONFIGS / "experiment").glob("cxrlt2026_*.yaml"))


def _views(spec) -> list[str]:
    return [type(view).__name__ for view in build_views(spec)]


def _targeted_step(train_steps) -> dict:
    (step,) = [s for s in train_steps if s["_target_"].endswith("ClassTargeted")]
    return step


Check = Any | Callable[[Any], bool]

PAPER: dict[str, list[tuple[str, Check]]] = {
    "cxrlt2026_task1_a": [
        ("model.backbone", "convnextv2_base"),  # ConvNeXt-V2-Base
        ("data.image_size", 512),  # at 512 px
    ],
    "cxrlt2026_task1_b": [
        ("model.router.backbone", lambda v: v.startswith("efficientnet")),  # an EfficientNet router ...
        ("model.views", ["PA", "AP", "LATERAL"]),  # ... to projection-specific networks (PA / AP / lateral)
        ("model.backbone", lambda v: v.startswith("swinv2_tiny")),  # SwinV2-T (one of the row's two backbones)
        ("data.image_size", 512),  # at 512 px
        ("tta.enabled", True),  # with test-time augmentation
    ],
    "cxrlt2026_task1_c": [
        ("model.backbone", "convnext_base"),  # ConvNeXt-B
        ("data.image_size", 384),  # at 384 px
        ("loss.name", "asl"),  # the asymmetric loss ...
        ("model.aux_loss.name", "linear"),  # ... plus an auxiliary loss
        ("model.head.name", "moe_decoder"),  # phase 1: a query-based decoder head; phase 2: mixture of experts
        ("callbacks.two_phase._target_", "training.models.two_phase.TwoPhase"),  # trained in two phases
        ("callbacks.two_phase.train_backbone", lambda v: len(v) > 0),  # phase 2: only the last layers + the head
    ],
    "cxrlt2026_task1_d": [
        ("model.backbone", lambda v: v.startswith("swin_large")),  # Swin-L (initialised from Ark+)
        ("data.image_size", 768),  # at 768 px
        ("loss.name", "asl"),  # the asymmetric loss
        ("tta.views", lambda v: len(_views(v)) == 10),  # 10-crop test-time augmentation
    ],
    "cxrlt2026_task1_e": [
        ("model.backbone", "convnext_large"),  # ConvNeXt-Large
        ("data.image_size", 512),  # at 512 px
        ("loss.name", "ldam"),  # LDAM ...
        ("loss.drw_start", lambda v: 0 < v < 1),  # ... with deferred re-weighting
        ("sampler.name", "class_aware"),  # class-balanced sampling
        ("tta.views", lambda v: {"HFlip", "Rotate"} <= set(_views(v))),  # flip + small-rotation TTA
    ],
    "cxrlt2026_task1_f": [
        ("model.backbone", "densenet121"),  # a TorchXRayVision DenseNet-121
        ("model.head.name", "two_stage"),  # two stages: normal vs abnormal, then multi-label
        ("loss.name", "asl"),  # the asymmetric loss ...
        ("loss.gamma_neg", 6.0),  # ... gamma_neg 6
        ("loss.gamma_pos", 1.0),  # ... gamma_pos 1
        ("model.aux_loss.name", "multi_supcon"),  # a multi-label supervised contrastive loss
        ("model.aux_loss.weight", 1.0),  # alpha = 1.0, beta = 1.0 (the two terms' weights)
        ("model.aux_loss.temperature", 0.07),  # temperature 0.07
        ("augment.train", lambda v: _targeted_step(v)["below"] == 4000),  # classes under 4,000 training images
        (
            "augment.train",
            lambda v: (
                {"Affine", "HorizontalFlip"}  # ... get rotations and horizontal flips
                == {t["_target_"].rsplit(".", 1)[1] for t in _targeted_step(v)["transforms"]}
            ),
        ),
    ],
    "cxrlt2026_task2_a": [
        ("adapter.model", "ViT-L-14"),  # OpenCLIP ViT-L/14
        ("adapter.name", "clip"),  # with prompt ensembling (the clip adapter's template ensemble)
    ],
    "cxrlt2026_task2_b": [
        ("adapter.model", "ViT-B-32-quickgelu"),  # CheXzero (a CLIP ViT-B/32)
        ("loss.name", "asl"),  # a branch trained with the asymmetric loss
        ("adapter.include_description", True),  # descriptive (LLM-written) prompts
        ("tta.enabled", True),  # test-time augmentation
        ("adapter.proxy.k", 3),  # three proxy sets ...
        ("adapter.proxy.size", 6),  # ... of the 30 training classes, 24 seen and 6 unseen each
        ("task.labels", lambda v: len(v) == 30),
    ],
    "cxrlt2026_task2_g": [
        ("loss.name", "cb"),  # a class-balanced loss
        ("adapter.name", "clip_prototypes"),  # prototype prompting from high-confidence samples
        ("adapter.model", "RN50"),  # MedKLIP's image encoder, a ResNet-50
    ],
}


def composed(preset: str, *overrides: str):
    task = "task2" if "_task2_" in preset else "task1"
    with initialize_config_dir(str(CONFIGS), version_base="1.3"):
        cfg = compose("train", overrides=[f"task={task}", f"experiment={preset}", *overrides])
    return OmegaConf.to_container(cfg, resolve=True)


def value_at(cfg: dict, key: str) -> Any:
    node = cfg
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            raise AssertionError(f"{key}: no such key in the composed preset")
        node = node[part]
    return node


def test_every_table_2_preset_has_a_row_here():
    assert sorted(PAPER) == PRESETS


@pytest.mark.parametrize("preset", PRESETS)
def test_the_preset_holds_what_the_overview_states(preset):
    cfg = composed(preset)
    wrong = []
    for key, check in PAPER[preset]:
        value = value_at(cfg, key)
        ok = check(value) if callable(check) else value == check
        if not ok:
            wrong.append(f"{key} = {value!r}")
    assert not wrong, f"{preset} contradicts the overview: {wrong}"


def test_task1_e_second_step_is_crt_on_the_preset():
    """Row E's classifier re-training: `make crt RUN=... ARGS="experiment=cxrlt2026_task1_e"` composes to cRT with
    class-balanced sampling and a fresh head on the first run's frozen backbone."""
    cfg = composed("cxrlt2026_task1_e", "stage=crt", "stage.parent_run=abc")
    assert cfg["stage"]["_target_"] == "training.stages.ClassifierRetraining"
    assert cfg["stage"]["reinit_head"] is True
    assert cfg["sampler"]["name"] == "class_aware"
    assert cfg["model"]["backbone"] == "convnext_large"
