"""The team tracking server (docs/rules.md §9): PostgreSQL, basic auth, served artifacts, tuning workers, outages, secrets.

Tests marked ``server`` (``make test-server``) start a throwaway PostgreSQL cluster in a temporary folder on a
free port and the tracking server exactly as ``make server`` does (``python -m training.tracking.server``). The
two tests at the end need neither and run in the default suite: an unreachable server at start, and secrets.
"""

from __future__ import annotations

import base64
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import optuna
import pytest
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate
from mlflow import MlflowClient

from tests.conftest import free_port, train_command
from tests.process_budget import wait_working
from tests.tune_support import shared_study_trials, study_record
from training.tracking.server import (
    MAX_OVERFLOW_ENV,
    POOL_SIZE_ENV,
    WORKER_THREADS,
    PostgresCluster,
    ServerSetupError,
    main,
    max_connections,
    pg_bin_dir,
    pool_env,
)
from training.tuning.heartbeat import CLOCK_STEP_S

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
#: CPU seconds the outage test's 4-epoch smoke training may use: many times what it takes (tests/process_budget.py).
OUTAGE_CPU_SECONDS = 600
#: What a test of the run's tracking does not read: the test-time-augmented, perturbed and held-out passes.
NO_EXTRA_TEST_PASSES = (
    "tta.enabled=false",
    "evaluation.perturbation.enabled=false",
    "evaluation.heldout.enabled=false",
)
ADMIN_PASSWORD = "Adm1n-test-pw-7c1f"  # a throwaway server's; the point is that it never shows up in a run
ALICE_PASSWORD = "Al1ce-test-pw-93ab"
TINY = ("debug=smoke", "data.subset={train:64,val:48,test:32}", "trainer.max_epochs=1", "evaluation.n_boot=0",
        "evaluation.per_source=false", "pruner=none", "trainer.enable_progress_bar=false")  # fmt: skip


def wait_until_up(url: str, process: subprocess.Popen, timeout: float) -> None:
    """Poll ``<url>/health`` until the server answers; raise with the exit status if it dies first."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            urllib.request.urlopen(url.rstrip("/") + "/health", timeout=2)
            return
        except OSError as error:
            if process.poll() is not None:
                raise ServerSetupError(f"mlflow server exited with status {process.returncode}") from error
            if time.monotonic() > deadline:
                raise ServerSetupError(f"mlflow server did not answer on {url} within {timeout:.0f}s") from error
            time.sleep(0.5)


class TeamServer:
    """A PostgreSQL cluster plus ``mlflow server`` started through ``make server``'s own entry point."""

    def __init__(self, base: Path):
        self.base = base
        self.dir = base / "server"
        self.pg_port, self.port = free_port(), free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.process: subprocess.Popen | None = None
        self.log = base / "server.log"

    def start(self) -> None:
        command = [sys.executable, "-m", "training.tracking.server", "--dir", str(self.dir), "--port", str(self.port),
                   "--pg-port", str(self.pg_port), "--workers", "1"]  # fmt: skip
        env = {**os.environ, "MLFLOW_ADMIN_PASSWORD": ADMIN_PASSWORD}
        env.pop("PGDATA", None)
        with open(self.log, "ab") as log:
            self.process = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT,
                                            start_new_session=True)  # fmt: skip
        try:
            wait_until_up(self.url, self.process, timeout=180)
        except ServerSetupError as error:
            pytest.fail(f"{error}: {self.log.read_text()[-3000:]}")

    def stop(self) -> None:
        """Stop the tracking server (all its workers); PostgreSQL keeps running."""
        if self.process is None or self.process.poll() is not None:
            return
        os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()

    @property
    def cluster(self) -> PostgresCluster:
        return PostgresCluster(self.dir / "pgdata", self.pg_port)

    @property
    def db_password(self) -> str:
        return (self.dir / "db_password").read_text().strip()

    def env(self, username: str = "admin", password: str = ADMIN_PASSWORD) -> dict[str, str]:
        """A client's environment: the server's URI and credentials, nothing else of the server's."""
        return {**os.environ, "MLFLOW_TRACKING_URI": self.url, "MLFLOW_TRACKING_USERNAME": username,
                "MLFLOW_TRACKING_PASSWORD": password, "PYTHONUNBUFFERED": "1"}  # fmt: skip


