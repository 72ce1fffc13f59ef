"""Hydra's record of a sweep (``<sweep dir>/multirun.yaml``) is kept redacted, like everything else on disk.

Hydra saves the sweep's whole config, overrides included, before the first job starts, so ``+model.hub_token=...``
would sit in clear under ``mlruns/sweeps/``. :class:`RedactSweepRecord` (a Hydra callback) rewrites it through
:func:`training.tracking.redaction.redact` when each job starts and when the sweep ends.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from training.tracking.redaction import redact

RECORD = "multirun.yaml"


def redact_record(path: Path) -> None:
    """Rewrite a saved Hydra config with every secret blanked (interpolations stay as written)."""
    if path.is_file():
        saved = OmegaConf.to_container(OmegaConf.load(path), resolve=False)
        OmegaConf.save(OmegaConf.create(redact(saved)), path)


class RedactSweepRecord(Callback):
    """Keep ``multirun.yaml`` free of secrets (see the module docstring)."""

    def on_job_start(self, config: DictConfig, **kwargs: Any) -> None:
        mode = config.hydra.get("mode")
        if getattr(mode, "name", mode) == RunMode.MULTIRUN.name:  # a job's folder is <sweep dir>/<subdir>
            redact_record(Path(config.hydra.runtime.output_dir).parent / RECORD)

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        redact_record(Path(config.hydra.sweep.dir) / RECORD)
