"""The served pyfunc through MLflow's scoring server code, in process: a bad request is a 400 naming its cause.

``mlflow models serve`` answers each request with :func:`mlflow.pyfunc.scoring_server.invocations`; calling it on
the loaded model is that answer without a port (a raised ``MlflowException`` is what the endpoint serialises, with
its HTTP status).
"""

from __future__ import annotations

import base64
import json

import cv2
import mlflow.pyfunc
import numpy as np
import pytest
import torch
from mlflow.exceptions import MlflowException
from mlflow.pyfunc import scoring_server

from apps.serving import PYFUNC_CODE, Scorer, save_artifacts, signature
from training.models.factory import build_model
from training.runs import FinishedModel

LABELS = ["Mass", "Nodule"]


@pytest.fixture(scope="module")
def saved_model(tmp_path_factory):
    """A tiny network saved as the registry saves the champion (models-from-code, spec + weights, signature)."""
    tmp = tmp_path_factory.mktemp("pyfunc")
    torch.manual_seed(0)
    model_cfg = {"backbone": "resnet10t", "pretrained": False, "lr": 1e-3, "weight_decay": 0.0}
    network = build_model(model_cfg, {"_target_": "training.losses.bce.BCELoss"}, LABELS).eval()
    scorer = Scorer(FinishedModel(network, LABELS, image_size=32, resize="stretch", thresholds=None, run_id="r"))
    path = tmp / "model"
    mlflow.pyfunc.save_model(str(path), python_model=str(PYFUNC_CODE), artifacts=save_artifacts(scorer, tmp / "a"),
                             signature=signature(LABELS), pip_requirements=[], model_config={"image_root": ""})  # no requirement inference: seconds  # fmt: skip
    image = tmp / "images" / "x.png"
    image.parent.mkdir()
    cv2.imwrite(str(image), np.random.default_rng(0).integers(0, 255, (40, 40), dtype=np.uint8))
    return path, image


def _answer(model, frame: dict) -> tuple[int, str]:
    """``(HTTP status, body)`` of ``POST /invocations`` with ``{"dataframe_split": frame}``."""
    body = json.dumps({"dataframe_split": frame})
    try:
        response = scoring_server.invocations(body, "application/json", model, model.metadata.get_input_schema())
    except MlflowException as error:
        return error.get_http_status_code(), json.loads(error.serialize_as_json())["message"]
    return response.status, response.response


@pytest.fixture
def served(saved_model):
    path, image = saved_model
    return mlflow.pyfunc.load_model(str(path)), image


def test_bytes_are_scored(served):
    model, image = served
    status, body = _answer(model, {"columns": ["image_b64"], "data": [[base64.b64encode(image.read_bytes()).decode()]]})
    assert status == 200 and list(json.loads(body)["predictions"][0]) == LABELS


def test_a_wrong_column_is_named_as_sent(served):
    status, message = _answer(served[0], {"columns": ["img"], "data": [["x.png"]]})
    assert status == 400
    assert message.splitlines()[-1] == "Error: request needs a column 'image' or 'image_b64'; got ['img']"


def test_a_path_is_refused_without_an_image_root_with_the_reason(served):
    status, message = _answer(served[0], {"columns": ["image"], "data": [[str(served[1])]]})
    assert status == 400
    assert message.splitlines()[-1].startswith(
        "Error: row 0, column 'image': this server opens no file a request names"
    )


def test_a_missing_image_under_the_root_is_a_400_with_its_cause(saved_model):
    path, image = saved_model
    model = mlflow.pyfunc.load_model(
        str(path), model_config={"image_root": str(image.parent)}
    )  # make serve's IMAGE_ROOT
    status, body = _answer(model, {"columns": ["image"], "data": [["x.png"]]})
    assert status == 200 and list(json.loads(body)["predictions"][0]) == LABELS
    status, message = _answer(model, {"columns": ["image"], "data": [["x.png"], ["gone.png"]]})
    assert status == 400
    last = message.splitlines()[-1]
    assert last == "Error: row 1, column 'image': image file not found: gone.png"  # as sent: no server folder named
    status, message = _answer(model, {"columns": ["image"], "data": [["../../etc/passwd"]]})
    assert status == 400 and "outside the server's image root" in message.splitlines()[-1]
