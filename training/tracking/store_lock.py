"""A local SQLite store is created (its schema migrated) by one process at a time.

MLflow's ``SqlAlchemyStore`` creates and migrates the schema the first time a process opens a database without its
tables, and nothing stops two processes doing it at once: two trainings started together on a fresh
``mlruns/mlflow.db`` would both run the migration, and one would crash in alembic ("expected to match one row").
:func:`ensure_store` opens the store under an exclusive ``flock`` on ``<db>.lock`` beside the database, so the
second process waits for the first to finish and then finds the schema complete. ``flock`` is released by the
kernel when its holder exits, so a killed process never leaves the store locked.

Every command's first contact with the store goes through it: :func:`training.tracking.uri.tracking_client` and,
for training (whose Lightning logger makes its own client), :func:`training.tracking.session.open_session`.
Tracking servers and other databases migrate on the server side and need no lock.
"""

from __future__ import annotations

import fcntl
import logging
import os
from pathlib import Path

log = logging.getLogger(__name__)

#: Databases this process has already opened: the schema exists from then on, no need to lock again.
_ready: set[Path] = set()


def database_path(uri: str) -> Path | None:
    """The database file of a SQLite store, resolved as SQLite resolves it (from the working folder), else None.

    In-memory SQLite and every non-SQLite store have nothing on this machine that two processes could race for.
    """
    if not uri.startswith("sqlite:"):
        return None
    from sqlalchemy.engine import make_url  # imported here: `python -m training.tracking.uri` stays fast

    database = make_url(uri).database
    if not database or database == ":memory:" or database.startswith("file:"):
        return None
    return Path(os.path.abspath(database))


def lock_path(uri: str) -> Path | None:
    """``<database>.lock``, the file whose ``flock`` guards the store's creation; None where there is no file."""
    database = database_path(uri)
    return None if database is None else database.with_name(database.name + ".lock")


def _open(uri: str) -> None:
    from mlflow import MlflowClient  # MLflow's own store creation, the one every later client of the process reuses

    MlflowClient(uri).search_experiments(max_results=1)  # a real query: the store exists, whatever MLflow defers


def ensure_store(uri: str) -> None:
    """Open ``uri``'s store once in this process, holding the store's lock if it is a SQLite file.

    Opening is what creates and migrates the schema; a process that finds the lock held waits (the migration takes
    seconds) and then opens a complete store. A folder where the lock cannot be created (read-only) is used as
    is: nobody can be migrating a database there.
    """
    database = database_path(uri)
    if database is None or database in _ready:
        return
    lock = lock_path(uri)
    try:
        lock.parent.mkdir(parents=True, exist_ok=True)
        handle = open(lock, "a")  # noqa: SIM115 - held open for as long as the lock is
    except OSError:
        _open(uri)
        _ready.add(database)
        return
    with handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log.info("waiting for another process to finish creating the MLflow store %s", database)
            fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            _open(uri)
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
    _ready.add(database)
