"""Every selectable loss and sampler trains through the real config composition and LightningModule."""

from __future__ import annotations

from pathlib import Path

import lightning.pytorch as L
import pytest
import torch
from hydra import compose, initialize_config_dir

from training.models.factory import model_from_config
from training.pipeline import build_datamodule

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
LOSSES = sorted(p.stem for p in (CONFIGS / "loss").glob("*.yaml"))
SAMPLERS = sorted(p.stem for p in (CONFIGS / "sampler").glob("*.yaml"))


class LossRecorder(L.Callback):
    def __init__(self):
        self.losses = []

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        self.losses.append(float(outputs["loss"]))


def _fit(manifest: Path, *overrides: str):
    with initialize_config_dir(str(CONFIGS), version_base="1.3"):
        cfg = compose("train", overrides=["data=manifest", f"data.source.manifest={manifest}", "data.image_size=32",
                                          "data.batch_size=4", "model=resnet18", "model.backbone=resnet10t", *overrides])  # fmt: skip
    datamodule = build_datamodule(cfg)
    datamodule.setup("fit")
    model = model_from_config(cfg)
    recorder = LossRecorder()
    trainer = L.Trainer(max_steps=3, limit_val_batches=1, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, callbacks=[recorder])  # fmt: skip
    trainer.fit(model, datamodule=datamodule)
    return cfg, model, trainer, recorder


@pytest.mark.parametrize("loss", LOSSES)
def test_every_loss_trains(make_manifest, loss):
    cfg, model, _, recorder = _fit(make_manifest(n=48), f"loss={loss}")
    assert type(model.loss).__name__ == cfg.loss._target_.rsplit(".", 1)[1]
    assert len(recorder.losses) == 3 and all(torch.isfinite(torch.tensor(recorder.losses)))
    torch.testing.assert_close(model.loss.class_counts, torch.as_tensor(model.train_counts))  # counts from the manifest


@pytest.mark.parametrize("sampler", SAMPLERS)
def test_every_sampler_feeds_training(make_manifest, sampler):
    cfg, _, trainer, recorder = _fit(make_manifest(n=48), f"sampler={sampler}")
    used = trainer.train_dataloader.sampler
    expected = {"random": "RandomSampler", "class_aware": "ClassAwareSampler", "repeat_factor": "RepeatFactorSampler"}
    assert type(used).__name__ == expected[cfg.sampler.name]
    assert len(recorder.losses) == 3
