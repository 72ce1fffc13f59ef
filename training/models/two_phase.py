"""The two-phase schedules: the mixture-of-experts head's (``two_phase=moe``, with ``head=moe``), below, and the
head-first warm-up of a pretrained backbone (``two_phase=head_first``, :class:`HeadFirst`).

At ``switch_epoch`` the backbone is frozen as cRT freezes it (all of it, or all but ``train_backbone``: the
overview's Task 1 row C trains only the last layers and the head) and the head switches to its experts. The
phase lives in the head's ``phase`` buffer, so a fit resumed after the switch reads it from ``last.ckpt``.

By default the kept checkpoint is chosen among phase-2 epochs only: otherwise a run labelled "moe" could report
the linear head's numbers. At the switch the checkpoint callbacks forget their best score (saved with the next
checkpoint, so a resume keeps it).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import lightning.pytorch as L
import torch

from training.errors import UserError
from training.models.schedule import HeadOnlyPhase, epoch_at_fraction, run_epochs

log = logging.getLogger(__name__)


class TwoPhase(L.Callback):
    """Switch a two-phase head (:class:`training.models.heads.moe.MoEHead`) to phase 2 at ``switch_epoch``.

    Args:
        switch_fraction: instead of ``switch_epoch``, the share of ``trainer.max_epochs`` in phase 1, so one preset
            serves any run length (kept below the last epoch: a one-epoch smoke run is all phase 2).
        train_backbone: backbone parameter-name prefixes that keep training in phase 2 (``[stages.3, head.norm]``);
            empty freezes the whole backbone.
    """

    def __init__(
        self,
        switch_epoch: int | None = None,
        switch_fraction: float | None = None,
        select_in_phase_two: bool = True,
        train_backbone: Sequence[str] = (),
    ):
        if (switch_epoch is None) == (switch_fraction is None):
            raise UserError("two_phase: give exactly one of switch_epoch and switch_fraction")
        self.switch_epoch = None if switch_epoch is None else int(switch_epoch)
        self.switch_fraction = switch_fraction
        self.select_in_phase_two = select_in_phase_two
        self.train_backbone = tuple(str(prefix) for prefix in train_backbone)

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not hasattr(pl_module.head, "start_phase_two"):
            raise UserError(f"two_phase needs a two-phase head (head=moe), not {type(pl_module.head).__name__}")
        if self.switch_fraction is not None:
            self.switch_epoch = epoch_at_fraction(self.switch_fraction, run_epochs(trainer))
        if trainer.max_epochs is not None and 0 <= trainer.max_epochs <= self.switch_epoch:
            raise UserError(
                f"callbacks.two_phase.switch_epoch={self.switch_epoch} is not below trainer.max_epochs="
                f"{trainer.max_epochs}: phase 2 would never start"
            )

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        head = pl_module.head
        if not head.in_phase_two and trainer.current_epoch >= self.switch_epoch:
            head.start_phase_two()
            if self.select_in_phase_two:
                _forget_best(trainer)
            log.info("epoch %d: backbone frozen, head switched to its experts", trainer.current_epoch)
        if head.in_phase_two and self.train_backbone:
            freeze_backbone_except(pl_module.backbone, self.train_backbone)  # every epoch: Lightning resets modes
        elif head.in_phase_two and not getattr(pl_module, "backbone_frozen", False):
            pl_module.freeze_backbone()  # the module's own epoch-start hook, called next, sets eval mode


def freeze_backbone_except(backbone: torch.nn.Module, prefixes: Sequence[str]) -> None:
    """Train only the parameters whose names start with one of ``prefixes``; the rest get no gradient.

    A submodule outside the prefixes without any trainable parameter is put in eval mode, as a frozen backbone is;
    the trained layers (their drop-path included) stay in train mode.
    """
    names = [name for name, _ in backbone.named_parameters()]
    unmatched = [prefix for prefix in prefixes if not any(name.startswith(prefix) for name in names)]
    if unmatched:
        raise UserError(
            f"callbacks.two_phase.train_backbone: {unmatched} match no backbone parameter "
            f"(its last ones: {', '.join(names[-3:])})"
        )
    for name, param in backbone.named_parameters():
        param.requires_grad_(name.startswith(tuple(prefixes)))
    for name, module in backbone.named_modules():
        trained = name.startswith(tuple(prefixes)) or any(p.requires_grad for p in module.parameters())
        if not trained:  # a frozen part's normalisation statistics and dropout stay as at the switch
            module.eval()


class HeadFirst(L.Callback):
    """Train the head alone on the frozen backbone for ``epochs`` epochs at ``lr``, then every weight.

    Why: a fresh head on a pretrained backbone sends large random gradients into it; the 2026 Task 1 winner first
    fits the head, then fine-tunes everything. This callback owns the phase (re-frozen on resume); the module's
    optimiser owns the rates (:func:`training.models.schedule.phased_multiplier`). One optimiser spans both phases,
    so the head's AdamW moments carry over. A run of at most ``epochs`` epochs keeps its last epoch for phase 2.
    ``trainer.max_epochs`` counts both phases; ``select_in_phase_two`` follows the winner, who saves only while
    fine-tuning.
    """

    def __init__(self, epochs: int, lr: float, select_in_phase_two: bool = True):
        if int(epochs) < 0 or lr <= 0:
            raise UserError(f"two_phase=head_first needs epochs >= 0 and lr > 0, got epochs={epochs}, lr={lr}")
        self.epochs = self.switch_epoch = int(epochs)
        self.lr = float(lr)
        self.select_in_phase_two = select_in_phase_two

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if stage != "fit":
            return
        if getattr(pl_module, "backbone_frozen", False):
            raise UserError("two_phase=head_first unfreezes the backbone after its first phase; this run keeps it "
                            "frozen throughout (stage=crt or a frozen adapter): use two_phase=none")  # fmt: skip
        if trainer.max_epochs is None or int(trainer.max_epochs) < 1:
            raise UserError(f"two_phase=head_first counts epochs: set trainer.max_epochs (got {trainer.max_epochs})")
        epochs = min(self.epochs, int(trainer.max_epochs) - 1)
        if epochs < self.epochs:
            log.warning("two_phase=head_first: %d head-only epochs shortened to %d, so the %d-epoch run ends with "
                        "phase 2", self.epochs, epochs, trainer.max_epochs)  # fmt: skip
        self.switch_epoch = epochs
        pl_module.head_only_phase = HeadOnlyPhase(epochs=epochs, lr=self.lr)

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        frozen = getattr(pl_module, "backbone_frozen", False)
        if trainer.current_epoch < self.switch_epoch and not frozen:
            pl_module.freeze_backbone()  # the module's own epoch-start hook, called next, sets eval mode
        elif trainer.current_epoch >= self.switch_epoch and frozen:
            pl_module.unfreeze_backbone()  # Lightning put the whole module in train mode for this epoch
            if self.select_in_phase_two:
                _forget_best(trainer)
            log.info("epoch %d: backbone unfrozen, every weight trains", trainer.current_epoch)


def _forget_best(trainer: L.Trainer) -> None:
    """Make every monitoring checkpoint callback start its selection afresh (so phase 1 cannot be the best)."""
    for callback in trainer.checkpoint_callbacks:
        if getattr(callback, "monitor", None):
            callback.best_k_models = {}
            callback.best_model_score = None
            callback.kth_best_model_path = ""
            callback.kth_value = torch.tensor(torch.inf if callback.mode == "min" else -torch.inf)
