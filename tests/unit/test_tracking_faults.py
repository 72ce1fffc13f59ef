"""Tracking faults and secrets: redaction, fail-fast health check, metric buffering through an outage."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from tests.conftest import free_port
from training.tracking import health as tracking
from training.tracking.health import TrackingUnavailable, check_reachable
from training.tracking.redaction import REDACTED, redact, redact_tags, redact_text
from training.tracking.run_logger import RunLogger
from training.tracking.session import TrackingSession, config_yaml, flatten


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


@pytest.mark.parametrize(
    "key",
    ["aws_secret_access_key", "authorization", "pw", "pwd", "db_pass", "client_secret", "secrets", "apiKey",
     "accessToken", "hf_token", "refresh-token", "MY_PASSPHRASE", "gcp_credentials", "session", "session_id",
     "sessionCookie", "cookie", "private_key", "ssh.private.key", "signing_key", "Proxy-Authorization", "auth"],
)  # fmt: skip
def test_a_secret_word_anywhere_in_the_key_blanks_its_value(key):
    for value in ("hunter2-plain", 123456, 3.5):  # a numeric PIN or password is as secret as a string
        assert redact({"foo": {key: value}}) == {"foo": {key: REDACTED}}, (key, value)


def test_everything_under_a_secret_named_node_is_blanked():
    tree = {"credentials": {"user": "alice", "value": "abc-123"}, "secrets": ["s-1", "s-2"], "tokens": {"hub": "t"}}
    assert redact(tree) == {"credentials": {"user": REDACTED, "value": REDACTED}, "secrets": [REDACTED, REDACTED],
                            "tokens": {"hub": REDACTED}}  # fmt: skip


@pytest.mark.parametrize(
    ("key", "value"),
    [("tokenizer", "bert-base"), ("max_tokens", 77), ("num_reg_tokens", 4), ("reg_tokens", 4), ("keypoints", 17),
     ("session_timeout", 30), ("token_ttl", 3600), ("cache_key", "abc"), ("sort_key", "name"), ("monkey", "x"),
     ("class_token", True), ("use_auth", False), ("password", None), ("api_key", ""), ("passes", 2),
     ("bypass", "yes"), ("author", "me"), ("sessionless", "x")],
)  # fmt: skip
def test_ordinary_keys_and_values_that_cannot_be_secrets_stay_readable(key, value):
    # A count or a duration under a secret word describes secrets, it is none; a boolean or nothing hides nothing.
    assert redact({key: value}) == {key: value}


def test_numbers_under_a_secret_key_are_counts_only_with_a_quantity_word():
    assert redact({"token": 77, "session_timeout": "30 min", "max_tokens": "abc"}) == {
        "token": REDACTED, "session_timeout": REDACTED, "max_tokens": REDACTED}  # fmt: skip


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Bearer eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxIn0.sig-_x", "Bearer ***"),
        ("bearer abc123", "bearer ***"),
        ("Basic dXNlcjpwYXNzd29yZA==", "Basic ***"),  # base64 of user:password
        ("curl -H 'Authorization: Bearer abc123def' https://h", "curl -H 'Authorization: ***' https://h"),
        ("Cookie: sid=s%3Aabc; theme=dark", "Cookie: ***"),
        ("https://hub.lan/x?token=tok-123&format=json", f"https://hub.lan/x?token={REDACTED}&format=json"),
        ("+foo.pw=hunter2 model=resnet18", f"+foo.pw={REDACTED} model=resnet18"),
        ('{"db.password": "hunter2", "lr": 0.1}', f'{{"db.password": "{REDACTED}", "lr": 0.1}}'),
        # ordinary text is left alone
        ("Basic augmentation with max_tokens=77", "Basic augmentation with max_tokens=77"),
        ("loss=asl sampler=class_aware tokenizer=bert", "loss=asl sampler=class_aware tokenizer=bert"),
        ("http://127.0.0.1:5000/#/experiments", "http://127.0.0.1:5000/#/experiments"),
    ],
)
def test_redact_text_blanks_bearer_and_basic_credentials_headers_and_secret_pairs(text, expected):
    assert redact_text(text) == expected
    assert redact({"note": text}) == {"note": expected}  # the same in any config string value


def test_run_tags_are_blanked_by_name_as_well_as_by_value():
    tags = {"cxrlt.hub_token": "tok-123456", "cxrlt.grid": "lr", "cxrlt.run_key": "0a1b2c", "note": "Bearer abc-123"}
    assert redact_tags(tags) == {"cxrlt.hub_token": REDACTED, "cxrlt.grid": "lr", "cxrlt.run_key": "0a1b2c",
                                 "note": f"Bearer {REDACTED}"}  # fmt: skip


def test_secret_environment_variables_are_recognised_anywhere_in_their_name(monkeypatch):
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "aws-secret-value-9")
    monkeypatch.setenv("DESKTOP_SESSION", "ubuntu-desktop")  # not a secret: must not blank every "ubuntu-desktop"
    assert redact_text("key aws-secret-value-9 on ubuntu-desktop") == "key *** on ubuntu-desktop"


def test_no_key_of_the_platforms_own_configs_is_blanked():
    """Every task with every adapter, and every choice of every group: redaction must leave all of it readable."""
    from hydra import compose, initialize_config_dir

    configs = Path(__file__).resolve().parents[2] / "configs"

    def choices(group: str) -> list[str]:
        return sorted(path.stem for path in (configs / group).glob("*.yaml"))

    overrides = [[f"task={t}", f"adapter={a}"] for t in choices("task") for a in choices("adapter")]
    for group in ("data", "model", "loss", "sampler", "augment", "trainer", "stage", "evaluation", "tta", "debug"):
        overrides += [[f"{group}={choice}"] for choice in choices(group)]
    overrides += [["hparams_search=lr"], *([f"pruner={p}"] for p in choices("pruner"))]
    with initialize_config_dir(str(configs), version_base="1.3"):
        trees = [OmegaConf.to_container(compose("tune", overrides=o)) for o in overrides]
        trees += [OmegaConf.to_container(compose(root)) for root in ("evaluate", "data_tools")]
    assert len(trees) == len(overrides) + 2
    for tree in trees:
        assert redact(tree) == tree


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


def test_a_run_resumed_after_a_kill_in_its_test_phase_logs_each_final_value_once(remote_logger, tmp_path):
    """Killed after ``best_epoch``, ``val/mAP_best`` and a first test batch were stored, the resumed process runs the
    test phase again: the run keeps those values and gets only the ones it lacks (issue 30, 14)."""
    logger, client, state = remote_logger
    logger.logged_steps = {("best_epoch", 0), ("val/mAP_best", 0), ("test/mAP", 0)}  # what remember_logged found
    session = TrackingSession(logger, "run123", tmp_path / "ckpt", None, "http://127.0.0.1:1", reconnect_timeout=5)
    session.log_metrics({"best_epoch": 3, "val/mAP_best": 0.2})
    session.log_metrics({"test/mAP": 0.3, "test/mAUROC": 0.6})
    assert [[(key, step) for key, _, step in batch] for batch in client.batches] == [[("test/mAUROC", 0)]]