@pytest.fixture(scope="module")
def team_server():
    try:
        pg_bin_dir()
    except ServerSetupError as error:
        pytest.fail(f"the server tests need PostgreSQL (CI installs it): {error}")
    # Not under pytest's tmp_path: that is private to root (0700) and PostgreSQL runs as the postgres user.
    base = Path(tempfile.mkdtemp(prefix="cxrlt-server-", dir="/tmp"))
    os.chmod(base, 0o711)
    server = TeamServer(base)
    server.start()
    yield server
    server.stop()
    server.cluster.stop()
    shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def admin(team_server, monkeypatch) -> MlflowClient:
    """An ``MlflowClient`` on the server with the admin's credentials (MLflow reads them from the environment)."""
    for key, value in team_server.env().items():
        monkeypatch.setenv(key, value)
    return MlflowClient(team_server.url)


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory):
    """The smoke data set generated once, shared by the module's trainings and tuning workers."""
    root = tmp_path_factory.mktemp("data") / "synthetic"
    with initialize_config_dir(str(CONFIGS), version_base="1.3"):
        cfg = compose("train", overrides=["debug=smoke", f"data.source.root={root}"])
    instantiate(cfg.data.source).prepare()
    return root


def _status(url: str, auth: tuple[str, str] | None) -> int:
    request = urllib.request.Request(f"{url}/api/2.0/mlflow/experiments/search?max_results=1")
    if auth:
        request.add_header("Authorization", "Basic " + base64.b64encode(":".join(auth).encode()).decode())
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status
    except urllib.error.HTTPError as error:
        return error.code


def _everything_in(client: MlflowClient, run_id: str, folder: Path) -> bytes:
    """Params, tags and every artifact file of a run, as one blob to search for secrets."""
    run = client.get_run(run_id)
    blob = repr(run.data.params).encode() + repr(run.data.tags).encode()
    local = Path(client.download_artifacts(run_id, "", str(folder)))
    files = [p for p in local.rglob("*") if p.is_file()]
    assert files, "the run has no artifacts to search"
    return blob + b"".join(p.read_bytes() for p in files)


def _tune(tmp: Path, synthetic: Path, storage: str, trials: int, *overrides: str) -> list[str]:
    """What ``make tune STORAGE=<storage> TRIALS=<trials> ARGS="..."`` runs, every output under ``tmp``."""
    return [sys.executable, "-m", "training.tune", "task=task1", f"tune.trials={trials}", f'tune.storage="{storage}"',
            f"tracking.artifact_root={tmp}/artifacts", f"tracking.checkpoint_root={tmp}/checkpoints",
            f"data.source.root={synthetic}", *TINY, *overrides]  # fmt: skip


@pytest.mark.server
def test_requests_need_valid_credentials(team_server):
    assert _status(team_server.url, None) == 401
    assert _status(team_server.url, ("admin", "wrong-password")) == 401
    assert _status(team_server.url, ("nobody", ADMIN_PASSWORD)) == 401
    assert _status(team_server.url, ("admin", ADMIN_PASSWORD)) == 200
    # the credential cache make server turns on keys on the password too: a trusted user's wrong one still fails
    assert _status(team_server.url, ("admin", "wrong-password")) == 401


