"""``make serve``: check that the model exists, then hand the process over to ``mlflow models serve``.

Started directly, ``mlflow models serve -m models:/cxrlt-task1@champion`` on a store without that model printed a
54-line traceback ending in ``Registered Model with name=cxrlt-task1 not found`` and created an empty
``mlruns/mlflow.db`` on the way. Here the store and the reference are checked first (:mod:`training.run_lookup`, as
for every command that takes a model; a SQLite store that is not there is reported, never created), and a missing
one is one line naming the store and what to run; only then is the process replaced by MLflow's server.

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
from training.run_lookup import ModelNotFound, existing_store_client, finished_run
from training.tracking.uri import resolve_tracking_uri

#: The folder under which the served model opens ``image`` paths; unset: it opens none (read by apps.serving).
IMAGE_ROOT_ENV = "CXRLT_SERVE_IMAGE_ROOT"


def check_model(reference: str, uri: str) -> None:
    """Resolve ``reference`` to a finished run in the store at ``uri``, as every command that takes a model does
    (:mod:`training.run_lookup`), without creating a store that is not there.

    Raises:
        ModelNotFound: no store file, or no such registered model, alias, version or run (with what to run).
        RunNotFinished: the run behind it is not FINISHED.
    """
    try:
        finished_run(reference, existing_store_client(uri))
    except ModelNotFound as error:
        raise ModelNotFound(f"{error}; `make register TASK=<task>` registers a champion to serve") from None


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
