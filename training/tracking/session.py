"""Opening, resuming and closing the MLflow run of one training.

Lightning's ``MLFlowLogger`` does the metric and parameter logging. This module decides *which* run a training
writes to (a new one, or the unfinished one it resumes), where its working checkpoints live, and when the run is
declared finished: only after testing and artifact upload succeeded, so a FINISHED run is always complete.

A tracking server that goes away (http(s) tracking URIs only; a local SQLite store cannot):

* **At start** the server's ``/health`` is asked with a short timeout before anything is created, so a wrong
  URI or a stopped server fails in seconds with :class:`TrackingUnavailable` instead of MLflow's client retrying
  for minutes.
* **During fitting** epoch metrics that cannot be sent are buffered, in memory and in
  ``<checkpoint_dir>/unsent_metrics.json``, and sent, in order, at the first epoch the server answers again.
  Training never stops for the server.
* **After fitting** (test metrics, artifacts, the terminal status) the session waits up to
  ``tracking.reconnect_timeout`` seconds for the server. If it is still gone, the training ends with
  :class:`TrackingUnavailable` (non-zero exit) naming the run; the run stays RUNNING on the server, its local
  checkpoints and unsent metrics are kept, and ``resume=<run id>`` once the server is back sends the buffered
  metrics, tests and finishes the same run.

No secret reaches the run: :func:`redact` blanks config values under secret-looking keys (the secret word may sit
anywhere in the key: ``aws_secret_access_key``, ``authorization``, ``pw``), and :func:`redact_text` blanks
credentials inside any string (URL passwords, ``Bearer``/``Basic`` credentials, secret ``name=value`` pairs) and
the value of any secret-looking environment variable, in params, tags and ``config.yaml``. Over-redacting a
harmless value is preferred to leaking a secret; ``tests/unit/test_tracking_faults.py`` checks that none of the
platform's own config keys is blanked.
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import os
import re
import shutil
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from lightning.pytorch.loggers import MLFlowLogger
from lightning.pytorch.utilities import rank_zero_only
from omegaconf import DictConfig, OmegaConf

from training.tracking.uri import is_local_store, resolve_tracking_uri, tracking_client

log = logging.getLogger(__name__)

RUN_KEY_TAG = "cxrlt.run_key"
UNFINISHED = ("RUNNING", "FAILED", "KILLED", "SCHEDULED")
#: Word stems that make a key name secret wherever they appear in it (``db_password``, ``clientSecret``,
#: ``aws_secret_access_key``, ``Proxy-Authorization``). No ordinary word contains them, so they match inside words.
SECRET_STEMS = ("password", "passwd", "passphrase", "secret", "credential", "authoriz", "cookie", "apikey",
                "accesskey", "privatekey")  # fmt: skip
#: Secret only as a whole word of the key (split at ``_ . -``, spaces and camelCase): ``tokenizer``, ``author``,
#: ``bypass`` and ``sessionless`` are ordinary. A word ending in ``token`` (``accesstoken``) is secret as well.
SECRET_WORDS = frozenset({"pw", "pwd", "pass", "auth", "creds", "token", "tokens", "session", "sessionid", "jwt"})
#: ``key`` is secret only after one of these words (``api_key``, ``aws_secret_access_key``, ``ssh.private.key``);
#: ``cache_key``, ``sort_key`` and ``keypoints`` are ordinary.
KEY_PREFIXES = frozenset({"access", "api", "private", "secret", "signing", "encryption", "client", "master",
                          "account", "ssh"})  # fmt: skip
#: A number under a key that also names a quantity counts or times secrets rather than being one
#: (``max_tokens``, ``num_reg_tokens``, ``session_timeout``, ``token_ttl``); a string there is still blanked.
QUANTITY_WORDS = frozenset({"max", "min", "num", "n", "count", "len", "length", "size", "limit", "timeout", "ttl",
                            "expiry", "expires", "lifetime", "interval", "dim", "retries", "tokens"})  # fmt: skip
#: Environment variables whose values are secrets (``MLFLOW_TRACKING_PASSWORD``, ``PGPASSWORD``, ``HF_TOKEN``,
#: ``AWS_SECRET_ACCESS_KEY``). Narrower than config keys on purpose: a value found here is blanked in *all* text,
#: so ``DESKTOP_SESSION=ubuntu`` or ``PWD`` (the working directory) must not count.
SECRET_ENV = re.compile(
    r"(PASSWORD|PASSWD|PASSPHRASE|TOKEN|SECRET|API_?KEY|ACCESS_KEY|PRIVATE_KEY|CREDENTIALS?|AUTHORIZATION)(_|$)", re.I
)
#: ``scheme://user:password@host`` -> ``scheme://user:***@host``.
URL_PASSWORD = re.compile(r"(\b[a-zA-Z][a-zA-Z0-9+.-]*://[^/\s:@]*:)[^@\s/]+(@)")
#: HTTP credentials in free text: ``Bearer <token>`` (any token) and ``Basic <base64 of user:password>``.
BEARER = re.compile(r"\b(bearer\s+)[A-Za-z0-9\-._~+/]+=*", re.I)
BASIC = re.compile(r"\b(basic\s+)([A-Za-z0-9+/]{4,}={0,2})(?![\w+/=])", re.I)
#: A credential header written out (``Authorization: Token abc``, ``Cookie: sid=...``): its whole value.
HEADER = re.compile(r"\b((?:proxy-)?authorization|(?:set-)?cookie)(\s*:\s*)[^\r\n'\"]+", re.I)
#: ``name=value`` (query strings, command lines, connection strings), ``"name": "value"`` (JSON) and
#: ``name: value`` (YAML): the value is blanked when the name is secret by :func:`is_secret_key`.
PAIR = re.compile(r"""(?<![\w.\-])([A-Za-z_][\w.\-]*)(\s*=\s*|"\s*:\s*"?|:\s+)([^\s"'&;,)\]}]+)""")
REDACTED = "***"
#: Seconds the ``/health`` probe waits: long enough for a busy server, short enough to fail fast.
HEALTH_TIMEOUT_S = 5.0
UNSENT_FILE = "unsent_metrics.json"
#: ``make ui``'s address (its default PORT), for the link a local run prints at the end.
LOCAL_UI = "http://127.0.0.1:5000"
#: Characters MLflow refuses in metric names (Lightning's ``MLFlowLogger`` strips them the same way).
METRIC_NAME = re.compile(r"[^a-zA-Z0-9_/. -]+")


class TrackingUnavailable(RuntimeError):
    """The tracking server does not answer; the message names the server, the run (if any) and what to do."""


def is_remote(uri: str) -> bool:
    """Whether ``uri`` is a tracking server (which can go away), not a local store."""
    return uri.startswith(("http://", "https://"))


def server_reachable(uri: str, timeout: float = HEALTH_TIMEOUT_S) -> str | None:
    """``None`` when ``<uri>/health`` answers 200 within ``timeout``, else why not (for the error message).

    ``/health`` needs no credentials even with basic auth on, so this tells "server gone" apart from "wrong
    password" (which MLflow's client reports itself, at once, as a 401).
    """
    try:
        with urllib.request.urlopen(uri.rstrip("/") + "/health", timeout=timeout) as response:
            return None if response.status == 200 else f"/health answered {response.status}"
    except urllib.error.HTTPError as error:
        return f"/health answered {error.code}"
    except (OSError, ValueError) as error:  # refused, timeout, DNS, malformed URL
        return str(getattr(error, "reason", error))


def check_reachable(uri: str, timeout: float = HEALTH_TIMEOUT_S) -> None:
    """Fail fast with a clear message when a tracking server ``uri`` does not answer (local stores pass).

    Raises:
        TrackingUnavailable: the server did not answer its health check within ``timeout`` seconds.
    """
    if not is_remote(uri):
        return
    reason = server_reachable(uri, timeout)
    if reason is not None:
        raise TrackingUnavailable(
            f"tracking server {redact_text(uri)} is unreachable ({reason}); nothing was logged. Start it "
            "(`make server`) or point MLFLOW_TRACKING_URI at a running one."
        )


def _secret_env_values() -> list[str]:
    """Values of secret-looking environment variables (``MLFLOW_TRACKING_PASSWORD``, ``PGPASSWORD``, ...)."""
    names = (name for name in os.environ if SECRET_ENV.search(name))
    # Very short values ("1", "true") would blank unrelated text and are no secret anyway.
    return sorted({os.environ[n] for n in names if len(os.environ[n]) >= 6}, key=len, reverse=True)


def _words(name: str) -> list[str]:
    """``"db.apiKey"`` -> ``["db", "api", "key"]``: how a person reads the name, whatever its spelling style."""
    name = re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", name)
    name = re.sub(r"([A-Z]+)([A-Z][a-z])", r"\1_\2", name)
    return [word for word in re.split(r"[^a-z0-9]+", name.lower()) if word]


def is_secret_key(path: str, value=None) -> bool:
    """Whether ``value``, found under the key ``path`` (dotted, parents included), must be blanked.

    Secret-looking words are matched anywhere in the path, so a secret's children are secret too
    (``credentials.user``). The rules err on the side of blanking: a harmless value under an odd name may be
    hidden, but a secret is never shown because of how its key is spelled. Only values that cannot carry a secret
    stay: nothing (``None``, ``""``), a boolean, and a number under a quantity word (see ``QUANTITY_WORDS``).
    """
    words = _words(path)
    secret = (
        any(word in SECRET_WORDS or word.endswith(("token", "tokens")) for word in words)
        or any(stem in word for word in words for stem in SECRET_STEMS)
        or any(word in ("key", "keys") and prev in KEY_PREFIXES for prev, word in zip(words, words[1:], strict=False))
    )
    if not secret or value is None or value == "" or isinstance(value, bool):
        return False
    return not (_is_number(value) and QUANTITY_WORDS.intersection(words))


def _is_number(value) -> bool:
    if isinstance(value, int | float):
        return True
    try:
        float(value)
    except (TypeError, ValueError):
        return False
    return True


def _basic(match: re.Match) -> str:
    """``Basic <b64>`` blanked only when the base64 is ``user:password``, so "Basic augmentation" stays."""
    try:
        decoded = base64.b64decode(match.group(2), validate=True).decode()
    except (ValueError, UnicodeDecodeError):
        return match.group(0)
    return match.group(1) + REDACTED if ":" in decoded else match.group(0)


def _pair(match: re.Match) -> str:
    key, sep, value = match.groups()
    return key + sep + REDACTED if is_secret_key(key, value) else match.group(0)


def redact_text(text: str) -> str:
    """``text`` with every credential it shows replaced by ``***``.

    URL passwords, ``Bearer``/``Basic`` credentials, ``Authorization``/``Cookie`` header values, the value of a
    secret-named ``name=value`` / ``name: value`` pair (``?token=...``, ``+db.pw=...``) and the values of secret
    environment variables, so tags and messages built from commands, URLs or errors leak nothing either.
    """
    text = URL_PASSWORD.sub(rf"\g<1>{REDACTED}\g<2>", text)
    text = BEARER.sub(rf"\g<1>{REDACTED}", text)
    text = BASIC.sub(_basic, text)
    text = HEADER.sub(rf"\g<1>\g<2>{REDACTED}", text)
    text = PAIR.sub(_pair, text)
    for value in _secret_env_values():
        text = text.replace(value, REDACTED)
    return text


def redact(node, key: str = ""):
    """A plain config tree with every secret blanked: values under secret keys (:func:`is_secret_key`, given the
    dotted path so a secret node's children count too) and credentials inside any string (:func:`redact_text`)."""
    if isinstance(node, dict):
        return {k: redact(v, f"{key}.{k}" if key else str(k)) for k, v in node.items()}
    if isinstance(node, list):
        return [redact(v, key) for v in node]
    if is_secret_key(key, node):
        return REDACTED
    return redact_text(node) if isinstance(node, str) else node


def redact_tags(tags: dict) -> dict[str, str]:
    """Run tags as they may be sent: the value of a secret-named tag (``+tags.hub_token=...``) blanked like a
    config value, and credentials inside any value (:func:`redact_text`), since tags are as public as params."""
    return {str(k): REDACTED if is_secret_key(str(k), v) else redact_text(str(v)) for k, v in tags.items()}


class RunLogger(MLFlowLogger):
    """An ``MLFlowLogger`` whose run stays open until the pipeline closes it, and outlives a tracking outage.

    Lightning finalises the logger at the end of ``fit`` and again after ``test``; the platform still has to test
    and upload artifacts after ``fit``, so the terminal status is set once, by :meth:`TrackingSession.close`.

    Epoch metrics that cannot reach a tracking server are kept in :attr:`unsent` (and in :attr:`spool`, so a
    later ``resume`` can send them) and sent first the next time the server answers.
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.unsent: list = []
        self.spool: Path | None = None
        self._outage_logged = False
        #: Some of :attr:`unsent` may have reached the server already: a send failed mid-way (the server stored
        #: the batch but the answer was lost), or a previous process died between sending and clearing its spool.
        self._maybe_delivered = False
        #: ``(key, epoch)`` pairs the run already holds when it is resumed (see :meth:`remember_logged`).
        self.logged_steps: set[tuple[str, int]] = set()

    def remember_logged(self) -> None:
        """Note every ``(key, step)`` the resumed run already holds, so no epoch is logged twice.

        Lightning may re-run the end of the epoch a checkpoint was saved in (its validation, hence its metrics)
        when it resumes from that checkpoint; the run keeps the value it already has.
        """
        client, run_id = self.experiment, self.run_id
        for key in client.get_run(run_id).data.metrics:
            self.logged_steps.update((key, m.step) for m in client.get_metric_history(run_id, key))

    def finalize(self, status: str = "success") -> None:
        """Ignore Lightning's per-stage finalisation (see class docstring)."""

    @rank_zero_only
    def log_metrics(self, metrics, step=None) -> None:
        """Log with the epoch as MLflow's step; buffer instead while a tracking server is unreachable.

        The platform logs epoch-level metrics only (step-level values would be re-logged after a resume), so the
        epoch is the natural x axis in the MLflow UI; Lightning's extra ``epoch`` pseudo-metric is dropped.
        """
        metrics = dict(metrics)
        epoch = metrics.pop("epoch", None)
        step = int(epoch) if epoch is not None else step
        if self.logged_steps:
            metrics = {k: v for k, v in metrics.items() if (k, step or 0) not in self.logged_steps}
            if not metrics:
                return
        if not is_remote(self._tracking_uri or ""):
            super().log_metrics(metrics, step)
            return
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        self.unsent.extend(
            Metric(METRIC_NAME.sub("", k), float(v), now, step or 0)
            for k, v in metrics.items()
            if not isinstance(v, str)
        )  # the same filtering as MLFlowLogger.log_metrics
        self.flush()

    def flush(self) -> bool:
        """Send the buffered metrics if the server answers; returns whether nothing is left unsent.

        A failed send is retried at the next call; the buffer is mirrored to :attr:`spool` whenever it is not
        empty, so even a process killed during the outage leaves its metrics for ``resume``. Sending is
        idempotent: after a failed attempt, values the server already holds (same key, step and timestamp; a
        buffered value keeps its original timestamp) are dropped first, so no epoch is logged twice.
        """
        if not self.unsent:
            return True
        reason = server_reachable(self._tracking_uri)
        if reason is None:
            try:
                if self._maybe_delivered:
                    self._drop_delivered()
                send_metrics(self.experiment, self.run_id, self.unsent)
                self._maybe_delivered = False
            except Exception as error:  # noqa: BLE001 - the server went away between the probe and the send
                self._maybe_delivered = True
                reason = str(error).splitlines()[0] if str(error) else type(error).__name__
        if reason is None:
            if self._outage_logged:
                log.warning("tracking server back: sent %d buffered metric values of run %s", len(self.unsent),
                            self._run_id)  # fmt: skip
            self.unsent.clear()
            self._outage_logged = False
            if self.spool is not None:
                self.spool.unlink(missing_ok=True)
            return True
        if not self._outage_logged:
            log.warning("tracking server %s unreachable (%s): buffering the metrics of run %s; training goes on",
                        redact_text(self._tracking_uri), reason, self._run_id)  # fmt: skip
            self._outage_logged = True
        self.save_unsent()
        return False

    def _drop_delivered(self) -> None:
        keys = {m.key for m in self.unsent}
        held = {(m.key, m.step, m.timestamp) for k in keys for m in self.experiment.get_metric_history(self.run_id, k)}
        self.unsent = [m for m in self.unsent if (m.key, m.step, m.timestamp) not in held]

    def save_unsent(self) -> None:
        """Mirror the buffer to :attr:`spool` (written whole, then renamed, so it is never half a file)."""
        if self.spool is None:
            return
        self.spool.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.spool.with_suffix(".tmp")
        tmp.write_text(json.dumps([[m.key, m.value, m.timestamp, m.step] for m in self.unsent]))
        tmp.replace(self.spool)

    def load_unsent(self) -> int:
        """Put a previous process's unsent metrics (from :attr:`spool`) back in the buffer; returns how many."""
        if self.spool is None or not self.spool.is_file():
            return 0
        from mlflow.entities import Metric

        loaded = [Metric(k, float(v), int(t), int(s)) for k, v, t, s in json.loads(self.spool.read_text())]
        self.unsent[:0] = loaded
        self._maybe_delivered = True  # the previous process may have sent some before it died
        return len(loaded)


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
        reason = server_reachable(self.uri)
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
            reason = server_reachable(self.uri)

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
        """Log final (non-epoch) metrics in MLflow's batch-size chunks."""
        self.await_server()
        log_metric_batch(self.client, self.run_id, metrics, step)

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


def log_metric_batch(client, run_id: str, metrics: dict[str, float], step: int = 0) -> None:
    """``log_batch`` in chunks of MLflow's 1,000-metric limit, one timestamp for all."""
    from mlflow.entities import Metric

    now = int(time.time() * 1000)
    send_metrics(client, run_id, [Metric(key, float(value), now, step) for key, value in metrics.items()])


def send_metrics(client, run_id: str, items: list) -> None:
    """``log_batch`` of MLflow ``Metric`` entities in chunks of MLflow's 1,000-metric limit."""
    for start in range(0, len(items), 1000):
        client.log_batch(run_id, metrics=items[start : start + 1000])


def reconnect_timeout(cfg: DictConfig) -> float:
    """Seconds to wait for a vanished tracking server before the post-fit steps give up."""
    return float(cfg.tracking.get("reconnect_timeout", 300))


def tracking_uri(cfg: DictConfig) -> str:
    """The store a training config points at (:func:`training.tracking.uri.resolve_tracking_uri` decides)."""
    return resolve_tracking_uri(cfg.tracking.get("uri"))


def run_key(cfg: DictConfig) -> str:
    """Hash of the resolved config without the resume switch: the identity a restart must match to resume."""
    plain = OmegaConf.to_container(cfg, resolve=True)
    plain.pop("resume", None)
    plain.get("tracking", {}).pop("reconnect_timeout", None)  # how long to wait for a server is not identity
    plain.get("tracking", {}).pop("system_metrics", None)  # nor whether the machine's load is sampled
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


def _find_resumable(uri: str, experiment_name: str, key: str, checkpoint_root: Path) -> tuple[str, Path] | None:
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


def open_session(cfg: DictConfig, tags: dict[str, str]) -> TrackingSession:
    """Create the run (or reopen the one to resume), tag it and log the resolved config.

    With ``resume=true`` the newest unfinished run of the same config continues from its ``last.ckpt``; with
    ``resume=<run id>`` that run does. When nothing matches, a new run starts and the log says so.

    Raises:
        TrackingUnavailable: the tracking server does not answer (checked before anything is created).
    """
    uri = tracking_uri(cfg)
    check_reachable(uri)
    checkpoint_root = Path(cfg.tracking.checkpoint_root).resolve()
    local_store = is_local_store(uri)
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

    run_tags = redact_tags({**tags, RUN_KEY_TAG: key, "mlflow.source.git.commit": git_commit()})
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
