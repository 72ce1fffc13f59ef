"""Opening, resuming and closing the MLflow run of one training.

This module decides *which* run a training writes to (new, or the unfinished one it resumes), where its working
checkpoints live, and when the run is FINISHED: only after testing and artifact upload succeeded, so a FINISHED
run is always complete.

A tracking server that goes away (docs/scaling.md, "When the tracking server goes away"): checked at start so a
wrong URI fails in seconds; during fitting metrics are buffered (:mod:`training.tracking.run_logger`) and training
never stops for the server; after fitting the session waits ``tracking.reconnect_timeout`` seconds, then ends with
:class:`TrackingUnavailable`, leaving the run RUNNING with its checkpoints and unsent metrics for
``resume=<run id>``.
"""

from __future__ import annotations

import logging
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from training.interrupts import warn_abandoned
from training.tracking import health
from training.tracking.health import TrackingUnavailable, check_reachable, is_remote
from training.tracking.redaction import redact, redact_tags, redact_text
from training.tracking.resume import RUN_KEY_TAG, ResumeRefused, check_same_config, find_resumable, run_key
from training.tracking.run_logger import UNSENT_FILE, RunLogger, log_metric_batch
from training.tracking.store_lock import ensure_store
from training.tracking.tracked_run import ensure_experiment
from training.tracking.uri import is_local_store, resolve_tracking_uri, tracking_client

log = logging.getLogger(__name__)


#: ``make ui``'s address (its default PORT), for the link a local run prints at the end.
LOCAL_UI = "http://127.0.0.1:5000"


@dataclass
class TrackingSession:
    """The run a training writes to.

    ``checkpoint_dir`` holds Lightning's working checkpoints (``last.ckpt`` for resume); ``resume_from`` is None for
    a fresh run.
    """

    logger: RunLogger
    run_id: str
    checkpoint_dir: Path
    resume_from: Path | None
    uri: str = ""
    reconnect_timeout: float = 300.0
    #: Set once the server stayed away past ``reconnect_timeout``: the run cannot be closed, only resumed.
    lost: TrackingUnavailable | None = field(default=None, repr=False)

    @property
    def client(self):
        return self.logger.experiment

    def await_server(self) -> None:
        """Before a post-fit write: wait for the server (up to ``reconnect_timeout``), then send buffered metrics.

        Raises:
            TrackingUnavailable: the server stayed away; the message names the run and how to resume it.
        """
        if not is_remote(self.uri):
            return
        if self.lost is not None:
            raise self.lost
        deadline = time.monotonic() + self.reconnect_timeout
        reason = health.server_reachable(self.uri)
        if reason is not None:
            log.warning("tracking server %s unreachable (%s); waiting up to %.0fs for it", redact_text(self.uri),
                        reason, self.reconnect_timeout)  # fmt: skip
        while reason is not None or not self.logger.flush():
            if time.monotonic() > deadline:
                self.logger.save_unsent()
                self.lost = TrackingUnavailable(
                    f"tracking server {redact_text(self.uri)} unreachable for {self.reconnect_timeout:.0f}s "
                    f"({reason or 'buffered metrics could not be sent'}): run {self.run_id} is left unfinished. "
                    f"Its checkpoints and unsent metrics were kept in {self.checkpoint_dir}; once the server is "
                    f"back, finish it with `resume={self.run_id}`."
                )
                raise self.lost
            time.sleep(min(5.0, max(0.5, self.reconnect_timeout / 20)))
            reason = health.server_reachable(self.uri)

    def log_text(self, text: str, artifact_file: str) -> None:
        self.await_server()
        self.client.log_text(self.run_id, text, artifact_file)

    def log_artifact(self, path: Path, artifact_path: str | None = None) -> None:
        self.await_server()
        self.client.log_artifact(self.run_id, str(path), artifact_path)

    def log_artifacts(self, folder: Path, artifact_path: str | None = None) -> None:
        self.await_server()
        self.client.log_artifacts(self.run_id, str(folder), artifact_path)

    @property
    def artifact_uri(self) -> str:
        return self.client.get_run(self.run_id).info.artifact_uri

    @property
    def ui_url(self) -> str:
        """Where the run opens in the MLflow UI: the team server's own, or ``make ui``'s default address."""
        experiment = self.client.get_run(self.run_id).info.experiment_id
        base = redact_text(self.uri).rstrip("/") if is_remote(self.uri) else LOCAL_UI
        # MLflow 3.17's UI otherwise opens on its GenAI pages unless this browser was switched to model training.
        return f"{base}/#/experiments/{experiment}/runs/{self.run_id}?workflowType=machine_learning"

    def set_tags(self, tags: dict[str, str]) -> None:
        self.await_server()
        for key, value in tags.items():
            self.client.set_tag(self.run_id, key, value)

    def log_metrics(self, metrics: dict[str, float], step: int = 0) -> None:
        """Log final (non-epoch) metrics in MLflow's batch-size chunks; a resumed run keeps those it holds."""
        self.await_server()
        log_metric_batch(self.client, self.run_id, self.logger.not_logged(metrics, step), step)

    def close(self, status: str) -> None:
        """Mark the run FINISHED, FAILED or KILLED; on success drop the local working checkpoints.

        Raises:
            TrackingUnavailable: the server is gone (see module docstring); the run stays RUNNING and its local
                checkpoints are kept, so ``resume=<run id>`` can finish it.
        """
        if self.lost is not None:
            log.error("%s", self.lost)
            raise self.lost
        self.await_server()
        self.client.set_terminated(self.run_id, status)
        if status == "FINISHED":
            shutil.rmtree(self.checkpoint_dir, ignore_errors=True)


