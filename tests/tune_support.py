"""Helpers shared by the tuning integration tests."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import lightning.pytorch as L
import optuna
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate

from training.tuning.objective import is_surplus

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
#: A study small enough for a test: the smoke data cut further, one epoch, no bootstrap, no pruning.
TINY = ("debug=smoke", "data.subset={train:64,val:48,test:32}", "trainer.max_epochs=1", "evaluation.n_boot=0",
        "evaluation.per_source=false", "pruner=none")  # fmt: skip


def tune_command(tmp: Path, trials: int, *overrides: str) -> list[str]:
    """What `make tune TRIALS=<trials> STORAGE=... ARGS="..."` runs, with every output under ``tmp``."""
    return [
        sys.executable, "-m", "training.tune", "task=task1", f"tune.trials={trials}",
        f"tune.storage=sqlite:///{tmp}/optuna.db", f"tracking.artifact_root={tmp}/artifacts",
        f"tracking.checkpoint_root={tmp}/checkpoints", f"data.source.root={tmp}/synthetic", *overrides,
    ]  # fmt: skip


def prepare_data(tmp: Path) -> None:
    """Generate the synthetic data set once, up front: fresh workers started together would each generate it."""
    with initialize_config_dir(str(CONFIGS), version_base="1.3"):
        cfg = compose("tune", overrides=["debug=smoke", f"data.source.root={tmp}/synthetic"])
    instantiate(cfg.data.source).prepare()


def trained_trials(study: optuna.Study, target: int) -> list[optuna.trial.FrozenTrial]:
    """The trials that trained, after checking the surplus ones (workers that lost the race for the last slot).

    A surplus trial is numbered after every trained one, ended PRUNED before training (no MLflow run), and there
    is at most one per extra worker, so the study never trains more than ``target`` trials.
    """
    trials = study.get_trials()
    surplus = [t for t in trials if is_surplus(t)]
    trained = [t for t in trials if not is_surplus(t)]
    for trial in surplus:
        assert trial.state == optuna.trial.TrialState.PRUNED and "mlflow_run_id" not in trial.user_attrs
        assert trial.number >= target
    return trained


class HoldFit(L.Callback):
    """Stop a worker's ``at``-th trial of this process mid-fitting, as if its machine froze, until the test kills it.

    Polling a real trial's state and killing it once it looks busy races the trial's own end (a tiny trial takes
    seconds); holding it at a known point makes the kill land mid-trial every time. The hold ends on its own after
    ``hold_s`` (failing the trial) so a test that never kills cannot leave a worker behind for good.
    """

    fits = 0  # per process: every trial of a worker runs in its one process, each with a new instance

    def __init__(self, marker: str, at: int = 1, hold_s: float = 600.0):
        self.marker, self.at, self.hold_s = Path(marker), at, hold_s

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        HoldFit.fits += 1

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if HoldFit.fits != self.at:
            return
        self.marker.write_text(str(os.getpid()))
        time.sleep(self.hold_s)
        raise RuntimeError(f"HoldFit: nobody killed this worker within {self.hold_s} s")
