"""``make serve``: the registered model behind MLflow's scoring server, built from this project's code.

The store and the reference are checked first (:mod:`training.run_lookup`; a missing SQLite store is reported,
never created). The stored model is read as data only: ``mlflow models serve`` would run the
``pyfunc_model.py`` kept in the store, so anyone able to write to a shared store could run code on the serving
host. Only the stored weights and spec are taken; the pyfunc is saved afresh from the installed
``apps/pyfunc_model.py`` and handed to MLflow's scoring server, so requests and answers keep MLflow's format.
What the served model may read: docs/tuning-registry-submission.md, "Serving".
"""

from __future__ import annotations

import argparse
import json
import tempfile
from collections.abc import Sequence
from pathlib import Path

from training.errors import UserError, user_errors
from training.run_lookup import ModelNotFound, existing_store_client, finished_run
from training.tracking.uri import resolve_tracking_uri


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


def image_root_folder(image_root: Path | None) -> Path | None:
    """The folder request paths may lie under, resolved; None: the server opens no file a request names."""
    if image_root is not None and not image_root.is_dir():
        raise UserError(f"--image-root {image_root}: no such folder")
    return image_root.resolve() if image_root is not None else None


#: The stored files the served model is rebuilt from: pyfunc artifact name -> file in the stored model folder.
STORED_DATA = {"spec": "artifacts/spec.json", "weights": "artifacts/weights.pt"}


def served_pyfunc(reference: str, folder: Path, image_root: Path | None = None):
    """The model ``reference`` names as a pyfunc whose code is this installation's, its weights and spec the store's.

    Raises:
        UserError: the stored model lacks its weights or spec (not a model ``make register`` wrote).
    """
    import mlflow.pyfunc

    from apps.serving import PYFUNC_CODE, signature

    stored = Path(mlflow.artifacts.download_artifacts(artifact_uri=reference, dst_path=str(folder / "stored")))
    artifacts = {name: stored / file for name, file in STORED_DATA.items()}
    missing = [file for name, file in STORED_DATA.items() if not artifacts[name].is_file()]
    if missing:
        raise UserError(f"{reference}: the stored model has no {', '.join(missing)}; register the run again "
                        "(make register RUN=<run id>)")  # fmt: skip
    labels = json.loads(artifacts["spec"].read_text())["labels"]
    mlflow.pyfunc.save_model(str(folder / "served"), python_model=str(PYFUNC_CODE), pip_requirements=[],
                             artifacts={k: str(v) for k, v in artifacts.items()}, signature=signature(labels),
                             model_config={"image_root": ""})  # fmt: skip
    return mlflow.pyfunc.load_model(str(folder / "served"), model_config={"image_root": str(image_root or "")})


class BodyLimit:
    """ASGI middleware: a request whose body exceeds ``limit`` bytes gets 413 without being read any further."""

    def __init__(self, app, limit: int):
        self.app, self.limit = app, limit

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = dict(scope["headers"]).get(b"content-length", b"0")
        if not declared.isdigit() or int(declared) > self.limit:
            return await self._refuse(send)
        received = 0

        async def counted():
            nonlocal received
            message = await receive()
            received += len(message.get("body", b""))
            if received > self.limit:  # a body longer than it declared
                raise ValueError("request body longer than its Content-Length")
            return message

        return await self.app(scope, counted, send)

    async def _refuse(self, send) -> None:
        body = json.dumps({"error_code": "REQUEST_TOO_LARGE",
                           "message": f"request body over {self.limit // 2**20} MB; send fewer images per request"})  # fmt: skip
        await send({"type": "http.response.start", "status": 413,
                    "headers": [(b"content-type", b"application/json"), (b"connection", b"close")]})  # fmt: skip
        await send({"type": "http.response.body", "body": body.encode()})


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="models:/cxrlt-task1@champion")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=5000)
    parser.add_argument("--image-root", type=Path, default=None,
                        help="folder whose images requests may name by path (default: none, image_b64 only)")  # fmt: skip
    parser.add_argument("--max-request-mb", type=float, default=32.0,
                        help="largest request body accepted; larger ones get 413 (default 32 MB: ~20 PNGs at 1024 px)")  # fmt: skip
    parser.add_argument("--debug", action="store_true", help="show the traceback of an input error")
    args = parser.parse_args(argv)
    uri = resolve_tracking_uri()
    with user_errors(debug=args.debug), tempfile.TemporaryDirectory() as tmp:
        image_root = image_root_folder(args.image_root)
        check_model(args.model, uri)
        import mlflow
        import uvicorn
        from mlflow.pyfunc.scoring_server import init

        mlflow.set_tracking_uri(uri)
        app = BodyLimit(init(served_pyfunc(args.model, Path(tmp), image_root)), int(args.max_request_mb * 2**20))
        uvicorn.run(app, host=args.host, port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