@pytest.mark.server
def test_training_as_a_team_member_logs_a_finished_run_through_the_server(team_server, admin, synthetic, tmp_path):
    from mlflow.server import get_app_client  # MLflow's user-management client; admin credentials (fixture)

    get_app_client("basic-auth", tracking_uri=team_server.url).create_user("alice", ALICE_PASSWORD)
    env = team_server.env("alice", ALICE_PASSWORD)
    done = subprocess.run(train_command(tmp_path, "debug=smoke", f"data.source.root={synthetic}",
                                        "tracking.experiment=team-smoke", "trainer.enable_progress_bar=false"),
                          env=env, capture_output=True, text=True, timeout=400)  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]

    client = admin  # reads alice's run
    experiment = client.get_experiment_by_name("team-smoke")
    (run,) = client.search_runs([experiment.experiment_id])
    assert run.info.status == "FINISHED" and run.info.user_id == "alice"
    assert {"val/mAP", "train/loss", "test/mAP"} <= set(run.data.metrics)
    assert run.info.artifact_uri.startswith("mlflow-artifacts:")  # uploaded through the server, not to a path
    assert {a.path for a in client.list_artifacts(run.info.run_id)} >= {"config.yaml", "checkpoints", "predictions"}
    stored = team_server.dir / "artifacts" / experiment.experiment_id / run.info.run_id / "artifacts"
    assert (stored / "checkpoints" / "best.ckpt").is_file()  # in the server's artifact store...
    assert not (tmp_path / "artifacts").exists()  # ...and nothing in the client's local artifact root

    blob = _everything_in(client, run.info.run_id, tmp_path / "download")
    assert ALICE_PASSWORD.encode() not in blob and ADMIN_PASSWORD.encode() not in blob


@pytest.mark.server
def test_two_tuning_workers_share_one_postgresql_study(team_server, admin, synthetic, tmp_path):
    team_server.cluster.psql('CREATE DATABASE "optuna_workers" OWNER "mlflow"')
    # The password inline, as a user might type it: it must be redacted wherever the URL is recorded.
    storage = f"postgresql://mlflow:{team_server.db_password}@127.0.0.1:{team_server.pg_port}/optuna_workers"
    trials = 4
    workers = [
        subprocess.Popen(_tune(tmp_path, synthetic, storage, trials, f"tune.worker={k}", "tune.study=workers"),
                         env=team_server.env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for k in range(2)
    ]  # fmt: skip
    outputs = [worker.communicate(timeout=500)[0] for worker in workers]
    for worker, output in zip(workers, outputs, strict=True):
        assert worker.returncode == 0, output[-5000:]
    assert all(team_server.db_password not in output for output in outputs)

    study = optuna.load_study(study_name="workers", storage=storage)
    record = study_record(storage, "workers", outputs)  # what a failure below prints: who ended which trial, when
    print(record)  # shown by pytest -rP on a pass, to compare timings
    trained = shared_study_trials(study, trials, workers=2, record=record)
    assert all(t.state == optuna.trial.TrialState.COMPLETE for t in trained), record
    assert {t.user_attrs["cxrlt.worker"] for t in trained} == {0, 1}, record

    client = admin
    runs = client.search_runs([client.get_experiment_by_name("task1").experiment_id],
                              filter_string="tags.`optuna.study_name` = 'workers'")  # fmt: skip
    parents = [r for r in runs if r.data.tags.get("cxrlt.kind") == "tuning-study"]
    assert len(parents) == 1
    assert parents[0].data.tags["optuna.storage"].startswith("postgresql://mlflow:***@")
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parents[0].info.run_id]
    assert sorted(int(r.data.tags["optuna.trial_number"]) for r in children) == [t.number for t in trained]
    assert {r.data.tags["optuna.worker"] for r in children} == {"0", "1"}
    for run in runs:
        assert team_server.db_password not in repr(run.data.params) + repr(run.data.tags)


