"""Which unfinished run a training resumes: the one recorded under the same config key, with a checkpoint left.

A run is keyed by its resolved config (:func:`run_key`), so ``resume=true`` looks only among the runs of *this*
config (``resume=<run id>`` names its run directly and is handled by the session).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from training.tracking.uri import tracking_client

RUN_KEY_TAG = "cxrlt.run_key"
UNFINISHED = ("RUNNING", "FAILED", "KILLED", "SCHEDULED")


def run_key(cfg: DictConfig) -> str:
    """Hash of the resolved config without the resume switch: the identity a restart must match to resume."""
    plain = OmegaConf.to_container(cfg, resolve=True)
    plain.pop("resume", None)
    plain.get("tracking", {}).pop("reconnect_timeout", None)  # how long to wait for a server is not identity
    plain.get("tracking", {}).pop("system_metrics", None)  # nor whether the machine's load is sampled
    return hashlib.sha256(json.dumps(plain, sort_keys=True, default=str).encode()).hexdigest()[:16]


def find_resumable(uri: str, experiment_name: str, key: str, checkpoint_root: Path) -> tuple[str, Path] | None:
    """Most recent unfinished run with the same run key that left a ``last.ckpt`` behind.

    Uses a plain ``MlflowClient``: touching ``MLFlowLogger.experiment`` would create an empty run.
    """
    client = tracking_client(uri)
    experiment = client.get_experiment_by_name(experiment_name)
    if experiment is None:
        return None
    runs = client.search_runs(
        [experiment.experiment_id],
        filter_string=f"tags.`{RUN_KEY_TAG}` = '{key}'",
        order_by=["attributes.start_time DESC"],
    )
    for run in runs:
        last = checkpoint_root / run.info.run_id / "last.ckpt"
        if run.info.status in UNFINISHED and last.is_file():
            return run.info.run_id, last
    return None
