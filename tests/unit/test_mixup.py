"""MixUp and Balanced-MixUp (training/data/mixup.py): hand-computed mixes, unlabelled cells kept unlabelled, seeded
draws, and balanced partners that follow the class-aware distribution."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from hydra import compose, initialize_config_dir

from tests.conftest import PROJECT_ROOT
from training.data.mixup import BalancedMixUp, MixUp, mix, step_rng
from training.pipeline import config_callbacks
from training.samplers.class_aware import ClassAwareSampling


def test_mix_by_hand_with_unlabelled_cells():
    images = torch.tensor([[[[1.0, 2.0]]], [[[5.0, 6.0]]]])  # (2, 1, 1, 2)
    partners = torch.tensor([[[[3.0, 0.0]]], [[[1.0, 1.0]]]])
    targets = torch.tensor([[1.0, 0.0, -1.0], [0.0, 1.0, 1.0]])
    partner_targets = torch.tensor([[0.0, 0.0, 1.0], [1.0, -1.0, 1.0]])
    mixed_images, mixed_targets = mix(images, targets, partners, partner_targets, 0.7)
    # 0.7 * 1 + 0.3 * 3 = 1.6, 0.7 * 2 + 0.3 * 0 = 1.4; 0.7 * 5 + 0.3 * 1 = 3.8, 0.7 * 6 + 0.3 * 1 = 4.5
    assert torch.allclose(mixed_images, torch.tensor([[[[1.6, 1.4]]], [[[3.8, 4.5]]]]))
    # a cell unlabelled (-1) on either side stays -1; the others are 0.7 a + 0.3 b
    assert torch.allclose(mixed_targets, torch.tensor([[0.7, 0.0, -1.0], [0.3, -1.0, 1.0]]))
    mask = mixed_targets >= 0  # what the training step hands the loss
    assert mask.tolist() == [[True, True, False], [True, False, True]]


def _trainer(seed=7, rank=0, epoch=0, dataset=None):
    datamodule = SimpleNamespace(seed=seed, datasets={"train": dataset})
    return SimpleNamespace(datamodule=datamodule, global_rank=rank, current_epoch=epoch)


def test_mixup_pairs_the_batch_with_itself_by_the_step_seed():
    images = torch.arange(4.0).reshape(4, 1, 1, 1)
    targets = torch.tensor([[1.0, 0.0], [0.0, 1.0], [-1.0, 1.0], [0.0, 0.0]])
    batch = {"image": images.clone(), "target": targets.clone()}
    MixUp(alpha=0.4).on_train_batch_start(_trainer(epoch=2), None, batch, 5)
    rng = step_rng(7, 0, 2, 5)  # what the callback draws: the weight, then the pairing
    weight, order = rng.beta(0.4, 0.4), rng.permutation(4)
    expected_images, expected_targets = mix(images, targets, images[order], targets[order], float(weight))
    assert torch.allclose(batch["image"], expected_images) and torch.allclose(batch["target"], expected_targets)
    again = {"image": images.clone(), "target": targets.clone()}
    MixUp(alpha=0.4).on_train_batch_start(_trainer(epoch=2), None, again, 5)
    assert torch.equal(again["image"], batch["image"])  # a resumed epoch mixes as the first time
    other = {"image": images.clone(), "target": targets.clone()}
    MixUp(alpha=0.4).on_train_batch_start(_trainer(epoch=2), None, other, 6)
    assert not torch.equal(other["image"], batch["image"])  # the next step draws anew


class ConstantImages:
    """A training split whose image ``i`` is the constant ``i`` (enough to read which partner was mixed in)."""

    def __init__(self, targets: np.ndarray):
        self.targets = torch.as_tensor(targets, dtype=torch.float32)
        self.transform = SimpleNamespace(set_random_seed=lambda seed: None)

    def __getitems__(self, indices):
        return [{"image": torch.full((1, 2, 2), float(i)), "target": self.targets[i], "index": i} for i in indices]


def _single_label(counts) -> np.ndarray:
    """One positive per image, class ``c`` on ``counts[c]`` images: a long tail to balance."""
    rows = [np.eye(len(counts))[c] for c, n in enumerate(counts) for _ in range(n)]
    return np.asarray(rows)


def test_balanced_mixup_weights_the_class_aware_partner_by_hand():
    targets = _single_label([6, 2])
    dataset = ConstantImages(targets)
    callback = BalancedMixUp(ClassAwareSampling(), alpha=0.3)
    trainer = _trainer(epoch=1, dataset=dataset)
    callback.on_train_epoch_start(trainer, None)
    batch = {"image": torch.zeros(3, 1, 2, 2), "target": torch.tensor([[1.0, 0.0], [-1.0, 0.0], [1.0, 0.0]])}
    callback.on_train_batch_start(trainer, None, batch, 1)
    partners = callback.order[3:6]  # step 1 of batches of 3
    balanced = step_rng(7, 0, 1, 1).beta(0.3, 1.0)
    assert torch.allclose(batch["image"][:, 0, 0, 0], torch.as_tensor(balanced * partners, dtype=torch.float32))
    expected = mix(torch.zeros(3, 1), torch.tensor([[1.0, 0.0], [-1.0, 0.0], [1.0, 0.0]]), torch.zeros(3, 1),
                   dataset.targets[partners], 1.0 - balanced)[1]  # fmt: skip
    assert torch.allclose(batch["target"], expected)
    assert batch["target"][1, 0] == -1  # unlabelled in the batch image: unlabelled after mixing


def test_balanced_partners_follow_the_class_balanced_distribution():
    targets = _single_label([900, 90, 10])  # 90 % / 9 % / 1 % of the images
    callback = BalancedMixUp(ClassAwareSampling(epoch_multiplier=3.0), alpha=0.2)
    callback.on_train_epoch_start(_trainer(dataset=ConstantImages(targets)), None)
    share = np.bincount(targets[callback.order].argmax(axis=1), minlength=3) / len(callback.order)
    assert np.allclose(share, 1 / 3, atol=0.03)  # 3,000 draws: each class a third, not its natural share
    # the draw is seeded apart from a class-aware training sampler of the same run seed
    training_draw = np.fromiter(iter(ClassAwareSampling(epoch_multiplier=3.0).build(targets, 7)), dtype=np.int64)
    assert not np.array_equal(training_draw, callback.order)


def test_balanced_weight_has_the_beta_alpha_1_mean():
    weights = [step_rng(7, 0, 0, step).beta(0.2, 1.0) for step in range(4000)]
    assert np.mean(weights) == pytest.approx(0.2 / 1.2, abs=0.01)  # mostly the instance image


@pytest.mark.parametrize(("choice", "kind"), [("mixup", MixUp), ("balanced", BalancedMixUp), ("none", None)])
def test_the_mixup_configs_build_their_callback(choice, kind):
    with initialize_config_dir(str(PROJECT_ROOT / "configs"), version_base=None):
        cfg = compose("train", overrides=[f"mixup={choice}"])
    built = [callback for callback in config_callbacks(cfg) if isinstance(callback, MixUp)]
    assert [type(callback) for callback in built] == ([kind] if kind else [])
