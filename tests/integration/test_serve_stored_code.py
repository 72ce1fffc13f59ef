"""``make serve`` on a shared store: a stored ``pyfunc_model.py`` someone edited is never run, an oversize request
is refused at once with 413, and the server goes on answering."""

import base64
import http.client
import json
import subprocess
from pathlib import Path

import cv2
import mlflow
import numpy as np
import pytest
import torch

from apps.serving import PYFUNC_CODE, Scorer, save_artifacts, signature
from tests.conftest import PROJECT_ROOT, free_port, stop_process_group, wait_for_http
from training.models.factory import build_model
from training.runs import FinishedModel

pytestmark = pytest.mark.e2e  # serves through make: make test-e2e

LABELS = ["Mass", "Nodule"]


def _register_tiny_champion(uri: str, folder: Path, monkeypatch) -> None:
    """A finished run holding a tiny network, registered as make register does (models-from-code pyfunc)."""
    torch.manual_seed(0)
    model_cfg = {"backbone": "resnet10t", "pretrained": False, "lr": 1e-3, "weight_decay": 0.0}
    network = build_model(model_cfg, {"_target_": "training.losses.bce.BCELoss"}, LABELS).eval()
    scorer = Scorer(FinishedModel(network, LABELS, image_size=32, resize="stretch", thresholds=None, run_id="r"))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)  # not set_tracking_uri: a global that outlives the test
    experiment = mlflow.create_experiment("task1", artifact_location=(folder / "artifacts").as_uri())
    with mlflow.start_run(experiment_id=experiment):
        mlflow.pyfunc.log_model(name="model", python_model=str(PYFUNC_CODE), pip_requirements=[],
                                artifacts=save_artifacts(scorer, folder / "weights"), signature=signature(LABELS),
                                registered_model_name="cxrlt-task1")  # fmt: skip
    mlflow.MlflowClient(uri).set_registered_model_alias("cxrlt-task1", "champion", "1")


def _post(port: int, body: bytes, declared: int | None = None) -> tuple[int, bytes]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    connection.putrequest("POST", "/invocations")
    connection.putheader("Content-Type", "application/json")
    connection.putheader("Content-Length", str(len(body) if declared is None else declared))
    connection.endheaders(body)
    response = connection.getresponse()
    answer = (response.status, response.read())
    connection.close()
    return answer


def _request(image: np.ndarray) -> bytes:
    png = base64.b64encode(cv2.imencode(".png", image)[1].tobytes()).decode()
    return json.dumps({"dataframe_split": {"columns": ["image_b64"], "data": [[png]]}}).encode()


def test_make_serve_runs_no_stored_code_refuses_an_oversize_request_and_keeps_answering(tmp_path, run_env, monkeypatch):
    _register_tiny_champion(run_env["MLFLOW_TRACKING_URI"], tmp_path, monkeypatch)
    (stored,) = (tmp_path / "artifacts").rglob("pyfunc_model.py")  # the registered model's code, as stored
    marker = tmp_path / "stored_code_ran"
    stored.write_text(f"import pathlib; pathlib.Path({str(marker)!r}).write_text('ran')\n" + stored.read_text())

    port = free_port()
    server = subprocess.Popen(["make", "--no-print-directory", "-C", str(PROJECT_ROOT), "serve", "TASK=task1",
                               f"PORT={port}"], env=run_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              start_new_session=True)  # fmt: skip
    try:
        wait_for_http(f"http://127.0.0.1:{port}/ping", server, timeout=300, what="make serve")
        image = np.random.default_rng(0).integers(0, 255, (40, 40), dtype=np.uint8)
        status, body = _post(port, _request(image))
        assert status == 200, body
        first = json.loads(body)["predictions"][0]
        status, body = _post(port, b"{", declared=40 * 2**20)  # declared over the 32 MB default; never sent
        assert status == 413 and b"request body over 32 MB" in body
        status, body = _post(port, _request(image))
        assert status == 200 and json.loads(body)["predictions"][0] == first and list(first) == LABELS
    finally:
        stop_process_group(server)
    assert not marker.exists()