@pytest.mark.server
def test_killed_worker_trial_fails_and_another_worker_completes_the_study(
    team_server, admin, synthetic, tmp_path, monkeypatch
):
    team_server.cluster.psql('CREATE DATABASE "optuna_kill" OWNER "mlflow"')
    storage = f"postgresql://mlflow@127.0.0.1:{team_server.pg_port}/optuna_kill"
    monkeypatch.setenv("PGPASSWORD", team_server.db_password)  # the documented way: not in the URL
    env = {**team_server.env(), "PGPASSWORD": team_server.db_password}
    grace = 3
    beat = ("tune.study=kill", "tune.heartbeat_interval=1", f"tune.grace_period={grace}")
    first = subprocess.Popen(_tune(tmp_path, synthetic, storage, 2, "tune.worker=0", *beat), env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)  # fmt: skip
    deadline = time.time() + 240
    victim = None
    while victim is None:  # wait until the first worker's trial is training (its MLflow run exists)
        assert first.poll() is None, first.stdout.read()[-3000:]
        assert time.time() < deadline, "the first worker never started a trial"
        time.sleep(0.5)
        try:
            trials = optuna.load_study(study_name="kill", storage=storage).trials
        except KeyError:  # study not created yet
            continue
        victim = next((t for t in trials if "mlflow_run_id" in t.user_attrs), None)
    first.send_signal(signal.SIGKILL)  # like a lost node: no cleanup at all
    first.wait()
    time.sleep(grace + CLOCK_STEP_S)  # its trial's last beat is older than the grace period: the next worker fails it

    second = subprocess.run(_tune(tmp_path, synthetic, storage, 2, "tune.worker=1", *beat), env=env,
                            capture_output=True, text=True, timeout=400)  # fmt: skip
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]

    trials = {t.number: t for t in optuna.load_study(study_name="kill", storage=storage).trials}
    assert trials[victim.number].state == optuna.trial.TrialState.FAIL  # failed by the heartbeat check
    retries = [t for t in trials.values() if t.system_attrs.get("failed_trial") == victim.number]
    assert len(retries) == 1 and retries[0].params == victim.params  # the same point, run again
    complete = [t for t in trials.values() if t.state == optuna.trial.TrialState.COMPLETE]
    assert len(complete) == 2 and len(trials) == 3  # the study's 2 trials, the killed one replaced
    client = admin
    ghost = client.get_run(victim.user_attrs["mlflow_run_id"])
    assert ghost.info.status == "KILLED" and ghost.data.tags["optuna.state"] == "FAIL"


@pytest.mark.server
def test_server_stopped_mid_run_buffers_metrics_then_fails_naming_the_run_and_resume_finishes_it(
    team_server, admin, synthetic, tmp_path
):
    epochs = 4
    overrides = ("debug=smoke", f"data.source.root={synthetic}", f"trainer.max_epochs={epochs}",
                 "tracking.experiment=outage", "tracking.reconnect_timeout=10", "trainer.enable_progress_bar=false",
                 "evaluation.n_boot=0", "evaluation.plots=false", *NO_EXTRA_TEST_PASSES,
                 # MLflow's system-metrics thread asks the stopped server for the run through MLflow's own HTTP
                 # retries (about 4 minutes) and the exit joins that thread; the default reconnect_timeout (300 s)
                 # mostly outlasts those retries, this test's 10 s would leave them as most of its time.
                 "tracking.system_metrics.enabled=false")  # fmt: skip
    env = team_server.env()
    client = admin
    log = tmp_path / "train.log"
    with log.open("w") as sink:  # a file, not a pipe: nobody reads a pipe while the budget below waits
        training = subprocess.Popen(train_command(tmp_path, *overrides), env=env, stdout=sink,
                                    stderr=subprocess.STDOUT, text=True)  # fmt: skip

    def first_epoch_logged() -> bool:
        found = list((tmp_path / "checkpoints").glob("*"))
        return bool(found) and bool(client.get_metric_history(found[0].name, "val/mAP"))

    # Waits bounded by the training's CPU time, not the wall clock, which a busy machine stretches several-fold.
    wait_working(training, "training until its first epoch reached the server", OUTAGE_CPU_SECONDS,
                 until=first_epoch_logged, poll=0.3)  # fmt: skip
    assert training.poll() is None, log.read_text()[-3000:]  # stop the server as soon as the first epoch reached it
    run_id = next((tmp_path / "checkpoints").glob("*")).name
    team_server.stop()
    try:
        wait_working(training, "the training after the server stopped", OUTAGE_CPU_SECONDS)
    finally:
        team_server.start()
    output = log.read_text()
    assert training.returncode != 0  # not a silent success, not a hang
    assert "unreachable" in output and f"resume={run_id}" in output, output[-3000:]
    assert "buffering the metrics of run" in output  # training went on through the outage
    kept = tmp_path / "checkpoints" / run_id
    assert (kept / "last.ckpt").is_file() and (kept / "unsent_metrics.json").is_file()
    assert client.get_run(run_id).info.status == "RUNNING"  # not FINISHED: nothing was tested or stored
    assert len(client.get_metric_history(run_id, "val/mAP")) < epochs

    resumed_log = tmp_path / "resumed.log"
    with resumed_log.open("w") as sink:
        resumed = subprocess.Popen(train_command(tmp_path, *overrides, f"resume={run_id}"), env=env, stdout=sink,
                                   stderr=subprocess.STDOUT, text=True)  # fmt: skip
    wait_working(resumed, "the resumed training", OUTAGE_CPU_SECONDS)
    assert resumed.returncode == 0, resumed_log.read_text()[-3000:]
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED" and "test/mAP" in run.data.metrics
    for key in ("val/mAP", "train/loss"):
        steps = sorted(m.step for m in client.get_metric_history(run_id, key))
        assert steps == list(range(epochs)), (key, steps, output[-6000:], resumed_log.read_text()[-3000:])  # once each


