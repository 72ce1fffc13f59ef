"""Per-class targeted augmentation (configs/augment/targeted.yaml): extra steps only for the chosen findings' images."""

from pathlib import Path

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from training.data.dataset import ManifestDataset
from training.data.targeted_augment import CLASS_TARGETS, ClassTargeted
from training.data.transforms import build_transform
from training.errors import UserError

LABELS = ["Normal", "Mass", "Hernia"]
INVERT = {"_target_": "albumentations.InvertImg", "p": 1.0}


def _pipeline(classes=("Mass",)):
    step = {"_target_": "training.data.targeted_augment.ClassTargeted", "classes": list(classes), "labels": LABELS,
            "p": 1.0, "transforms": [INVERT]}  # fmt: skip
    return build_transform([step])


def _image():
    return (np.arange(64, dtype=np.uint8) * 3).reshape(8, 8)


@pytest.mark.parametrize(
    ("targets", "inverted"),
    [([0, 1, 0], True), ([1, 0, 1], False), ([0, -1, 0], False), ([0, 1, 1], True), (None, False)],
    ids=["positive", "other-classes", "unlabelled", "two-positives", "no-labels-given"],
)
def test_only_images_positive_for_a_targeted_class_get_the_steps(targets, inverted):
    plain = build_transform(None)(image=_image())["image"]
    extra = {} if targets is None else {CLASS_TARGETS: np.array(targets, dtype=np.float32)}
    out = _pipeline()(image=_image(), **extra)["image"]
    want = build_transform(None)(image=255 - _image())["image"] if inverted else plain
    torch.testing.assert_close(out, want)


def test_unknown_class_is_refused_by_name():
    with pytest.raises(UserError, match="Goiter"):
        ClassTargeted([], ["Goiter"], LABELS)


def test_the_yaml_resolves_its_classes_against_the_task_labels():
    """configs/augment/targeted.yaml names task 1 findings; its columns follow ${task.labels}."""
    root = Path(__file__).resolve().parents[2] / "configs"
    cfg = OmegaConf.create({"task": OmegaConf.load(root / "task" / "task1.yaml"),
                            "augment": OmegaConf.load(root / "augment" / "targeted.yaml")})  # fmt: skip
    pipeline = build_transform(cfg.augment.train)
    (targeted,) = [step for step in pipeline.transforms if isinstance(step, ClassTargeted)]
    labels = list(cfg.task.labels)
    assert [labels[i] for i in targeted.columns] == targeted.classes and "Mass" in targeted.classes


def test_the_dataset_hands_each_image_its_target_row(tmp_path):
    """ManifestDataset passes the row's targets to the pipeline, so a targeted step sees the image's own labels."""
    images = np.stack([_image(), _image()])
    targets = np.array([[0, 1, 0], [1, 0, 0]], dtype=np.float32)
    dataset = ManifestDataset(tmp_path, ["a.png", "b.png"], targets, ["a", "b"], 8, _pipeline(), store=images)
    plain = build_transform(None)(image=_image())["image"]
    assert not torch.equal(dataset[0]["image"], plain)  # Mass positive: inverted
    torch.testing.assert_close(dataset[1]["image"], plain)
