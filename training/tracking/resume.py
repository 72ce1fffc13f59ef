"""Which unfinished run a training resumes: the one recorded under the same config key, with a checkpoint left.

A run is keyed by its resolved config (:func:`run_key`), so ``resume=true`` looks only among the runs of *this*
config (``resume=<run id>`` names its run directly and is handled by the session).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from mlflow.exceptions import MlflowException
from omegaconf import DictConfig, OmegaConf

from training.errors import UserError
from training.tracking.uri import tracking_client

RUN_KEY_TAG = "cxrlt.run_key"
UNFINISHED = ("RUNNING", "FAILED", "KILLED", "SCHEDULED")
#: Params that are not part of a run's identity (see :func:`run_key`).
NOT_IDENTITY = ("resume", "tracking.reconnect_timeout", "tracking.system_metrics")


class ResumeRefused(UserError, ValueError):
    """``resume=<run id>`` names a run that cannot be continued by this command line."""


def run_key(cfg: DictConfig) -> str:
    """Hash of the resolved config without the resume switch: the identity a restart must match to resume."""
    plain = OmegaConf.to_container(cfg, resolve=True)
    plain.pop("resume", None)
    plain.get("tracking", {}).pop("reconnect_timeout", None)  # how long to wait for a server is not identity
    plain.get("tracking", {}).pop("system_metrics", None)  # nor whether the machine's load is sampled
    return hashlib.sha256(json.dumps(plain, sort_keys=True, default=str).encode()).hexdigest()[:16]


def check_same_config(uri: str, run_id: str, key: str, params: dict[str, str]) -> None:
    """Refuse ``resume=<run id>`` when that run was recorded under another config, naming the settings that differ.

    Continuing it would mix two configs in one run: epochs trained one way, then another, under the first one's
    params. ``params`` are this command line's (the flattened config, as logged); a run from before run keys were
    recorded is accepted as it is.
    """
    try:
        run = tracking_client(uri).get_run(run_id)
    except MlflowException as error:
        raise ResumeRefused(f"resume={run_id}: no such run in the tracking store {uri}") from error
    recorded = run.data.tags.get(RUN_KEY_TAG)
    if recorded is None or recorded == key:
        return
    stored = {k: v for k, v in run.data.params.items() if "/" not in k}  # Lightning's own ``model_cfg/...`` aside
    # Settings changed on both sides first: they say why; settings only one side has follow.
    differ = sorted((k for k in stored.keys() | params.keys()
                     if stored.get(k) != params.get(k) and not k.startswith(NOT_IDENTITY)),
                    key=lambda k: (k not in stored or k not in params, k))  # fmt: skip
    shown = ", ".join(f"{k}: {stored.get(k, '(unset)')} -> {params.get(k, '(unset)')}" for k in differ[:5])
    more = f" and {len(differ) - 5} more" if len(differ) > 5 else ""
    raise ResumeRefused(
        f"resume={run_id}: that run was recorded under another config ({shown or 'run key ' + recorded}{more}); "
        f"resume it with the settings it was started with, or leave out resume= to start a new run"
    )


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
