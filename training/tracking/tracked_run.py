"""A run that is not a training: created, logged in batches and marked finished or failed by one owner.

Tuning's parent run, ensembles, benchmark results and the model registry all write runs of their own next to the
training runs. Creating the experiment, the run and the terminal status by hand in each leaves a different part to
forget (an experiment created twice by two workers, a run left RUNNING after an upload error, a secret in a tag).
Here every param and tag goes through the same redaction as a training run's
(:mod:`training.tracking.redaction`), and :class:`TrackedRun` used as a context ends the run FAILED when its
block raises, so no half-filled run is ever shown as FINISHED. A training run keeps its own owner
(:mod:`training.tracking.session`): Lightning logs its epochs and it survives server outages.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from pathlib import Path

from training.tracking.redaction import redact, redact_tags, redact_text
from training.tracking.run_logger import log_metric_batch
from training.tracking.uri import is_local_store

#: MLflow's limit on one param value; a longer one (a member list, a model identity) is cut, not refused.
PARAM_LIMIT = 6000


def ensure_experiment(
    client, name: str, uri: str, artifact_root: str | Path, tags: Mapping[str, str] | None = None
) -> str:
    """The experiment's id, creating it when missing: artifacts under ``artifact_root`` on a local store (the
    project keeps them in ``mlruns/artifacts``), the server's choice otherwise.

    Two workers may create it at once (tuning); the loser reads the winner's experiment instead of failing.
    """
    found = client.get_experiment_by_name(name)
    if found is not None:
        return found.experiment_id
    location = Path(artifact_root).resolve().as_uri() if is_local_store(uri) else None
    try:
        return client.create_experiment(name, artifact_location=location, tags=dict(tags or {}) or None)
    except Exception:
        found = client.get_experiment_by_name(name)
        if found is None:
            raise
        return found.experiment_id


class TrackedRun:
    """One MLflow run written through ``client``; see the module docstring.

    Use ``with TrackedRun.start(...) as run:`` for a run that is complete when its block ends, or keep the object
    and call :meth:`finish` when the run's life spans more than one block (a study's parent run).
    """

    def __init__(self, client, run_id: str):
        self.client = client
        self.run_id = run_id

    @classmethod
    def start(cls, client, experiment: str, run_name: str, tags: Mapping[str, object] | None = None) -> TrackedRun:
        """A new RUNNING run in experiment id ``experiment``, its tags redacted."""
        run = client.create_run(experiment, run_name=run_name, tags=redact_tags(dict(tags or {})))
        return cls(client, run.info.run_id)

    def log(self, params: Mapping[str, object] | None = None, metrics: Mapping[str, float] | None = None,
            tags: Mapping[str, object] | None = None, step: int = 0) -> None:  # fmt: skip
        """Params and tags (redacted) in one batch, then metrics in batches of MLflow's 1,000-entry limit."""
        from mlflow.entities import Param, RunTag

        safe = redact({str(k): v for k, v in (params or {}).items()})
        batch_params = [Param(key, str(value)[:PARAM_LIMIT]) for key, value in safe.items()]
        batch_tags = [RunTag(key, value) for key, value in redact_tags(dict(tags or {})).items()]
        if batch_params or batch_tags:
            self.client.log_batch(self.run_id, params=batch_params, tags=batch_tags)
        if metrics:
            log_metric_batch(self.client, self.run_id, dict(metrics), step)

    def log_metrics(self, metrics: Mapping[str, float], step: int = 0) -> None:
        """Metrics only (the :class:`~evaluation.test_phase.RunSink` interface, so the test phase can log here)."""
        self.log(metrics=metrics, step=step)

    def set_tags(self, tags: Mapping[str, object]) -> None:
        for key, value in redact_tags(dict(tags)).items():
            self.client.set_tag(self.run_id, key, value)

    def log_text(self, text: str, artifact_file: str) -> None:
        """A text artifact (a report, a settings YAML with a storage URL in it), redacted like params."""
        self.client.log_text(self.run_id, redact_text(text), artifact_file)

    def log_artifact(self, path: str | Path, artifact_path: str | None = None) -> None:
        self.client.log_artifact(self.run_id, str(path), artifact_path)

    def log_artifacts(self, folder: str | Path, artifact_path: str | None = None) -> None:
        self.client.log_artifacts(self.run_id, str(folder), artifact_path)

    def finish(self, status: str = "FINISHED") -> None:
        """The run's terminal status (``FINISHED``, ``FAILED`` or ``KILLED``), with its end time."""
        self.client.set_terminated(self.run_id, status)

    @contextlib.contextmanager
    def active(self) -> Iterator[None]:
        """The run as MLflow's active run, for the APIs that only log there (``mlflow.pyfunc.log_model``)."""
        import mlflow

        with mlflow.start_run(run_id=self.run_id):
            yield

    def __enter__(self) -> TrackedRun:
        return self

    def __exit__(self, kind, error, trace) -> None:
        self.finish("FINISHED" if kind is None else "FAILED")