@pytest.mark.server
def test_a_burst_of_concurrent_metric_writes_is_stored_whole(team_server, admin):
    """Issue 33: 200 concurrent ``log_metric`` calls x 3 lost one to ``QueuePool limit ... reached`` (HTTP 400).

    The burst is more than a worker runs at once (its thread limit), so requests queue for the store's connection
    pool; each round starts together (a barrier) so the requests overlap rather than trickle in.
    """
    calls, rounds = 200, 3
    assert int(team_server.cluster.psql("SHOW max_connections")) >= max_connections(workers=1)  # the fixture's one
    run_id = admin.create_run(admin.create_experiment("load")).info.run_id
    barrier = threading.Barrier(calls)
    failures: list[str] = []

    def write(step: int) -> None:
        barrier.wait()
        try:
            admin.log_metric(run_id, "load", float(step), step=step)
        except Exception as error:  # noqa: BLE001 - every lost write is reported, whatever MLflow raised
            failures.append(f"step {step}: {str(error)[:200]}")

    started = time.monotonic()
    for r in range(rounds):
        threads = [threading.Thread(target=write, args=(r * calls + i,)) for i in range(calls)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    elapsed = time.monotonic() - started
    assert not failures, f"{len(failures)} of {calls * rounds} writes failed after {elapsed:.0f}s: {failures[:3]}"
    steps = sorted(m.step for m in admin.get_metric_history(run_id, "load"))
    assert steps == list(range(calls * rounds))


def test_a_pool_sized_for_the_worker_serves_every_request_thread_at_once(tmp_path, monkeypatch):
    """The engine MLflow builds from the server's pool variables hands out a connection to each of a worker's
    request threads without waiting; with MLflow's default pool (5 + 10) the 16th waits 30 s, then fails."""
    from mlflow.store.db.utils import create_sqlalchemy_engine  # what the server's stores build their engine with

    for key, value in pool_env({}).items():
        monkeypatch.setenv(key, value)
    engine = create_sqlalchemy_engine(f"sqlite:///{tmp_path}/pool.db")
    held = []
    try:
        started = time.monotonic()
        held = [engine.connect() for _ in range(WORKER_THREADS)]
        assert time.monotonic() - started < 10  # no connection waited for another to come back
    finally:
        for connection in held:
            connection.close()
        engine.dispose()


def test_a_worker_runs_no_more_requests_at_once_than_its_pool_serves():
    """The pool arithmetic's premise: MLflow runs its Flask app on anyio's default thread limiter (plus the event
    loop's thread); an upgrade that changes either must change :data:`WORKER_THREADS` too."""
    import inspect

    import anyio
    from mlflow.server import fastapi_app

    async def tokens() -> float:
        return anyio.to_thread.current_default_thread_limiter().total_tokens

    assert anyio.run(tokens) + 1 == WORKER_THREADS
    assert "anyio.to_thread.run_sync(self.wsgi," in inspect.getsource(fastapi_app._EfficientWSGIResponder.__call__)


def test_pool_settings_of_the_operator_are_kept_and_too_small_ones_are_named(caplog):
    assert pool_env({}) == {POOL_SIZE_ENV: "5", MAX_OVERFLOW_ENV: str(WORKER_THREADS - 5)}
    assert not caplog.records
    assert pool_env({POOL_SIZE_ENV: "50", MAX_OVERFLOW_ENV: "0"}) == {POOL_SIZE_ENV: "50", MAX_OVERFLOW_ENV: "0"}
    assert max_connections(1, {POOL_SIZE_ENV: "50", MAX_OVERFLOW_ENV: "0"}) == 3 * 60 + 50  # MLflow reads 0 as 10
    with caplog.at_level("WARNING"):
        assert pool_env({POOL_SIZE_ENV: "5", MAX_OVERFLOW_ENV: "10"})[MAX_OVERFLOW_ENV] == "10"
    assert "QueuePool limit" in caplog.text and "15 connections per pool" in caplog.text
    with pytest.raises(ServerSetupError, match="whole numbers"):
        pool_env({POOL_SIZE_ENV: "many"})
    # PostgreSQL must accept every pool of every worker full: 3 pools of 41 per worker, plus 50 for the rest.
    assert max_connections(1, pool_env({})) == 3 * 41 + 50
    assert max_connections(2, pool_env({})) == 2 * 3 * 41 + 50


def test_bad_server_settings_stop_make_server_with_one_line(monkeypatch, tmp_path):
    monkeypatch.setenv(POOL_SIZE_ENV, "lots")
    with pytest.raises(SystemExit) as stopped:
        main(["--dir", str(tmp_path), "--setup-only"])
    assert str(stopped.value).startswith("make server: ") and "\n" not in str(stopped.value)
    monkeypatch.delenv(POOL_SIZE_ENV)
    with pytest.raises(SystemExit, match="^make server: --workers must be at least 1"):
        main(["--workers", "0", "--dir", str(tmp_path), "--setup-only"])


@pytest.mark.e2e
def test_unreachable_server_at_start_fails_fast_and_creates_nothing(tmp_path):
    port = free_port()  # nothing listens there
    env = {**os.environ, "MLFLOW_TRACKING_URI": f"http://127.0.0.1:{port}", "PYTHONUNBUFFERED": "1"}
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "training.tune", "task=task1", "tune.trials=1", "debug=smoke",
                           f"tune.storage=sqlite:///{tmp_path}/optuna.db", f"tracking.checkpoint_root={tmp_path}/ckpt"],
                          env=env, capture_output=True, text=True, timeout=300)  # fmt: skip
    elapsed = time.monotonic() - started
    output = done.stdout + done.stderr
    assert done.returncode != 0
    assert f"tracking server http://127.0.0.1:{port} is unreachable" in output, output[-3000:]
    assert not (tmp_path / "optuna.db").exists() and not (tmp_path / "ckpt").exists()  # nothing created
    assert elapsed < 120, elapsed  # generous (interpreter start and imports); MLflow's retries alone take minutes


