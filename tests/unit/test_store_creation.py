"""Issue 33 (4): trainings started together on a fresh SQLite store must all find it created, none crash in its
migration (``alembic ... expected to match one row``).

Real processes (spawned, so each has its own MLflow and SQLAlchemy state, as two trainings would) are released
together by a barrier onto each fresh store and go through :func:`training.tracking.uri.tracking_client`, the step
every command's first store access takes (training's :func:`training.tracking.session.open_session` waits for the
same lock: ``test_training_opens_its_store_only_once_it_holds_the_store_lock``). The race is timing-dependent, so several processes meet on several fresh stores: on the unfixed
code at least one of them crashed on every attempt we made.
"""

from __future__ import annotations

import fcntl
import multiprocessing
import sqlite3
import threading
import traceback
from pathlib import Path

import pytest

PROCESSES = 4
STORES = 2


def _first_use(barrier, root: str, index: int, results) -> None:
    """One process's first use of each fresh store: the store, the shared experiment, a run and a metric."""
    try:
        from training.tracking.tracked_run import ensure_experiment
        from training.tracking.uri import tracking_client

        for store in range(STORES):
            uri = f"sqlite:///{root}/store{store}/mlflow.db"
            barrier.wait(timeout=120)
            try:
                client = tracking_client(uri)
                experiment = ensure_experiment(client, "task1", uri, f"{root}/store{store}/artifacts")
                run = client.create_run(experiment, run_name=f"p{index}")
                client.log_metric(run.info.run_id, "val/mAP", 0.5, step=0)
                client.set_terminated(run.info.run_id)
                results.put((index, store, None))
            except Exception:  # noqa: BLE001 - the parent reports whatever the first use raised
                results.put((index, store, traceback.format_exc(limit=3)[-1500:]))
    except Exception:  # noqa: BLE001 - an import or barrier failure must reach the parent too
        results.put((index, -1, traceback.format_exc()[-1500:]))


@pytest.mark.e2e
def test_processes_creating_one_fresh_store_together_all_succeed(tmp_path):
    context = multiprocessing.get_context("spawn")
    barrier, results = context.Barrier(PROCESSES), context.Queue()
    processes = [context.Process(target=_first_use, args=(barrier, str(tmp_path), i, results))
                 for i in range(PROCESSES)]  # fmt: skip
    for process in processes:
        process.start()
    for process in processes:
        process.join(timeout=300)
    outcomes = [results.get(timeout=5) for _ in range(PROCESSES * STORES)]
    failures = [f"process {i}, store {s}: {error}" for i, s, error in outcomes if error]
    assert not failures, f"{len(failures)} of {PROCESSES * STORES} first uses failed:\n" + "\n".join(failures[:3])

    for store in range(STORES):
        db = sqlite3.connect(tmp_path / f"store{store}" / "mlflow.db")
        try:
            (experiments,) = db.execute("SELECT COUNT(*) FROM experiments WHERE name = 'task1'").fetchone()
            (metrics,) = db.execute("SELECT COUNT(*) FROM metrics WHERE key = 'val/mAP'").fetchone()
            (versions,) = db.execute("SELECT COUNT(*) FROM alembic_version").fetchone()
        finally:
            db.close()
        assert (experiments, metrics, versions) == (1, PROCESSES, 1)  # one schema, one experiment, every run's metric


@pytest.mark.e2e
def test_training_opens_its_store_only_once_it_holds_the_store_lock(tmp_path, monkeypatch):
    """``open_session`` (training's first contact with the store) waits for the lock before anything opens the
    database, Lightning's logger included, and then creates the experiment and the run."""
    from hydra import compose, initialize_config_dir

    from training.tracking import session, store_lock

    uri = f"sqlite:///{tmp_path}/store/mlflow.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    configs = Path(__file__).resolve().parents[2] / "configs"
    with initialize_config_dir(str(configs), version_base="1.3"):
        cfg = compose("train", overrides=["debug=smoke", f"tracking.artifact_root={tmp_path}/artifacts",
                                          f"tracking.checkpoint_root={tmp_path}/checkpoints"])  # fmt: skip
    lock = store_lock.lock_path(uri)
    lock.parent.mkdir(parents=True)
    opened: list = []
    with open(lock, "a") as held:  # another process creating the store, as far as this one can tell
        fcntl.flock(held, fcntl.LOCK_EX)
        training = threading.Thread(target=lambda: opened.append(session.open_session(cfg, {})))
        training.start()
        training.join(timeout=3)
        assert training.is_alive() and not (tmp_path / "store" / "mlflow.db").exists()
        fcntl.flock(held, fcntl.LOCK_UN)
    training.join(timeout=120)
    (run,) = opened
    experiment = run.client.get_experiment_by_name(cfg.tracking.experiment)
    assert run.client.get_run(run.run_id).info.experiment_id == experiment.experiment_id


@pytest.mark.parametrize("uri", ["http://team:5000", "sqlite://", "sqlite:///:memory:", "postgresql://u@h/db"])
def test_stores_that_need_no_lock_take_none(uri, tmp_path, monkeypatch):
    from training.tracking import store_lock

    monkeypatch.chdir(tmp_path)
    assert store_lock.lock_path(uri) is None
    store_lock.ensure_store(uri)  # returns at once: there is no server to ask, nothing to create
    assert not list(tmp_path.iterdir())  # no lock file, no database


def test_lock_file_sits_beside_the_database(tmp_path, monkeypatch):
    from training.tracking import store_lock

    monkeypatch.chdir(tmp_path)
    assert store_lock.lock_path("sqlite:///mlruns/mlflow.db") == tmp_path / "mlruns" / "mlflow.db.lock"
    assert store_lock.lock_path(f"sqlite:///{tmp_path}/a/b.db?timeout=5") == tmp_path / "a" / "b.db.lock"
