"""Which MLflow store a command talks to, decided in one place.

Every entry point and Makefile target (``make ui``, ``make serve`` through ``python -m training.tracking.uri``)
asks this module, so they all read and write the same store. Precedence: ``MLFLOW_TRACKING_URI`` (one variable
points everything at a team server) > the configured URI > :data:`DEFAULT_TRACKING_URI`.
"""

from __future__ import annotations

import functools
import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from mlflow import MlflowClient

DEFAULT_TRACKING_URI = "sqlite:///mlruns/mlflow.db"


def resolve_tracking_uri(configured: str | None = None) -> str:
    """The store to use: ``MLFLOW_TRACKING_URI``, else ``configured``, else the project's SQLite store."""
    return os.environ.get("MLFLOW_TRACKING_URI") or configured or DEFAULT_TRACKING_URI


def tracking_client(uri: str | None = None) -> MlflowClient:
    """An ``MlflowClient`` on ``uri`` (already resolved by the caller) or on :func:`resolve_tracking_uri`'s store.

    The only place a client is made outside the training logger, so no command ends up on another store. A server is
    health-checked once per process (fails in seconds, not after minutes of retries), and the store is opened through
    :func:`training.tracking.store_lock.ensure_store`, so commands started together do not race its creation.
    """
    from mlflow import MlflowClient  # imported here: `python -m training.tracking.uri` serves the Makefile fast

    from training.tracking.store_lock import ensure_store

    uri = uri or resolve_tracking_uri()
    _answered(uri)
    ensure_store(uri)
    return MlflowClient(uri)


@functools.cache
def _answered(uri: str) -> None:
    """:func:`training.tracking.health.check_reachable`, once per process and server: later calls come during a
    run, whose outages the session rides out (:mod:`training.tracking.session`)."""
    from training.tracking.health import check_reachable

    check_reachable(uri)


def is_local_store(uri: str) -> bool:
    """A store on this machine (SQLite or files), whose artifacts the project keeps under ``mlruns/artifacts``."""
    return uri.startswith(("sqlite:", "file:")) or "://" not in uri


if __name__ == "__main__":  # the Makefile's `make ui` / `make serve` read the store from here
    print(resolve_tracking_uri())
