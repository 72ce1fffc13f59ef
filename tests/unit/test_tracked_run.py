"""The one owner of runs outside training: terminal status, redaction and experiment creation under a race."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from training.tracking.redaction import REDACTED
from training.tracking.tracked_run import TrackedRun, ensure_experiment


class RecordingClient:
    """Just the MlflowClient calls a TrackedRun makes, recorded."""

    def __init__(self):
        self.created_tags: dict = {}
        self.params: dict = {}
        self.tags: dict = {}
        self.metrics: list = []
        self.status: list[str] = []
        self.experiments: dict[str, str] = {}

    def create_run(self, experiment, run_name, tags):
        self.created_tags = dict(tags)
        return SimpleNamespace(info=SimpleNamespace(run_id="r1"))

    def log_batch(self, run_id, metrics=(), params=(), tags=()):
        self.params.update({p.key: p.value for p in params})
        self.tags.update({t.key: t.value for t in tags})
        self.metrics += [(m.key, m.value, m.step) for m in metrics]

    def log_text(self, run_id, text, artifact_file):
        self.texts = {**getattr(self, "texts", {}), artifact_file: text}

    def set_terminated(self, run_id, status):
        self.status.append(status)

    def get_experiment_by_name(self, name):
        found = self.experiments.get(name)
        return SimpleNamespace(experiment_id=found) if found else None


def test_a_block_that_raises_leaves_a_failed_run_and_one_that_ends_a_finished_run():
    client = RecordingClient()
    with pytest.raises(RuntimeError, match="upload"), TrackedRun.start(client, "0", "bench") as run:
        run.log(metrics={"auroc": 0.8})
        raise RuntimeError("upload failed")
    with TrackedRun.start(client, "0", "bench"):
        pass
    assert client.status == ["FAILED", "FINISHED"]


def test_params_and_tags_are_redacted_as_a_training_run_s_are(monkeypatch):
    monkeypatch.setenv("HUB_TOKEN", "s3cr3t-value-123")
    client = RecordingClient()
    run = TrackedRun.start(client, "0", "x", tags={"storage": "postgresql://u:pw1@db/optuna", "api_key": "k"})
    run.log(params={"model": "runs:/abc", "hub_token": "t0k", "note": "uses s3cr3t-value-123", "long": "a" * 7000},
            tags={"members": "a b"})  # fmt: skip
    assert client.created_tags == {"storage": f"postgresql://u:{REDACTED}@db/optuna", "api_key": REDACTED}
    assert client.params["model"] == "runs:/abc" and client.params["hub_token"] == REDACTED
    assert "s3cr3t-value-123" not in client.params["note"]
    assert len(client.params["long"]) == 6000  # MLflow's limit on one value: cut, not refused
    assert client.tags == {"members": "a b"}
    run.log_text("storage: postgresql://u:pw1@db/optuna\nseed: 3\n", "tune/settings.yaml")  # a report, as tuning writes
    assert client.texts["tune/settings.yaml"] == f"storage: postgresql://u:{REDACTED}@db/optuna\nseed: 3\n"


def test_more_than_a_thousand_metrics_go_in_several_batches_and_all_arrive():
    client = RecordingClient()
    TrackedRun(client, "r1").log(metrics={f"m{i}": float(i) for i in range(2500)}, step=3)
    assert len(client.metrics) == 2500 and {step for *_, step in client.metrics} == {3}


def test_an_experiment_created_meanwhile_by_another_worker_is_used_not_an_error(tmp_path):
    client = RecordingClient()

    def lose_the_race(name, artifact_location=None, tags=None):
        client.experiments[name] = "7"  # the other worker's create landed first
        raise RuntimeError("RESOURCE_ALREADY_EXISTS")

    client.create_experiment = lose_the_race
    assert ensure_experiment(client, "task1", "sqlite:///x.db", tmp_path) == "7"


def test_an_experiment_is_created_with_its_artifacts_under_the_root_on_a_local_store_only(tmp_path):
    calls = []
    client = RecordingClient()
    client.create_experiment = lambda name, artifact_location=None, tags=None: calls.append(artifact_location) or "3"
    ensure_experiment(client, "a", "sqlite:///mlruns/mlflow.db", tmp_path / "artifacts")
    ensure_experiment(client, "b", "http://server:5000", tmp_path / "artifacts")
    assert calls == [(tmp_path / "artifacts").resolve().as_uri(), None]
