"""The two-phase schedule of the mixture-of-experts head (``two_phase=moe``, with ``head=moe``).

Phase 1 trains backbone and linear head as usual. At the start of epoch ``switch_epoch`` the backbone is frozen
(as cRT freezes it: no gradients, normalisation statistics fixed) and the head switches to its experts. The phase
is stored in the head's ``phase`` buffer, not here: a fit resumed after the switch reads it from ``last.ckpt`` and
this callback freezes the backbone again at the first epoch it runs.

Model selection: by default the kept checkpoint is chosen among phase-2 epochs only. Otherwise a phase-1 epoch
that happened to score best on validation would be the tested model, and a run labelled "moe" would report the
linear head's numbers. At the switch the checkpoint callbacks forget their best score, so the first phase-2
validation always replaces ``best.ckpt``; that forgetting is saved with the next checkpoint, so a resume keeps it.
``select_in_phase_two=false`` keeps the plain selection over every epoch.
"""

from __future__ import annotations

import logging

import lightning.pytorch as L
import torch

from training.errors import UserError
from training.models.schedule import epoch_at_fraction, run_epochs

log = logging.getLogger(__name__)


class TwoPhase(L.Callback):
    """Switch a two-phase head (:class:`training.models.heads.moe.MoEHead`) to phase 2 at ``switch_epoch``.

    Args:
        switch_epoch: the first epoch (0-based) of phase 2; must be below ``trainer.max_epochs``.
        switch_fraction: instead of ``switch_epoch``, the share of ``trainer.max_epochs`` spent in phase 1, so one
            preset serves any run length (rounded, and kept below the last epoch: a one-epoch smoke run is all
            phase 2).
        select_in_phase_two: choose the kept checkpoint among phase-2 epochs only (see the module docstring).
    """

    def __init__(
        self, switch_epoch: int | None = None, switch_fraction: float | None = None, select_in_phase_two: bool = True
    ):
        if (switch_epoch is None) == (switch_fraction is None):
            raise UserError("two_phase: give exactly one of switch_epoch and switch_fraction")
        self.switch_epoch = None if switch_epoch is None else int(switch_epoch)
        self.switch_fraction = switch_fraction
        self.select_in_phase_two = select_in_phase_two

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
        if head.in_phase_two and not getattr(pl_module, "backbone_frozen", False):
            pl_module.freeze_backbone()  # the module's own epoch-start hook, called next, sets eval mode


def _forget_best(trainer: L.Trainer) -> None:
    """Make every monitoring checkpoint callback start its selection afresh (so phase 1 cannot be the best)."""
    for callback in trainer.checkpoint_callbacks:
        if getattr(callback, "monitor", None):
            callback.best_k_models = {}
            callback.best_model_score = None
            callback.kth_best_model_path = ""
            callback.kth_value = torch.tensor(torch.inf if callback.mode == "min" else -torch.inf)
