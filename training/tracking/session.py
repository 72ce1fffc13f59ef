"""Opening, resuming and closing the MLflow run of one training.

Lightning's ``MLFlowLogger`` does the metric and parameter logging. This module decides *which* run a training
writes to (a new one, or the unfinished one it resumes), where its working checkpoints live, and when the run is
declared finished: only after testing and artifact upload succeeded, so a FINISHED run is always complete.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from lightning.pytorch.loggers import MLFlowLogger
from omegaconf import DictConfig, OmegaConf

log = logging.getLogger(__name__)

RUN_KEY_TAG = "cxrlt.run_key"
UNFINISHED = ("RUNNING", "FAILED", "KILLED", "SCHEDULED")


class RunLogger(MLFlowLogger):
    """An ``MLFlowLogger`` whose run stays open until the pipeline closes it.

    Lightning finalises the logger at the end of ``fit`` and again after ``test``; the platform still has to test
    and upload artifacts after ``fit``, so the terminal status is set once, by :meth:`TrackingSession.close`.
    """

    def finalize(self, status: str = "success") -> None:
        """Ignore Lightning's per-stage finalisation (see class docstring)."""

    def log_metrics(self, metrics, step=None) -> None:
        """Log with the epoch as MLflow's step.

        The platform logs epoch-level metrics only (step-level values would be re-logged after a resume), so the
        epoch is the natural x axis in the MLflow UI; Lightning's extra ``epoch`` pseudo-metric is dropped.
        """
        metrics = dict(metrics)
        epoch = metrics.pop("epoch", None)
        super().log_metrics(metrics, int(epoch) if epoch is not None else step)


@dataclass
class TrackingSession:
    """The run a training writes to.

    Attributes:
        logger: Lightning logger bound to the run.
        run_id: MLflow run id.
        checkpoint_dir: local folder for Lightning's working checkpoints (``last.ckpt`` for resume).
        resume_from: checkpoint to resume from, or None for a fresh run.
    """

    logger: RunLogger
    run_id: str
    checkpoint_dir: Path
    resume_from: Path | None

    @property
    def client(self):
        return self.logger.experiment

    def log_text(self, text: str, artifact_file: str) -> None:
        self.client.log_text(self.run_id, text, artifact_file)

    def log_artifact(self, path: Path, artifact_path: str | None = None) -> None:
        self.client.log_artifact(self.run_id, str(path), artifact_path)

    def log_artifacts(self, folder: Path, artifact_path: str | None = None) -> None:
        self.client.log_artifacts(self.run_id, str(folder), artifact_path)

    def log_metrics(self, metrics: dict[str, float], step: int = 0) -> None:
        """Log final (non-epoch) metrics in MLflow's batch-size chunks."""
        log_metric_batch(self.client, self.run_id, metrics, step)

    def close(self, status: str) -> None:
        """Mark the run FINISHED, FAILED or KILLED; on success drop the local working checkpoints."""
        self.client.set_terminated(self.run_id, status)
        if status == "FINISHED":
            shutil.rmtree(self.checkpoint_dir, ignore_errors=True)


def log_metric_batch(client, run_id: str, metrics: dict[str, float], step: int = 0) -> None:
    """``log_batch`` in chunks of MLflow's 1,000-metric limit, one timestamp for all."""
    from mlflow.entities import Metric

    now = int(time.time() * 1000)
    items = [Metric(key, float(value), now, step) for key, value in metrics.items()]
    for start in range(0, len(items), 1000):
        client.log_batch(run_id, metrics=items[start : start + 1000])


def tracking_uri(cfg: DictConfig) -> str:
    """``MLFLOW_TRACKING_URI`` wins over the config, so one variable points every run at a team server."""
    return os.environ.get("MLFLOW_TRACKING_URI") or cfg.tracking.uri


def run_key(cfg: DictConfig) -> str:
    """Hash of the resolved config without the resume switch: the identity a restart must match to resume."""
    plain = OmegaConf.to_container(cfg, resolve=True)
    plain.pop("resume", None)
    return hashlib.sha256(json.dumps(plain, sort_keys=True, default=str).encode()).hexdigest()[:16]


def git_commit() -> str:
    """Current commit, suffixed with ``-dirty`` when the work tree has uncommitted changes."""
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True)
        return commit + ("-dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def flatten(cfg: DictConfig) -> dict[str, str]:
    """Resolved config as ``{"model.lr": "0.001", ...}``; lists stay whole so label lists read as one param."""
    out: dict[str, str] = {}

    def walk(node, prefix: str) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                walk(value, f"{prefix}{key}.")
        else:
            out[prefix[:-1]] = str(node)

    walk(OmegaConf.to_container(cfg, resolve=True), "")
    return out


def _find_resumable(uri: str, experiment_name: str, key: str, checkpoint_root: Path) -> tuple[str, Path] | None:
    """Most recent unfinished run with the same run key that left a ``last.ckpt`` behind.

    Uses a plain ``MlflowClient``: touching ``MLFlowLogger.experiment`` would create an empty run.
    """
    from mlflow import MlflowClient

    client = MlflowClient(uri)
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


def open_session(cfg: DictConfig, tags: dict[str, str]) -> TrackingSession:
    """Create the run (or reopen the one to resume), tag it and log the resolved config.

    With ``resume=true`` the newest unfinished run of the same config continues from its ``last.ckpt``; with
    ``resume=<run id>`` that run does. When nothing matches, a new run starts and the log says so.
    """
    uri = tracking_uri(cfg)
    checkpoint_root = Path(cfg.tracking.checkpoint_root).resolve()
    local_store = uri.startswith(("sqlite:", "file:")) or "://" not in uri
    # A local store gets its artifacts under mlruns/artifacts; a tracking server decides for itself.
    artifact_location = Path(cfg.tracking.artifact_root).resolve().as_uri() if local_store else None
    key = run_key(cfg)
    found = None
    if cfg.resume is True:
        found = _find_resumable(uri, cfg.tracking.experiment, key, checkpoint_root)
        if found is None:
            log.warning("resume=true but no unfinished run of this config has a checkpoint; starting a new run")
    elif cfg.resume:
        last = checkpoint_root / str(cfg.resume) / "last.ckpt"
        if not last.is_file():
            raise FileNotFoundError(f"resume={cfg.resume}: no checkpoint at {last}")
        found = (str(cfg.resume), last)

    run_tags = {**tags, RUN_KEY_TAG: key, "mlflow.source.git.commit": git_commit()}
    if found:
        run_id, last = found
        logger = RunLogger(tracking_uri=uri, run_id=run_id, experiment_name=cfg.tracking.experiment)
        logger.experiment.update_run(run_id, status="RUNNING")
        log.info("resuming run %s from %s", run_id, last)
    else:
        logger = RunLogger(
            experiment_name=cfg.tracking.experiment, run_name=cfg.run_name, tracking_uri=uri,
            artifact_location=artifact_location, tags=run_tags,
        )  # fmt: skip
        logger.log_hyperparams(flatten(cfg))
        logger.experiment.log_text(logger.run_id, OmegaConf.to_yaml(cfg, resolve=True), "config.yaml")
        last = None
    return TrackingSession(logger, logger.run_id, checkpoint_root / logger.run_id, last)
