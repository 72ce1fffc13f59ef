"""EMA (configs/ema/ema.yaml) on the platform's own module and data module: the config builds the callback, a
resumed fit ends exactly where an uninterrupted one does, and the module's fixed state survives averaging.

The averaging arithmetic itself is checked against a hand computation in tests/unit/test_ema.py.
"""

from __future__ import annotations

from pathlib import Path

import lightning.pytorch as L
import torch
from hydra import compose, initialize_config_dir
from lightning.pytorch.callbacks import Callback, ModelCheckpoint

from tests.conftest import PROJECT_ROOT
from tests.unit.test_resume_determinism import LOSS, MODEL, _datamodule
from training.checkpoint_io import AtomicCheckpointIO
from training.models.ema import EMA
from training.models.module import MultiLabelClassifier
from training.pipeline import config_callbacks

EPOCHS = 2


def test_the_ema_config_builds_the_callback():
    with initialize_config_dir(str(PROJECT_ROOT / "configs"), version_base=None):
        cfg = compose("train", overrides=["ema=ema"])
        plain = compose("train")
    (callback,) = [callback for callback in config_callbacks(cfg) if isinstance(callback, EMA)]
    assert (callback.decay, callback.warmup_steps) == (cfg.callbacks.ema.decay, cfg.callbacks.ema.warmup_steps)
    assert not any(isinstance(callback, EMA) for callback in config_callbacks(plain))  # ema: none by default


class FirstValidation(Callback):
    """What the first validation (here the sanity check) runs on; listed after the EMA callback, so it sees the
    module once the average is swapped in."""

    def __init__(self):
        self.seen = None

    def on_validation_epoch_start(self, trainer, module):
        if self.seen is None:
            self.seen = {name: value.clone() for name, value in module.state_dict().items()}


def _fit(manifest, labels, folder: Path, ckpt_path: Path | None = None):
    L.seed_everything(0, workers=True)
    datamodule = _datamodule(manifest, labels)
    first = FirstValidation()
    checkpoints = ModelCheckpoint(dirpath=folder, filename="{epoch}", save_top_k=-1, save_on_train_epoch_end=True)
    ema = EMA(decay=0.9, warmup_steps=2)  # fast, so that 8 steps move the average
    trainer = L.Trainer(max_epochs=EPOCHS, accelerator="cpu", logger=False, enable_progress_bar=False,
                        enable_model_summary=False, num_sanity_val_steps=1, callbacks=[checkpoints, ema, first],
                        plugins=[AtomicCheckpointIO()])  # fmt: skip
    model = MultiLabelClassifier(MODEL, LOSS, labels)
    trainer.fit(model, datamodule=datamodule, ckpt_path=ckpt_path)
    return datamodule, model, first.seen


def _load(path: Path) -> dict:
    return AtomicCheckpointIO().load_checkpoint(path, map_location="cpu")


def test_ema_on_the_platform_module_resumes_exactly_and_keeps_its_fixed_state(make_manifest, task1_labels,
                                                                               tmp_path):  # fmt: skip
    path = make_manifest(n=48)  # 16 training images, batch 4: 4 steps an epoch
    datamodule, model, sanity = _fit(path, task1_labels, tmp_path / "straight")
    _fit(path, task1_labels, tmp_path / "resumed", ckpt_path=tmp_path / "straight" / "epoch=0.ckpt")

    straight, resumed = _load(tmp_path / "straight" / "epoch=1.ckpt"), _load(tmp_path / "resumed" / "epoch=1.ckpt")
    for key in ("state_dict", "current_model_state", "averaging_state"):
        assert straight[key].keys() == resumed[key].keys()
        for name, value in straight[key].items():
            assert torch.equal(resumed[key][name], value), (key, name)  # exact, not close

    average, trained = straight["state_dict"], straight["current_model_state"]
    assert int(straight["averaging_state"]["n_averaged"]) == straight["global_step"] == 8
    assert not torch.allclose(average["head.weight"], trained["head.weight"])  # an average, not the weights
    counts = torch.as_tensor(datamodule.class_counts, dtype=torch.float32)
    for name in ("train_counts", "train_size", "logit_temperature"):  # set once, never trained: bit-exact
        assert torch.equal(average[name], trained[name]), name
    assert torch.equal(average["train_counts"], counts)
    # The sanity check ran before any update: on the model as the fit started (label statistics set), not on
    # the copy Lightning took before the module's setup ran.
    assert torch.equal(sanity["train_counts"], counts)
    # After fit the module holds the average (what the pipeline's test phase then replaces with best.ckpt's).
    for name, value in model.state_dict().items():
        assert torch.equal(value, average[name]), name