def display_name(cfg: DictConfig, key: str) -> str:
    """The run's name in the UI: ``debug-`` first for a debug preset's run (the runs table cuts long names, so the
    mark must lead), then ``run_name`` (a preset's own name starts with it), then the config key's first six
    characters, which tell apart runs whose names would otherwise be equal."""
    debug = OmegaConf.select(cfg, "data.debug_size", default=None) is not None
    return f"{'debug-' if debug else ''}{cfg.run_name}-{key[:6]}"


def reconnect_timeout(cfg: DictConfig) -> float:
    """Seconds to wait for a vanished tracking server before the post-fit steps give up."""
    return float(cfg.tracking.get("reconnect_timeout", 300))


def tracking_uri(cfg: DictConfig) -> str:
    """The store a training config points at (:func:`training.tracking.uri.resolve_tracking_uri` decides)."""
    return resolve_tracking_uri(cfg.tracking.get("uri"))


def git_commit() -> str:
    """Current commit, suffixed with ``-dirty`` when the work tree has uncommitted changes."""
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True)
        return commit + ("-dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def flatten(cfg: DictConfig) -> dict[str, str]:
    """Resolved, redacted config as ``{"model.lr": "0.001", ...}``; lists stay whole so label lists read as one param.

    Redacted (:func:`redact`) because params are readable by everyone with access to the tracking server.
    """
    out: dict[str, str] = {}

    def walk(node, prefix: str) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                walk(value, f"{prefix}{key}.")
        else:
            out[prefix[:-1]] = str(node)

    walk(redact(OmegaConf.to_container(cfg, resolve=True)), "")
    return out


def config_yaml(cfg: DictConfig) -> str:
    """The resolved config as YAML for the ``config.yaml`` artifact, redacted like the params."""
    return OmegaConf.to_yaml(OmegaConf.create(redact(OmegaConf.to_container(cfg, resolve=True))))


def open_session(cfg: DictConfig, tags: dict[str, str]) -> TrackingSession:
    """Create the run (or reopen the one to resume), tag it and log the resolved config.

    ``resume=true`` continues the newest unfinished run of the same config; ``resume=<run id>`` that run. When
    nothing matches, a new run starts and the log says so.

    Raises:
        TrackingUnavailable: the tracking server does not answer (checked before anything is created).
    """
    uri = tracking_uri(cfg)
    check_reachable(uri)
    ensure_store(uri)  # before any client: trainings started together on a fresh store must not both migrate it
    checkpoint_root = Path(cfg.tracking.checkpoint_root).resolve()
    local_store = is_local_store(uri)
    # A local store gets its artifacts under mlruns/artifacts; a tracking server decides for itself.
    artifact_location = Path(cfg.tracking.artifact_root).resolve().as_uri() if local_store else None
    key = run_key(cfg)
    found = None
    if cfg.resume is True:
        found = find_resumable(uri, cfg.tracking.experiment, key, checkpoint_root)
        if found is None:
            log.warning("resume=true but no unfinished run of this config has a checkpoint; starting a new run")
    elif cfg.resume:
        last = checkpoint_root / str(cfg.resume) / "last.ckpt"
        if not last.is_file():
            raise ResumeRefused(
                f"resume={cfg.resume}: no checkpoint at {last} (a training keeps its last.ckpt under "
                "tracking.checkpoint_root/<run id>)"
            )
        check_same_config(uri, str(cfg.resume), key, flatten(cfg))
        found = (str(cfg.resume), last)

    warn_abandoned(tracking_client(uri), cfg.tracking.experiment, resuming=found[0] if found else None)
    run_tags = redact_tags({**tags, RUN_KEY_TAG: key, "mlflow.source.git.commit": git_commit()})
    if found:
        run_id, last = found
        logger = RunLogger(tracking_uri=uri, run_id=run_id, experiment_name=cfg.tracking.experiment)
        logger.experiment.update_run(run_id, status="RUNNING")
        log.info("resuming run %s from %s", run_id, last)
    else:
        # Created here, where two first trainings at once are tolerated; Lightning's logger would fail the second.
        ensure_experiment(tracking_client(uri), cfg.tracking.experiment, uri, cfg.tracking.artifact_root)
        logger = RunLogger(
            experiment_name=cfg.tracking.experiment, run_name=display_name(cfg, key), tracking_uri=uri,
            artifact_location=artifact_location, tags=run_tags,
        )  # fmt: skip
        logger.log_hyperparams(flatten(cfg))
        logger.experiment.log_text(logger.run_id, config_yaml(cfg), "config.yaml")
        last = None
    session = TrackingSession(logger, logger.run_id, checkpoint_root / logger.run_id, last, uri, reconnect_timeout(cfg))
    logger.spool = session.checkpoint_dir / UNSENT_FILE
    if found and logger.load_unsent():  # metrics a previous process could not send before the server went away
        log.info("sending %d metric values buffered by the previous process of run %s", len(logger.unsent), run_id)
        session.await_server()
    if found:
        logger.remember_logged()
    return session
