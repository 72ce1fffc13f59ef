"""``make serve``: check that the model exists, then hand the process over to ``mlflow models serve``.

Started directly, ``mlflow models serve -m models:/cxrlt-task1@champion`` on a store without that model printed a
54-line traceback ending in ``Registered Model with name=cxrlt-task1 not found`` and created an empty
``mlruns/mlflow.db`` on the way. Here the store and the reference are checked first, reading only (a SQLite store
that is not there is reported, never created), and a missing one is one line naming the store and what to run;
only then is the process replaced by MLflow's server, which resolves the same reference the same way.

What the served model may read (docs/tuning-registry-submission.md, "Serving"): a request's ``image_b64`` always;
an ``image`` path only under the folder given as ``--image-root`` (``make serve IMAGE_ROOT=...``), which reaches the
model as :data:`IMAGE_ROOT_ENV`. Without it the server opens no file a request names.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from training.errors import UserError, user_errors
from training.tracking.store_lock import database_path
from training.tracking.uri import resolve_tracking_uri

#: The folder under which the served model opens ``image`` paths; unset: it opens none (read by apps.serving).
IMAGE_ROOT_ENV = "CXRLT_SERVE_IMAGE_ROOT"


class ModelMissing(UserError, LookupError):
    """The model to serve is not in the store (or the store is not there)."""


def check_model(reference: str, uri: str) -> None:
    """Resolve ``reference`` in the store at ``uri`` without writing anything.

    Raises:
        ModelMissing: no store file, no such registered model/alias/version, run or model folder.
    """
    database = database_path(uri)
    if database is not None and not database.is_file():
        raise ModelMissing(f"no MLflow store at {database} ({uri}), so no {reference} to serve: train and "
                           "`make register` first, or set MLFLOW_TRACKING_URI to the store that holds it")  # fmt: skip
    if not reference.startswith(("models:/", "runs:/")):
        if not Path(reference).exists():
            raise ModelMissing(f"{reference}: no such model folder")
        return
    from mlflow import MlflowClient  # imported here: a bad argument is reported before MLflow loads
    from mlflow.exceptions import MlflowException
    from mlflow.store.artifact.utils.models import get_model_name_and_version

    client = MlflowClient(uri)
    try:
        if reference.startswith("runs:/"):
            client.get_run(reference.removeprefix("runs:/").split("/")[0])
        else:
            name, version = get_model_name_and_version(client, reference)
            client.get_model_version(name, version)
    except MlflowException as error:
        cause = error.message.splitlines()[0]
        raise ModelMissing(f"{reference}: not in the store {uri} ({cause}); `make register TASK=<task>` registers "
                           "a champion, `make register RUN=<run id>` a given run") from None  # fmt: skip


def server_environment(image_root: Path | None) -> dict[str, str]:
    """The server's environment: this one, the venv first on ``PATH`` (MLflow starts its workers from there), and
    the image root when one is given (checked to be a folder, stored resolved)."""
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    env.pop(IMAGE_ROOT_ENV, None)  # only --image-root opens files to requests, never a variable left in a shell
    if image_root is not None:
        if not image_root.is_dir():
            raise UserError(f"--image-root {image_root}: no such folder")
        env[IMAGE_ROOT_ENV] = str(image_root.resolve())
    return env


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="models:/cxrlt-task1@champion")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=5000)
    parser.add_argument("--image-root", type=Path, default=None,
                        help="folder whose images requests may name by path (default: none, image_b64 only)")  # fmt: skip
    parser.add_argument("--debug", action="store_true", help="show the traceback of an input error")
    args = parser.parse_args(argv)
    uri = resolve_tracking_uri()
    with user_errors(debug=args.debug):
        env = server_environment(args.image_root)
        check_model(args.model, uri)
    env["MLFLOW_TRACKING_URI"] = uri
    mlflow = str(Path(sys.executable).with_name("mlflow"))
    command = [mlflow, "models", "serve", "-m", args.model, "--env-manager", "local", "-h", args.host,
               "-p", str(args.port)]  # fmt: skip
    os.execve(mlflow, command, env)


if __name__ == "__main__":
    main()
