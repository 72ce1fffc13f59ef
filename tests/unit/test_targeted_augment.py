"""Per-class targeted augmentation (configs/augment/targeted.yaml): extra steps only for the chosen findings' images."""

from pathlib import Path

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from training.data.dataset import ManifestDataset
from training.data.targeted_augment import CLASS_TARGETS, ClassTargeted, select_targeted_classes
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


def _counted_pipeline(below):
    step = {"_target_": "training.data.targeted_augment.ClassTargeted", "below": below, "labels": LABELS,
            "p": 1.0, "transforms": [INVERT]}  # fmt: skip
    return build_transform([step])


def test_below_targets_the_classes_with_fewer_training_positives():
    """Counts by hand: Normal 3, Mass 2 (the -1 rows do not count), Hernia 1; below 3 -> Mass and Hernia."""
    targets = np.array([[1, 1, 0], [1, -1, 1], [1, 1, -1], [0, -1, 0]], dtype=np.float32)
    pipeline = _counted_pipeline(below=3)
    select_targeted_classes(pipeline, targets)
    (step,) = [s for s in pipeline.transforms if isinstance(s, ClassTargeted)]
    assert step.classes == ["Mass", "Hernia"]
    assert step.columns.tolist() == [1, 2]
    hernia_only = pipeline(image=_image(), **{CLASS_TARGETS: np.array([1, 0, 1], dtype=np.float32)})["image"]
    normal_only = pipeline(image=_image(), **{CLASS_TARGETS: np.array([1, 0, 0], dtype=np.float32)})["image"]
    torch.testing.assert_close(hernia_only, build_transform(None)(image=255 - _image())["image"])
    torch.testing.assert_close(normal_only, build_transform(None)(image=_image())["image"])


def test_the_threshold_is_strict():
    """'Fewer than' 2: a class with exactly 2 positives is not targeted."""
    targets = np.array([[1, 1, 0], [1, 1, 1]], dtype=np.float32)
    pipeline = _counted_pipeline(below=2)
    select_targeted_classes(pipeline, targets)
    (step,) = [s for s in pipeline.transforms if isinstance(s, ClassTargeted)]
    assert step.classes == ["Hernia"]


def test_a_counted_step_without_counts_refuses_to_guess():
    pipeline = _counted_pipeline(below=3)
    with pytest.raises(RuntimeError, match="select_targeted_classes"):
        pipeline(image=_image(), **{CLASS_TARGETS: np.array([0, 1, 0], dtype=np.float32)})


def test_names_and_a_count_together_are_refused():
    with pytest.raises(UserError, match="exactly one"):
        ClassTargeted([], ["Mass"], LABELS, below=10)


def test_the_yaml_targets_classes_below_4000_with_rotation_and_flip():
    """configs/augment/targeted.yaml: team F's setting, the classes under 4,000 training images, rotated and flipped."""
    root = Path(__file__).resolve().parents[2] / "configs"
    cfg = OmegaConf.create({"task": OmegaConf.load(root / "task" / "task1.yaml"),
                            "augment": OmegaConf.load(root / "augment" / "targeted.yaml")})  # fmt: skip
    pipeline = build_transform(cfg.augment.train)
    (targeted,) = [step for step in pipeline.transforms if isinstance(step, ClassTargeted)]
    assert targeted.below == 4000
    kinds = [type(step).__name__ for step in targeted.transforms]
    assert kinds == ["Affine", "HorizontalFlip"]
    labels = list(cfg.task.labels)
    counts = np.full(len(labels), 5000)
    counts[labels.index("Mass")] = 3999
    counts[labels.index("Hernia")] = 4000
    targets = (np.arange(5000)[:, None] < counts[None, :]).astype(np.float32)  # column c has counts[c] positives
    select_targeted_classes(pipeline, targets)
    assert targeted.classes == ["Mass"]


def test_the_dataset_hands_each_image_its_target_row(tmp_path):
    """ManifestDataset passes the row's targets to the pipeline, so a targeted step sees the image's own labels."""
    images = np.stack([_image(), _image()])
    targets = np.array([[0, 1, 0], [1, 0, 0]], dtype=np.float32)
    dataset = ManifestDataset(tmp_path, ["a.png", "b.png"], targets, ["a", "b"], 8, _pipeline(), store=images)
    plain = build_transform(None)(image=_image())["image"]
    assert not torch.equal(dataset[0]["image"], plain)  # Mass positive: inverted
    torch.testing.assert_close(dataset[1]["image"], plain)
