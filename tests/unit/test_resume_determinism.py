"""A fit resumed from an end-of-epoch checkpoint repeats the uninterrupted fit exactly: the same draws, the same
augmentations, the same dropout masks, hence the same losses, metrics and weights.

The slow end-to-end version (a killed ``python -m training.train`` compared with one never stopped) is in
tests/integration/test_resume.py; these run a small in-process fit in seconds.
"""

import random
from pathlib import Path

import lightning.pytorch as L
import numpy as np
import pytest
import torch
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from omegaconf import OmegaConf

from training.checkpoint_io import AtomicCheckpointIO, global_rng_state, restore_global_rng_state
from training.data.datamodule import CXRDataModule
from training.data.sources import ManifestSource
from training.models.module import MultiLabelClassifier
from training.samplers.class_aware import ClassAwareSampling
from training.samplers.random import RandomSampling

EPOCHS = 3
# timm's smallest test network; drop_rate: it draws dropout masks from the global torch generator every step, as a
# real model may.
MODEL = {"backbone": "test_efficientnet", "pretrained": False, "timm_kwargs": {"drop_rate": 0.5}, "lr": 1e-3,
         "weight_decay": 0.01}  # fmt: skip
LOSS = {"name": "bce", "_target_": "training.losses.bce.BCELoss"}
AUGMENT = OmegaConf.load(Path(__file__).resolve().parents[2] / "configs" / "augment" / "default.yaml").train


def _datamodule(manifest, labels, sampler=None, workers=0) -> CXRDataModule:
    module = CXRDataModule(ManifestSource(str(manifest)), labels, image_size=24, batch_size=4, num_workers=workers,
                           train_augment=AUGMENT, sampler=sampler or RandomSampling(), seed=7)  # fmt: skip
    module.setup("fit")
    return module


def _batches(loader) -> list[tuple[list[int], torch.Tensor]]:
    return [(batch["index"].tolist(), batch["image"]) for batch in loader]


def _same(first, second) -> bool:
    return len(first) == len(second) and all(
        a == c and torch.equal(b, d) for (a, b), (c, d) in zip(first, second, strict=True)
    )


@pytest.mark.parametrize("sampler", [RandomSampling(), ClassAwareSampling()], ids=["random", "class_aware"])
def test_data_module_state_resumes_at_the_next_epoch(make_manifest, task1_labels, tmp_path, sampler):
    path = make_manifest(n=48)
    straight = _datamodule(path, task1_labels, sampler)
    epochs = [_batches(straight.train_dataloader()) for _ in range(EPOCHS)]
    assert not _same(epochs[1], epochs[2])  # each epoch draws and augments anew

    state_after_two = _datamodule(path, task1_labels, sampler)
    for _ in range(2):
        _batches(state_after_two.train_dataloader())
    torch.save(state_after_two.state_dict(), tmp_path / "state.pt")
    resumed = _datamodule(path, task1_labels, sampler)  # a new process: nothing carried over but the checkpoint
    resumed.load_state_dict(torch.load(tmp_path / "state.pt", weights_only=True))
    assert _same(_batches(resumed.train_dataloader()), epochs[2])


def test_training_passes_do_not_draw_from_the_global_generators(make_manifest, task1_labels):
    """The model's dropout stream must not depend on how often loaders were started, which a resume changes."""
    module = _datamodule(make_manifest(n=48), task1_labels, workers=0)
    torch.manual_seed(0)
    before = torch.get_rng_state()
    _batches(module.train_dataloader())
    _batches(module.val_dataloader())
    assert torch.equal(torch.get_rng_state(), before)


def test_global_rng_state_survives_a_weights_only_checkpoint(tmp_path):
    torch.manual_seed(1), np.random.seed(2), random.seed(3)
    np.random.normal()  # numpy caches the second Gaussian of a pair: part of the state
    torch.save({"rng": global_rng_state()}, tmp_path / "state.pt")
    expected = torch.rand(3), np.random.normal(size=3), random.random()
    torch.manual_seed(9), np.random.seed(9), random.seed(9)
    restore_global_rng_state(torch.load(tmp_path / "state.pt", weights_only=True)["rng"])
    got = torch.rand(3), np.random.normal(size=3), random.random()
    assert torch.equal(got[0], expected[0]) and np.array_equal(got[1], expected[1]) and got[2] == expected[2]


class _Recorder(Callback):
    """Each training step's epoch, images drawn (indices and augmented pixels) and loss."""

    def __init__(self):
        self.steps = []

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        self.steps.append((trainer.current_epoch, batch["index"].tolist(), batch["image"].clone(),
                           float(outputs["loss"])))  # fmt: skip


def _fit(manifest, labels, folder, sampler, workers, ckpt_path=None):
    L.seed_everything(0, workers=True)  # as training/pipeline.py does, in the resumed process too
    datamodule = _datamodule(manifest, labels, sampler, workers)
    model = MultiLabelClassifier(MODEL, LOSS, labels)
    recorder = _Recorder()
    checkpoints = ModelCheckpoint(dirpath=folder, filename="{epoch}", save_top_k=-1, save_on_train_epoch_end=True)
    trainer = L.Trainer(max_epochs=EPOCHS, accelerator="cpu", logger=False, enable_progress_bar=False,
                        enable_model_summary=False, num_sanity_val_steps=0, callbacks=[checkpoints, recorder],
                        plugins=[AtomicCheckpointIO()])  # fmt: skip
    trainer.fit(model, datamodule=datamodule, ckpt_path=ckpt_path)
    return recorder.steps, model, float(trainer.callback_metrics["val/mAP"])


@pytest.mark.parametrize(("sampler", "workers"), [(RandomSampling(), 0), (ClassAwareSampling(), 2)],
                         ids=["random", "class_aware-2-workers"])  # fmt: skip
def test_fit_resumed_after_an_epoch_repeats_the_uninterrupted_fit(make_manifest, task1_labels, tmp_path, sampler,
                                                                  workers):  # fmt: skip
    """Resumed from epoch 0's checkpoint: epoch 1 is the first of the new fit (where Lightning tells the sampler
    its epoch too late), epoch 2 checks that the streams stay aligned after it."""
    path = make_manifest(n=48)
    straight, straight_model, straight_map = _fit(path, task1_labels, tmp_path / "a", sampler, workers)
    resumed, resumed_model, resumed_map = _fit(path, task1_labels, tmp_path / "a", sampler, workers,
                                               ckpt_path=tmp_path / "a" / "epoch=0.ckpt")  # fmt: skip

    after_first = [step for step in straight if step[0] > 0]
    assert [s[0] for s in resumed] == [s[0] for s in after_first] and {s[0] for s in resumed} == {1, 2}
    for (epoch, indices, images, loss), (_, want_indices, want_images, want_loss) in zip(
        resumed, after_first, strict=True
    ):
        assert indices == want_indices, epoch
        assert torch.equal(images, want_images), epoch
        assert loss == want_loss, epoch  # exact, not close
    assert resumed_map == straight_map
    for (name, got), (_, want) in zip(
        resumed_model.state_dict().items(), straight_model.state_dict().items(), strict=True
    ):
        assert torch.equal(got, want), name
