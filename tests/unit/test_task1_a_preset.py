"""Preset cxrlt2026_task1_a carries the 2026 Task 1 winner's recipe, composed as `make train` composes it.

Source of the numbers: the winner's published Task 1 training code, GitHub hieuphamha19/CXR_LT
(Task1_Long_tailed/train_csra_head.py); docs/recipes.md, "Task 1 rows", row A, says where the preset follows it.
"""

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from tests.conftest import PROJECT_ROOT
from training.components import build_component
from training.models.two_phase import HeadFirst

#: Config key -> the winner's value.
WINNER = {
    "model.backbone": "convnextv2_base",
    "model.timm_kwargs.drop_path_rate": 0.2,
    "data.image_size": 512,
    "data.batch_size": 64,  # per device
    "model.head.name": "csra",
    "model.head.lam": 0.1,
    "model.head.batch_norm": True,  # BatchNorm2d on the feature map before the head
    "callbacks.two_phase.name": "head_first",
    "callbacks.two_phase.epochs": 10,  # phase 1: head only, backbone frozen
    "callbacks.two_phase.lr": 1e-3,
    "model.lr": 1.5e-5,  # phase 2: backbone
    "model.head_lr": 1.5e-4,  # phase 2: head
    "model.warmup_epochs": 5,
    "model.min_lr_factor": 0.01,  # the cosine's floor
    "trainer.gradient_clip_val": 1.0,
    "callbacks.ema.decay": 0.9999,
    "loss.name": "db_winner2026",
    "loss.class_beta": 0.9999,
    "loss.class_weight_power": 0.5,  # the code's rebalance alpha
    "loss.neg_scale": 1.0,
    "loss.neg_margin": 0.0,
    "loss.class_margin_scale": 1.0,
    "loss.class_margin": 0.2,  # the code's cap on the margin
    "sampler.name": "repeat_factor",
    "sampler.threshold": 0.01,
    "sampler.max_repeat": 10,
    "data.resize": "stretch",  # the code's Resize(512, 512)
    "data.source.val_fraction": 0.1,  # of the patients (data=cxrlt2026)
}
PHASE_TWO_EPOCHS = 60

#: albumentations step -> {argument: the winner's value}, in the winner's order after its resize.
AUGMENT = [
    ("HorizontalFlip", {"p": 0.5}),
    ("Affine", {"translate_percent": [-0.03, 0.03], "scale": [0.95, 1.05], "rotate": [-7, 7], "p": 0.4}),
    ("CLAHE", {"clip_limit": 2.0, "tile_grid_size": [8, 8], "p": 0.2}),
    ("RandomBrightnessContrast", {"brightness_limit": 0.08, "contrast_limit": 0.08, "p": 0.2}),
    ("GaussNoise", {"std_range": [pytest.approx(1 / 255, abs=1e-5), pytest.approx(5**0.5 / 255, abs=1e-5)]}),
    ("CoarseDropout", {"num_holes_range": [6, 6], "hole_height_range": [24, 24], "hole_width_range": [24, 24]}),
]


@pytest.fixture(scope="module")
def cfg():
    with initialize_config_dir(config_dir=str(PROJECT_ROOT / "configs"), version_base="1.3"):
        return compose("train", overrides=["experiment=cxrlt2026_task1_a", "data=cxrlt2026", "data.root=/release"])


@pytest.mark.parametrize(("key", "value"), list(WINNER.items()))
def test_the_preset_sets_the_winners_value(cfg, key, value):
    assert OmegaConf.select(cfg, key) == value


def test_the_run_is_ten_head_only_epochs_then_sixty_of_every_weight(cfg):
    assert cfg.trainer.max_epochs - cfg.callbacks.two_phase.epochs == PHASE_TWO_EPOCHS
    callback = build_component(cfg.callbacks.two_phase)
    assert isinstance(callback, HeadFirst) and (callback.epochs, callback.lr) == (10, 1e-3)


def test_the_augmentation_is_the_winners(cfg):
    steps = OmegaConf.to_container(cfg.augment.train)
    assert [step["_target_"].removeprefix("albumentations.") for step in steps] == [name for name, _ in AUGMENT]
    for step, (name, expected) in zip(steps, AUGMENT, strict=True):
        assert {key: step[key] for key in expected} == expected, name
    assert [step.get("p") for step in steps][-2:] == [0.15, 0.15]
