"""two_phase=head_first (training/models/two_phase.py, HeadFirst) and its learning-rate schedule
(training/models/schedule.py, phased_multiplier): hand-computed rates per parameter group, the freeze and unfreeze
at epoch starts, and a two-epoch fit in which phase 1 leaves the backbone untouched."""

import logging
from types import SimpleNamespace

import lightning.pytorch as L
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from torch.utils.data import DataLoader

from training.errors import UserError
from training.models.module import MultiLabelClassifier
from training.models.schedule import HeadOnlyPhase, phased_multiplier, warmup_cosine
from training.models.two_phase import HeadFirst

MODEL = {"backbone": "resnet10t", "pretrained": False, "lr": 1.5e-5, "head_lr": 1.5e-4, "weight_decay": 0.05,
         "warmup_epochs": 1, "min_lr_factor": 0.0, "head": None, "aux_loss": {"name": "none", "weight": 0.0}}  # fmt: skip
LOSS = {"name": "bce", "_target_": "training.losses.bce.BCELoss"}


def _model(**cfg) -> MultiLabelClassifier:
    return MultiLabelClassifier({**MODEL, **cfg}, LOSS, ["A", "B", "C"])


def test_phase_one_holds_its_factor_then_warm_up_and_cosine_run_over_the_rest():
    """10 phase-one steps of 30, warm-up 4: steps 10-13 rise 1/4 .. 1, then the cosine over the last 16 steps."""
    rate = [phased_multiplier(s, 10, 6.0, total_steps=30, warmup_steps=4, min_factor=0.0) for s in range(31)]
    assert rate[:10] == [6.0] * 10
    assert rate[10:14] == pytest.approx([0.25, 0.5, 0.75, 1.0])
    assert rate[22] == pytest.approx(0.5)  # half way through the 16 cosine steps
    assert rate[30] == pytest.approx(0.0)
    assert [phased_multiplier(s, 0, 6.0, 30, 4, 0.1) for s in range(31)] == [
        warmup_cosine(s, 30, 4, 0.1) for s in range(31)
    ]  # no phase one: the plain schedule


def _rates(model: MultiLabelClassifier, steps: int) -> tuple[float, float]:
    """(head, backbone) learning rates after ``steps`` scheduler steps of a 3-epoch, 30-step run."""
    model._trainer = SimpleNamespace(estimated_stepping_batches=30, max_epochs=3)
    configured = model.configure_optimizers()
    optimizer, scheduler = configured["optimizer"], configured["lr_scheduler"]["scheduler"]
    for _ in range(steps):
        optimizer.step()
        scheduler.step()
    of = {id(p): g["lr"] for g in optimizer.param_groups for p in g["params"]}
    backbone = next(p for p in model.backbone.parameters() if p.ndim > 1)
    return of[id(model.head.weight)], of[id(backbone)]


def _with_phase(**cfg) -> MultiLabelClassifier:
    model = _model(**cfg)
    model.head_only_phase = HeadOnlyPhase(epochs=1, lr=1e-3)
    return model


@pytest.mark.parametrize("head_lr", [1.5e-4, None])
@pytest.mark.parametrize("step", [0, 9, 10, 19])
def test_the_head_alone_learns_at_its_phase_one_rate_then_both_at_theirs(head_lr, step):
    """Phase 1 = epoch 0 (steps 0-9): head 1e-3, backbone 0. Then one warm-up epoch (10 steps) from 1/10 of each
    group's rate to all of it: step 10 head 1.5e-5 (1.5e-4 / 10), backbone 1.5e-6; step 19 the full rates. Without
    model.head_lr the head's phase-2 rate is model.lr."""
    head = head_lr or MODEL["lr"]
    expected = {0: (1e-3, 0.0), 9: (1e-3, 0.0), 10: (head / 10, 1.5e-6), 19: (head, 1.5e-5)}[step]
    assert _rates(_with_phase(head_lr=head_lr), step) == pytest.approx(expected, rel=1e-9)


def test_without_a_phase_the_rates_are_the_plain_schedules():
    assert _rates(_model(), 0) == pytest.approx((1.5e-5, 1.5e-6))  # step 0 of a 10-step warm-up


def _trainer(epoch: int, max_epochs: int = 3):
    return SimpleNamespace(current_epoch=epoch, max_epochs=max_epochs,
                           checkpoint_callbacks=[ModelCheckpoint(monitor="val/mAP", mode="max")])  # fmt: skip


def test_the_callback_freezes_for_phase_one_and_unfreezes_once_after_it():
    model, callback = _model(), HeadFirst(epochs=2, lr=1e-3)
    callback.setup(_trainer(0), model, "fit")
    assert model.head_only_phase == HeadOnlyPhase(epochs=2, lr=1e-3)
    for epoch, frozen in ((0, True), (1, True), (2, False)):
        trainer = _trainer(epoch)
        trainer.checkpoint_callbacks[0].best_model_score = torch.tensor(0.9)
        callback.on_train_epoch_start(trainer, model)
        assert model.backbone_frozen is frozen
        assert all(p.requires_grad is not frozen for p in model.backbone.parameters())
        assert all(p.requires_grad for p in model.head.parameters())
        # at the switch the selection starts afresh: a phase-1 epoch cannot be the kept checkpoint
        assert (trainer.checkpoint_callbacks[0].best_model_score is None) is (epoch == 2)


def test_a_run_no_longer_than_phase_one_keeps_its_last_epoch_for_phase_two(caplog):
    model, callback = _model(), HeadFirst(epochs=10, lr=1e-3)
    with caplog.at_level(logging.WARNING):
        callback.setup(_trainer(0, max_epochs=1), model, "fit")
    assert model.head_only_phase.epochs == 0 and "shortened to 0" in caplog.text
    callback.on_train_epoch_start(_trainer(0, max_epochs=1), model)
    assert not getattr(model, "backbone_frozen", False)


def test_a_backbone_frozen_for_the_whole_run_is_refused():
    model = _model()
    model.freeze_backbone()  # as stage=crt does before the fit
    with pytest.raises(UserError, match="two_phase=none"):
        HeadFirst(epochs=1, lr=1e-3).setup(_trainer(0), model, "fit")


class _Snapshots(L.Callback):
    """The first backbone weight and the head weight at the end of every epoch."""

    def __init__(self):
        self.seen = []

    def on_train_epoch_end(self, trainer, pl_module):
        backbone = next(p for p in pl_module.backbone.parameters() if p.ndim > 1)
        self.seen.append((backbone.detach().clone(), pl_module.head.weight.detach().clone()))


def test_a_fit_leaves_the_backbone_untouched_in_phase_one_and_trains_it_in_phase_two():
    torch.manual_seed(0)
    model = _model()
    start = next(p for p in model.backbone.parameters() if p.ndim > 1).detach().clone()
    head_start = model.head.weight.detach().clone()
    batches = [{"image": torch.randn(4, 1, 32, 32), "target": (torch.rand(4, 3) < 0.5).float()} for _ in range(2)]
    snapshots = _Snapshots()
    trainer = L.Trainer(max_epochs=2, accelerator="cpu", logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, limit_val_batches=0,
                        callbacks=[HeadFirst(epochs=1, lr=1e-2), snapshots])  # fmt: skip
    trainer.fit(model, train_dataloaders=DataLoader(batches, batch_size=None))
    (backbone_1, head_1), (backbone_2, _) = snapshots.seen
    assert torch.equal(backbone_1, start) and not torch.equal(head_1, head_start)
    assert not torch.equal(backbone_2, backbone_1)
