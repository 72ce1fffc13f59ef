"""Tracking faults and secrets: redaction, fail-fast health check, metric buffering through an outage."""

from __future__ import annotations

import json
import time

import pytest
from omegaconf import OmegaConf

from tests.conftest import free_port
from training.tracking import session as tracking
from training.tracking.session import (
    REDACTED,
    RunLogger,
    TrackingSession,
    TrackingUnavailable,
    check_reachable,
    config_yaml,
    flatten,
    redact,
    redact_text,
)


def test_redact_blanks_secret_keys_url_passwords_and_secret_env_values(monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", "env-secret-123")
    monkeypatch.setenv("PGPASSWORD", "pg-secret-456")
    tree = {
        "db": {"password": "hunter2-plain", "api_key": "k-123456", "host": "db.lan"},
        "tokenizer": "bert-base",  # not a secret, although it contains "token"
        "max_tokens": 77,
        "storage": "postgresql://optuna:url-secret@db.lan:5432/optuna",
        "note": "uses env-secret-123 and pg-secret-456",
        "list": ["https://u:list-secret@h/x"],
    }
    out = redact(tree)
    assert out["db"] == {"password": REDACTED, "api_key": REDACTED, "host": "db.lan"}
    assert out["tokenizer"] == "bert-base" and out["max_tokens"] == 77
    assert out["storage"] == f"postgresql://optuna:{REDACTED}@db.lan:5432/optuna"
    assert out["note"] == f"uses {REDACTED} and {REDACTED}"
    assert out["list"] == [f"https://u:{REDACTED}@h/x"]
    assert redact_text("sqlite:///mlruns/mlflow.db") == "sqlite:///mlruns/mlflow.db"  # nothing to hide


def test_flatten_and_config_yaml_never_carry_a_secret(monkeypatch):
    monkeypatch.setenv("CXRLT_DB_PASSWORD", "s3cr3t-from-env")
    cfg = OmegaConf.create({"tracking": {"uri": "http://alice:inline-pw@host:5000", "db_password": "${oc.env:CXRLT_DB_PASSWORD}"},
                            "model": {"lr": 0.1}})  # fmt: skip
    params = flatten(cfg)
    assert params["tracking.db_password"] == REDACTED
    assert params["tracking.uri"] == f"http://alice:{REDACTED}@host:5000"
    assert params["model.lr"] == "0.1"
    text = config_yaml(cfg) + json.dumps(params)
    assert "s3cr3t-from-env" not in text and "inline-pw" not in text


def test_unreachable_server_fails_within_seconds_naming_it_without_its_password():
    uri = f"http://bob:pw-in-url@127.0.0.1:{free_port()}"  # nothing listens there
    start = time.monotonic()
    with pytest.raises(
        TrackingUnavailable, match=r"tracking server http://bob:\*\*\*@127\.0\.0\.1:\d+ is unreachable"
    ) as error:
        check_reachable(uri)
    assert time.monotonic() - start < 10  # generous bound; MLflow's own client would retry for minutes
    assert "pw-in-url" not in str(error.value)
    check_reachable("sqlite:///never/opened.db")  # local stores have no server to be down


class FakeClient:
    """Stands in for ``MlflowClient``: records what reached the "server"."""

    def __init__(self):
        self.batches: list[list] = []
        self.terminated: list[str] = []
        self.stored: list = []
        self.lose_answer = False  # store the batch, then fail as if the connection dropped before the reply

    def log_batch(self, run_id, metrics=()):
        self.batches.append([(m.key, m.value, m.step) for m in metrics])
        self.stored.extend(metrics)
        if self.lose_answer:
            self.lose_answer = False
            raise ConnectionError("connection reset by peer")

    def get_metric_history(self, run_id, key):
        return [m for m in self.stored if m.key == key]

    def set_terminated(self, run_id, status):
        self.terminated.append(status)


@pytest.fixture
def remote_logger(tmp_path, monkeypatch):
    """A ``RunLogger`` on an http URI whose reachability the test switches (``state["up"]``)."""
    state = {"up": True}
    monkeypatch.setattr(tracking, "server_reachable", lambda uri, timeout=5.0: None if state["up"] else "refused")
    logger = RunLogger(tracking_uri="http://127.0.0.1:1", run_id="run123")
    client = FakeClient()
    logger._mlflow_client = client
    logger._initialized = True  # the run exists; Lightning would have created it at open_session
    logger.spool = tmp_path / "ckpt" / "unsent_metrics.json"
    return logger, client, state


def test_metrics_are_buffered_while_the_server_is_down_and_sent_in_order_when_it_is_back(remote_logger):
    logger, client, state = remote_logger
    logger.log_metrics({"val/mAP": 0.1, "epoch": 0})
    state["up"] = False
    logger.log_metrics({"val/mAP": 0.2, "epoch": 1})
    logger.log_metrics({"val/mAP": 0.3, "epoch": 2})
    assert client.batches == [[("val/mAP", 0.1, 0)]]  # nothing sent while down, and no exception
    assert [row[3] for row in json.loads(logger.spool.read_text())] == [1, 2]  # kept on disk for a resume
    state["up"] = True
    logger.log_metrics({"val/mAP": 0.4, "epoch": 3})
    assert client.batches[1] == [("val/mAP", 0.2, 1), ("val/mAP", 0.3, 2), ("val/mAP", 0.4, 3)]
    assert not logger.unsent and not logger.spool.exists()


def test_a_resumed_process_sends_what_the_previous_one_could_not(remote_logger):
    logger, client, state = remote_logger
    state["up"] = False
    logger.log_metrics({"train/loss": 1.5, "epoch": 4})
    successor = RunLogger(tracking_uri="http://127.0.0.1:1", run_id="run123")
    successor._mlflow_client, successor._initialized, successor.spool = client, True, logger.spool
    assert successor.load_unsent() == 1
    state["up"] = True
    assert successor.flush()
    assert client.batches == [[("train/loss", 1.5, 4)]]


def test_server_still_down_after_fit_ends_the_training_with_the_run_id_and_keeps_checkpoints(remote_logger, tmp_path):
    logger, client, state = remote_logger
    state["up"] = False
    logger.log_metrics({"val/mAP": 0.5, "epoch": 0})
    checkpoints = tmp_path / "ckpt"
    (checkpoints / "last.ckpt").write_bytes(b"weights")
    session = TrackingSession(logger, "run123", checkpoints, None, "http://127.0.0.1:1", reconnect_timeout=0.3)
    with pytest.raises(TrackingUnavailable, match=r"run run123 is left unfinished.*resume=run123"):
        session.log_metrics({"test/mAP": 0.4})
    with pytest.raises(TrackingUnavailable):  # the pipeline's close(FAILED) does not wait again nor hide it
        session.close("FAILED")
    assert client.terminated == [] and client.batches == []
    assert (checkpoints / "last.ckpt").is_file() and (checkpoints / "unsent_metrics.json").is_file()


def test_server_back_within_the_timeout_lets_the_run_finish(remote_logger, tmp_path):
    logger, client, state = remote_logger
    state["up"] = False
    logger.log_metrics({"val/mAP": 0.5, "epoch": 0})
    state["up"] = True
    session = TrackingSession(logger, "run123", tmp_path / "ckpt", None, "http://127.0.0.1:1", reconnect_timeout=5)
    session.close("FINISHED")
    assert client.batches == [[("val/mAP", 0.5, 0)]] and client.terminated == ["FINISHED"]
    assert not (tmp_path / "ckpt").exists()  # a FINISHED run drops its working checkpoints


def test_a_batch_stored_but_unanswered_is_not_logged_twice(remote_logger):
    logger, client, state = remote_logger
    client.lose_answer = True
    logger.log_metrics({"val/mAP": 0.1, "epoch": 0})  # stored, but the logger cannot know
    assert logger.unsent and logger.spool.is_file()
    logger.log_metrics({"val/mAP": 0.2, "epoch": 1})
    assert sorted(m.step for m in client.stored) == [0, 1]  # each epoch exactly once on the "server"
    assert not logger.unsent and not logger.spool.exists()


def test_a_resumed_run_keeps_the_epoch_values_it_already_holds(remote_logger):
    logger, client, state = remote_logger
    logger.logged_steps = {("val/mAP", 3), ("train/loss", 3)}  # what remember_logged found on the server
    logger.log_metrics({"val/mAP": 0.9, "epoch": 3})  # Lightning re-validating the checkpoint's epoch
    logger.log_metrics({"val/mAP": 0.8, "val/mAUROC": 0.7, "epoch": 3})
    logger.log_metrics({"val/mAP": 0.6, "epoch": 4})
    assert client.batches == [[("val/mAUROC", 0.7, 3)], [("val/mAP", 0.6, 4)]]