@pytest.mark.e2e
def test_secrets_passed_by_environment_appear_nowhere_in_the_run(tmp_path, run_env):
    secret, token = "pg-Secret-4b7e2d", "tok-Secret-91ce55"
    env = {**run_env, "CXRLT_DB_PASSWORD": secret, "MLFLOW_TRACKING_TOKEN": token}
    done = subprocess.run(
        train_command(tmp_path, "debug=smoke", f"data.source.root={tmp_path}/synthetic", "trainer.enable_progress_bar=false",
                      "evaluation.n_boot=0", "+tracking.db_password=${oc.env:CXRLT_DB_PASSWORD}",
                      "+tags.storage=postgresql://optuna:${oc.env:CXRLT_DB_PASSWORD}@db:5432/optuna",
                      "+tracking.note=${oc.env:MLFLOW_TRACKING_TOKEN}"),
        env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    client = MlflowClient(run_env["MLFLOW_TRACKING_URI"])
    (run,) = client.search_runs([client.get_experiment_by_name("task1").experiment_id])
    assert run.data.params["tracking.db_password"] == "***"  # redacted, not merely missing
    assert run.data.tags["cxrlt.storage"] == "postgresql://optuna:***@db:5432/optuna"
    assert run.data.params["tracking.note"] == "***"
    blob = _everything_in(client, run.info.run_id, tmp_path / "download")
    assert b"config.yaml" in b"".join(p.name.encode() for p in (tmp_path / "download").rglob("*"))
    assert secret.encode() not in blob and token.encode() not in blob
