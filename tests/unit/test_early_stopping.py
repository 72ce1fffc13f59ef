"""early_stopping=patience: the training stops once the metric the kept checkpoint is chosen by stops improving."""

import lightning.pytorch as L
import torch
from hydra import compose, initialize_config_dir
from lightning.pytorch.callbacks import EarlyStopping

from training.config_files import CONFIGS
from training.pipeline import config_callbacks

#: The validation metric per epoch: it improves for three epochs, then never again.
CURVE = [0.1, 0.2, 0.3, 0.3, 0.25, 0.3, 0.29, 0.3, 0.3, 0.3, 0.3, 0.3]


class _Curve(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(1, 1)

    def training_step(self, batch, batch_idx):
        return self.layer(batch[0]).pow(2).mean()

    def validation_step(self, batch, batch_idx):
        self.log("val/mAP", CURVE[self.current_epoch])

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


def _callbacks(*overrides: str) -> list:
    with initialize_config_dir(str(CONFIGS), version_base="1.3"):
        return config_callbacks(compose("train", overrides=list(overrides)))


def test_patience_stops_after_that_many_validations_without_improvement_on_the_monitored_metric():
    assert not any(isinstance(c, EarlyStopping) for c in _callbacks())  # off by default
    (stopping,) = [c for c in _callbacks("early_stopping=patience", "callbacks.early_stopping.patience=3")
                   if isinstance(c, EarlyStopping)]  # fmt: skip
    assert (stopping.monitor, stopping.mode, stopping.patience) == ("val/mAP", "max", 3)
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.ones(4, 1)), batch_size=2)
    trainer = L.Trainer(max_epochs=len(CURVE), callbacks=[stopping], logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
                        accelerator="cpu")  # fmt: skip
    trainer.fit(_Curve(), data, data)
    # Best 0.3 at epoch 2; epochs 3, 4 and 5 do not beat it (equal is no improvement): it stops after epoch 5.
    assert trainer.current_epoch == 6 and stopping.stopped_epoch == 5


def test_it_follows_the_checkpoints_monitor_and_mode():
    (stopping,) = [c for c in _callbacks("early_stopping=patience", "checkpoint.monitor=val/mECE", "checkpoint.mode=min")
                   if isinstance(c, EarlyStopping)]  # fmt: skip
    assert (stopping.monitor, stopping.mode) == ("val/mECE", "min")
