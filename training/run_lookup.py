"""Which finished run a model reference names, answered before any model code loads.

So a mistyped id is refused in the seconds the tracking store takes to answer, not after torch and Lightning were
imported. References: ``<run id>`` (also ``run:<id>``, ``runs:/<id>``), ``models:/<name>@<alias>`` or
``models:/<name>/<version>`` (resolved to the source run), ``<run id>:rank<n>`` (the ``n``-th best kept
checkpoint; ``rank1`` is the run itself) and, for ``make ensemble`` only, ``<run id>:top<k>``.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from training.errors import UserError
from training.tracking.store_lock import database_path
from training.tracking.uri import tracking_client

if TYPE_CHECKING:
    from mlflow import MlflowClient
    from mlflow.entities import Run

MODEL_URI = re.compile(r"^models:/(?P<name>[^/@]+)(?:@(?P<alias>[^/]+)|/(?P<version>\d+))$")


class ModelNotFound(UserError, LookupError):
    """The named run, model version or one of its artifacts does not exist in the tracking store."""


class RunNotFinished(UserError, ValueError):
    """The run is still running, failed or was killed: it has no tested best checkpoint to load."""


#: ``<run>:rank<n>`` or ``<run>:top<k>``: one kept checkpoint of a run, or its k best (run ids hold no colon).
CHECKPOINT_SUFFIX = re.compile(r"^(?P<run>[^:]+):(?:rank(?P<rank>\d{1,4})|top(?P<top>\d{1,4}))$")


class BadReference(UserError, ValueError):
    """A model reference that names no run, version or checkpoint in any store (a typo in its form)."""


def split_checkpoint(reference: str) -> tuple[str, int, int | None]:
    """``(reference without its suffix, rank, top)``: rank 1 and top None without a ``:rank<n>`` / ``:top<k>``
    suffix, ``top=k`` for ``:top<k>``; ``models:/`` and ``runs:/`` references are returned whole.
    """
    reference = reference.strip()
    bare = reference.removeprefix("run:")
    if reference.startswith(("models:/", "runs:/")) or ":" not in bare:
        return reference, 1, None
    match = CHECKPOINT_SUFFIX.match(bare)
    number = int(match["rank"] or match["top"]) if match else 0
    if number < 1:
        raise BadReference(f"{reference!r}: expected <run id>, <run id>:rank<n> (the n-th best kept checkpoint) or "
                           "<run id>:top<k> (its k best), n and k from 1")  # fmt: skip
    return match["run"], (number if match["rank"] else 1), (number if match["top"] else None)


def parse_reference(reference: str) -> tuple[str, str | None]:
    """``(kind, value)``: ``("registered", uri)`` for ``models:/...``, else ``("run", run id)`` (a ``:rank<n>``
    suffix names a checkpoint of that run, :func:`split_checkpoint`)."""
    reference, _, top = split_checkpoint(reference)
    if top is not None:
        raise BadReference(f"{reference}:top{top} names {top} checkpoints; only make ensemble takes several (one "
                           "is <run id>:rank<n>)")  # fmt: skip
    if reference.startswith("models:/"):
        if not MODEL_URI.match(reference):
            raise ValueError(f"{reference!r}: expected models:/<name>@<alias> or models:/<name>/<version>")
        return "registered", reference
    if reference.startswith("runs:/"):
        return "run", reference.removeprefix("runs:/").strip("/").split("/")[0]
    return "run", reference.removeprefix("run:")


def resolve_run(reference: str, client: MlflowClient) -> tuple[str, str | None]:
    """``(run id, registered version or None)`` of a model reference (see the module docstring)."""
    from mlflow.exceptions import MlflowException

    kind, value = parse_reference(reference)
    if kind == "run":
        return value, None
    match = MODEL_URI.match(value)
    try:
        if match["alias"]:
            version = client.get_model_version_by_alias(match["name"], match["alias"])
        else:
            version = client.get_model_version(match["name"], match["version"])
    except MlflowException as error:
        raise ModelNotFound(f"{reference}: no such registered model version in {client.tracking_uri}") from error
    if not version.run_id:
        raise ModelNotFound(f"{reference} (version {version.version}) was not logged from a run; nothing to load")
    return version.run_id, str(version.version)


def finished_run(reference: str, client: MlflowClient) -> tuple[Run, str | None]:
    """``(run, registered version or None)`` of a reference to a FINISHED run.

    Only a FINISHED run has a tested best checkpoint.
    """
    from mlflow.exceptions import MlflowException

    run_id, version = resolve_run(reference, client)
    try:
        run = client.get_run(run_id)
    except MlflowException as error:
        raise ModelNotFound(f"no run {run_id!r} in the tracking store {client.tracking_uri}") from error
    if run.info.status != "FINISHED":
        raise RunNotFinished(f"run {run_id} is {run.info.status}; only a finished run has a tested best checkpoint")
    return run, version


def existing_store_client(uri: str) -> MlflowClient:
    """A client on the store at ``uri``, refusing a local SQLite store that is not there: a command that reads a
    run must not leave an empty ``mlflow.db`` behind (a mistyped ``MLFLOW_TRACKING_URI``, a fresh clone).

    Raises:
        ModelNotFound: no database file at the store's path.
    """
    database = database_path(uri)
    if database is not None and not database.is_file():
        raise ModelNotFound(f"no MLflow store at {database} ({uri}): train a run first, or set MLFLOW_TRACKING_URI "
                            "to the store that holds it")  # fmt: skip
    return tracking_client(uri)
