"""Helpers shared by the tuning integration tests."""

from __future__ import annotations

import sys
from pathlib import Path

import optuna

from training.tuning.objective import is_surplus


def tune_command(tmp: Path, trials: int, *overrides: str) -> list[str]:
    """What `make tune TRIALS=<trials> STORAGE=... ARGS="..."` runs, with every output under ``tmp``."""
    return [
        sys.executable, "-m", "training.tune", "task=task1", f"tune.trials={trials}",
        f"tune.storage=sqlite:///{tmp}/optuna.db", f"tracking.artifact_root={tmp}/artifacts",
        f"tracking.checkpoint_root={tmp}/checkpoints", f"data.source.root={tmp}/synthetic", *overrides,
    ]  # fmt: skip


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
