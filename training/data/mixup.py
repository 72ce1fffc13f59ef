"""MixUp (Zhang et al. 2018) and Balanced-MixUp (Galdran et al. 2021) of the training batches, for multi-label targets.

Lightning callbacks that replace a training batch before the step; evaluation sees real images only.
Balanced-MixUp's partner weight ``lam ~ Beta(alpha, 1)`` is mostly small, so the instance batch dominates and the
tail is added as a light mix, as the authors' released code weights it; its partners come from the class-aware
sampler so the sampler package stays the one owner of balanced draws.

A mixed cell is labelled only when both sources were; otherwise it stays -1, so the loss does not learn a
fraction of an unknown label. Every random choice is a function of ``(seed, rank, epoch[, batch])``, never of the
global generators (which dropout uses and checkpoints hold), so a resumed fit mixes exactly as an uninterrupted one.
"""

from __future__ import annotations

import copy

import lightning.pytorch as L
import numpy as np
import torch

from training.data.dataset import collate_items
from training.data.transforms import stream_seed
from training.samplers.base import SamplingStrategy

#: Last key of every seed drawn here, so the mixing streams are unrelated to the loader's and augmentation's
#: streams of the same ``(seed, rank, epoch)`` (the data module uses 0 and 1).
MIXUP_STREAM = 2


def mix(images: torch.Tensor, targets: torch.Tensor, partner_images: torch.Tensor, partner_targets: torch.Tensor,
        weight: float) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """``weight x + (1 - weight) x_partner`` for images and targets; a cell unlabelled (-1) in either stays -1."""
    mixed_images = weight * images + (1.0 - weight) * partner_images
    mixed = weight * targets + (1.0 - weight) * partner_targets
    unlabelled = (targets < 0) | (partner_targets < 0)
    return mixed_images, torch.where(unlabelled, torch.full_like(mixed, -1.0), mixed)


def step_rng(seed: int, rank: int, epoch: int, batch_idx: int) -> np.random.Generator:
    """The generator of one training step's mixing choices."""
    return np.random.default_rng(stream_seed(seed, rank, epoch, batch_idx, MIXUP_STREAM))


class MixUp(L.Callback):
    """Mix each training batch with a random pairing of itself (Zhang et al. 2018).

    Args:
        alpha: ``lam ~ Beta(alpha, alpha)``; the MixUp paper's ImageNet range is 0.1-0.4.
    """

    def __init__(self, alpha: float = 0.2):
        if alpha <= 0:
            raise ValueError(f"mixup alpha must be positive, got {alpha}")
        self.alpha = float(alpha)

    def seed_of(self, trainer) -> int:
        datamodule = getattr(trainer, "datamodule", None)
        return int(getattr(datamodule, "seed", 0))

    def on_train_batch_start(self, trainer, pl_module, batch: dict, batch_idx: int) -> None:
        rng = step_rng(self.seed_of(trainer), trainer.global_rank, trainer.current_epoch, batch_idx)
        weight = float(rng.beta(self.alpha, self.alpha))
        order = torch.as_tensor(rng.permutation(len(batch["target"])), device=batch["target"].device)
        batch["image"], batch["target"] = mix(batch["image"], batch["target"], batch["image"][order],
                                              batch["target"][order], weight)  # fmt: skip


class BalancedMixUp(MixUp):
    """Mix each training batch with as many images drawn class-balanced (Galdran et al. 2021).

    Args:
        alpha: the balanced partner's weight is ``lam ~ Beta(alpha, 1)``; the authors' runs used 0.1 to 0.3.
        partner: the partners' sampling strategy; seeded apart from the training sampler's, so a class-aware
            training sampler does not pair every image with itself.
    """

    def __init__(self, partner: SamplingStrategy, alpha: float = 0.2):
        super().__init__(alpha)
        self.partner = partner
        self.order: np.ndarray | None = None

    def on_train_epoch_start(self, trainer, pl_module) -> None:
        """Draw this epoch's partners and seed their augmentation from ``(seed, rank, epoch)``."""
        dataset = trainer.datamodule.datasets["train"]
        seed, rank, epoch = self.seed_of(trainer), trainer.global_rank, trainer.current_epoch
        sampler = self.partner.build(dataset.targets.numpy(), stream_seed(seed, rank, MIXUP_STREAM))
        sampler.set_epoch(epoch)
        self.order = np.fromiter(iter(sampler), dtype=np.int64)
        self.images = copy.copy(dataset)  # the same images and targets, its own augmentation stream
        self.images.transform = copy.deepcopy(dataset.transform)
        self.images.transform.set_random_seed(stream_seed(seed, rank, epoch, MIXUP_STREAM))

    def partners(self, batch_idx: int, size: int) -> np.ndarray:
        """The step's ``size`` partner indices: the next ones of the epoch's draw, from its start again if needed."""
        return self.order[(batch_idx * size + np.arange(size)) % len(self.order)]

    def on_train_batch_start(self, trainer, pl_module, batch: dict, batch_idx: int) -> None:
        rng = step_rng(self.seed_of(trainer), trainer.global_rank, trainer.current_epoch, batch_idx)
        balanced_weight = float(rng.beta(self.alpha, 1.0))
        targets = batch["target"]
        drawn = collate_items(self.images.__getitems__(self.partners(batch_idx, len(targets)).tolist()))
        partner_images = drawn["image"].to(batch["image"].device, batch["image"].dtype)
        partner_targets = drawn["target"].to(targets.device, targets.dtype)
        batch["image"], batch["target"] = mix(batch["image"], targets, partner_images, partner_targets,
                                              1.0 - balanced_weight)  # fmt: skip
