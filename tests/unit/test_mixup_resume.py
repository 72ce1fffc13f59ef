"""Balanced-MixUp inside a real fit: the training step receives the mixed batch, and a fit resumed from an
end-of-epoch checkpoint mixes, trains and ends exactly as the uninterrupted one (small in-process fits, seconds)."""

from __future__ import annotations

import lightning.pytorch as L
import torch
from lightning.pytorch.callbacks import Callback, ModelCheckpoint

from training.checkpoint_io import AtomicCheckpointIO
from training.data.datamodule import CXRDataModule
from training.data.mixup import BalancedMixUp
from training.data.sources import ManifestSource
from training.models.module import MultiLabelClassifier
from training.samplers.class_aware import ClassAwareSampling
from training.samplers.random import RandomSampling

MODEL = {"backbone": "test_efficientnet", "pretrained": False, "timm_kwargs": {"drop_rate": 0.5}, "lr": 1e-3,
         "weight_decay": 0.01}  # fmt: skip
LOSS = {"name": "bce", "_target_": "training.losses.bce.BCELoss"}


class TrainingBatches(Callback):
    """The batch each training step was given (after the mixing callback, which runs before it) and its loss."""

    def __init__(self):
        self.steps = []

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        self.steps.append((trainer.current_epoch, batch["image"].clone(), batch["target"].clone(),
                           float(outputs["loss"])))  # fmt: skip


def fit(manifest, labels, folder, ckpt_path=None):
    L.seed_everything(0, workers=True)
    datamodule = CXRDataModule(ManifestSource(str(manifest)), labels, image_size=24, batch_size=4,
                               sampler=RandomSampling(), seed=7)  # fmt: skip
    datamodule.setup("fit")
    seen = TrainingBatches()
    checkpoints = ModelCheckpoint(dirpath=folder, filename="{epoch}", save_top_k=-1, save_on_train_epoch_end=True)
    trainer = L.Trainer(max_epochs=3, accelerator="cpu", logger=False, enable_progress_bar=False,
                        enable_model_summary=False, num_sanity_val_steps=0, plugins=[AtomicCheckpointIO()],
                        callbacks=[checkpoints, BalancedMixUp(ClassAwareSampling(), alpha=0.5), seen])  # fmt: skip
    model = MultiLabelClassifier(MODEL, LOSS, labels)
    trainer.fit(model, datamodule=datamodule, ckpt_path=ckpt_path)
    return seen.steps, model


def test_the_training_step_sees_mixed_targets_and_a_resumed_fit_repeats_the_straight_one(make_manifest, task1_labels,
                                                                                         tmp_path):  # fmt: skip
    path = make_manifest(n=48)
    straight, straight_model = fit(path, task1_labels, tmp_path / "a")
    targets = torch.cat([step[2] for step in straight])
    assert ((targets > 0) & (targets < 1)).any()  # soft targets: the step trained on the mix, not the loader's batch
    assert set(targets[targets < 0].tolist()) <= {-1.0}

    resumed, resumed_model = fit(path, task1_labels, tmp_path / "b", ckpt_path=tmp_path / "a" / "epoch=0.ckpt")
    after_first = [step for step in straight if step[0] > 0]
    assert [step[0] for step in resumed] == [step[0] for step in after_first]
    for (epoch, images, mixed, loss), (_, want_images, want_mixed, want_loss) in zip(resumed, after_first, strict=True):
        assert torch.equal(images, want_images) and torch.equal(mixed, want_mixed), epoch
        assert loss == want_loss, epoch  # exact, not close
    for (name, got), (_, want) in zip(resumed_model.state_dict().items(), straight_model.state_dict().items(),
                                      strict=True):  # fmt: skip
        assert torch.equal(got, want), name
