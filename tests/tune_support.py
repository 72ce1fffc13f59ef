"""Helpers shared by the tuning integration tests."""

from __future__ import annotations

import sys
from pathlib import Path


def tune_command(tmp: Path, trials: int, *overrides: str) -> list[str]:
    """What `make tune TRIALS=<trials> STORAGE=... ARGS="..."` runs, with every output under ``tmp``."""
    return [
        sys.executable, "-m", "training.tune", "task=task1", f"tune.trials={trials}",
        f"tune.storage=sqlite:///{tmp}/optuna.db", f"tracking.artifact_root={tmp}/artifacts",
        f"tracking.checkpoint_root={tmp}/checkpoints", f"data.source.root={tmp}/synthetic", *overrides,
    ]  # fmt: skip
