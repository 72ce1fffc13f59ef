"""A finished run as a scorer of image files, and the MLflow pyfunc that carries it into the registry.

The registered model holds everything scoring needs (weights loaded with ``weights_only=True``, the training
code's decoding and evaluation transform, label names, validation thresholds), so ``mlflow models serve``
works without the run's config or data. Requests, the ``image_root`` rule and errors are in
docs/tuning-registry-submission.md, "Serving": a path is opened only under the configured image root, so a
model served beyond one's machine reads only the bytes it is sent; an unreadable request raises MLflow's
``INVALID_PARAMETER_VALUE`` so the server answers HTTP 400 with the cause rather than a generic error. The code
is the installed package's, never the store's (:mod:`apps.serve`), so code written into a shared store does not
run on the serving host. A zero-shot run is served with its seen *and* unseen classes; its submissions default
to the unseen columns, which is what CXR-LT Task 2 asks for.
"""

from __future__ import annotations

import base64
import binascii
import json
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import mlflow.pyfunc
import numpy as np
import pandas as pd
import torch
from mlflow import MlflowClient
from mlflow.exceptions import MlflowException
from mlflow.models import ModelSignature
from mlflow.protos.databricks_pb2 import INVALID_PARAMETER_VALUE
from mlflow.types.schema import ColSpec, Schema
from torch import nn

from evaluation.tta import TTAPredictor
from training.checkpoint_io import load_weights_only
from training.data.images import read_grayscale
from training.runs import FinishedModel, load_finished

#: File signatures -> suffix for bytes written to a temporary file, so the training decoder (which may pick a
#: reader by suffix, e.g. DICOM) sees the same kind of file it would on disk.
MAGIC_SUFFIXES: dict[bytes, str] = {b"\x89PNG": ".png", b"\xff\xd8\xff": ".jpg", b"II*\x00": ".tif", b"MM\x00*": ".tif"}
DICOM_MAGIC = (128, b"DICM")


#: Models-from-code: the registry stores this file, not a pickled object; ``make serve`` saves it afresh from here.
PYFUNC_CODE = Path(__file__).with_name("pyfunc_model.py")


class RequestError(ValueError):
    """A scoring request that cannot be read; the message names the row and the column."""


@dataclass
class Scorer:
    """A finished model (:mod:`training.runs`) as a scorer of decoded images, plain or through TTA.

    Every output label gets a column: a zero-shot run's seen classes, then its unseen ones scored by the transfer
    its checkpoint chose on validation.
    """

    finished: FinishedModel

    @classmethod
    def load(cls, reference: str, client: MlflowClient | None = None) -> Scorer:
        """A run id or ``models:/`` reference, loaded by :func:`training.runs.load_finished`."""
        return cls(load_finished(reference, client))

    @classmethod
    def from_spec(cls, spec: dict, state_dict: dict) -> Scorer:
        """Rebuild from the JSON spec and weights stored with a registered model (no tracking store needed)."""
        return cls(FinishedModel.from_spec(spec, state_dict))

    @property
    def model(self) -> nn.Module:
        return self.finished.scoring_network

    @property
    def network(self) -> nn.Module:
        """The trained module itself (weights and hparams as in the checkpoint), without the serving wrapper."""
        return self.finished.network

    @property
    def labels(self) -> list[str]:
        return self.finished.output_labels

    @property
    def image_size(self) -> int:
        return self.finished.image_size

    @property
    def resize(self) -> str:
        return self.finished.resize

    @property
    def thresholds(self) -> list[float] | None:
        return self.finished.thresholds

    @property
    def run_id(self) -> str | None:
        return self.finished.run_id

    @property
    def submission_labels(self) -> list[str]:
        """The columns a default submission holds: a zero-shot run's unseen classes (Task 2), else every label."""
        return list(self.finished.unseen or self.labels)

    def spec(self) -> dict:
        return self.finished.spec()

    def tensors(self, images: np.ndarray) -> torch.Tensor:
        """``(N, H, W)`` uint8 -> ``(N, 1, H, W)`` float through the evaluation transform used in training."""
        transform = self.finished.transform
        return torch.stack([transform(image=image)["image"] for image in images])

    def predict_images(self, images: np.ndarray, tta: TTAPredictor | None = None) -> np.ndarray:
        """``(N, C)`` probabilities for decoded ``(N, H, W)`` uint8 images (plain, or merged over TTA views)."""
        predictor = tta or TTAPredictor(["identity"])
        return predictor.predict(self.model, self.tensors(images))

    def predict_files(self, paths: Sequence[str | Path], tta: TTAPredictor | None = None) -> np.ndarray:
        """``(N, C)`` probabilities for image files, decoded exactly as in training."""
        return self.predict_images(np.stack([self.finished.decode(p) for p in paths]), tta)


# ------------------------------------------------------------------------------------------- request decoding


def _suffix(data: bytes) -> str:
    if data[DICOM_MAGIC[0] : DICOM_MAGIC[0] + 4] == DICOM_MAGIC[1]:
        return ".dcm"
    return next((suffix for magic, suffix in MAGIC_SUFFIXES.items() if data.startswith(magic)), ".img")


def decode_bytes(data: bytes, size: int, resize: str = "stretch") -> np.ndarray:
    """Image bytes -> ``(size, size)`` uint8 through the training decoder (via a temporary file)."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / f"image{_suffix(data)}"
        path.write_bytes(data)
        try:
            return read_grayscale(path, size, resize)
        except (OSError, ValueError) as error:  # the answer goes to a client: no path of this server in it
            raise ValueError(str(error).replace(str(path), "the image sent")) from None


def allowed_path(value, root: Path | None) -> Path:
    """The file a request's ``image`` names, resolved; only under ``root`` (relative paths are taken from it).

    Raises:
        ValueError: no root was configured, or the resolved path leaves it.
    """
    if root is None:
        raise ValueError("this server opens no file a request names; send the image's bytes as 'image_b64', or "
                         "start the server with an image root (make serve IMAGE_ROOT=<folder>)")  # fmt: skip
    root = Path(root).resolve()
    path = (root / str(value)).resolve()
    if not path.is_relative_to(root):
        raise ValueError(f"{value}: outside the server's image root")
    return path


def _from_path(value, size: int, resize: str = "stretch", root: Path | None = None) -> np.ndarray:
    path = allowed_path(value, root)
    try:
        return read_grayscale(path, size, resize)
    except (OSError, ValueError) as error:  # named as the client named it, not by this server's folders
        raise ValueError(str(error).replace(str(path), str(value))) from None


def _from_b64(value, size: int, resize: str = "stretch", root: Path | None = None) -> np.ndarray:
    data = value if isinstance(value, bytes | bytearray) else base64.b64decode(str(value))
    return decode_bytes(bytes(data), size, resize)


#: Request column -> how its cell becomes an image (``(cell, size, resize, image root)``). The first non-empty
#: column of a row is used.
REQUEST_COLUMNS: dict[str, Callable[..., np.ndarray]] = {"image": _from_path, "image_b64": _from_b64}


def decode_request(frame: pd.DataFrame, size: int, resize: str = "stretch", image_root: Path | None = None
                   ) -> np.ndarray:  # fmt: skip
    """``(N, size, size)`` uint8 images from a request frame (see module docstring for the columns).

    Args:
        image_root: the folder ``image`` paths must lie under; None: no path is opened (``image_b64`` only).

    Raises:
        RequestError: the message names the row and column (or the columns sent, when none is an image column).
    """
    columns = [c for c in REQUEST_COLUMNS if c in frame]
    if not columns:
        raise RequestError(f"request needs a column {' or '.join(repr(c) for c in REQUEST_COLUMNS)}; got "
                           f"{list(map(str, frame.columns))}")  # fmt: skip
    images = []
    for row, record in enumerate(frame[columns].to_dict("records")):
        column = next((c for c in columns if isinstance(record[c], str | bytes | bytearray) and len(record[c])), None)
        if column is None:
            raise RequestError(f"row {row}: no image; give {' or '.join(repr(c) for c in REQUEST_COLUMNS)}")
        try:
            images.append(REQUEST_COLUMNS[column](record[column], size, resize, image_root))
        except (OSError, ValueError, binascii.Error) as error:
            raise RequestError(f"row {row}, column {column!r}: {error}") from error
    return np.stack(images)


class CXRClassifierModel(mlflow.pyfunc.PythonModel):
    """The registered pyfunc: a request frame of images in, one probability column per label out."""

    def load_context(self, context) -> None:
        spec = json.loads(Path(context.artifacts["spec"]).read_text())
        state = load_weights_only(context.artifacts["weights"], "the registered model's weights")
        self.scorer = Scorer.from_spec(spec, state)
        config = getattr(context, "model_config", None) or {}
        root = config.get("image_root")
        self.image_root = Path(root) if root else None

    def predict(self, context, model_input: pd.DataFrame, params: dict | None = None) -> pd.DataFrame:
        """Probabilities ``(N, C)`` as a frame whose columns are the label names.

        Raises:
            MlflowException: ``INVALID_PARAMETER_VALUE`` (HTTP 400 from the server) with the request's problem.
        """
        try:
            images = decode_request(pd.DataFrame(model_input), self.scorer.image_size, self.scorer.resize,
                                    getattr(self, "image_root", None))  # fmt: skip
        except RequestError as error:
            raise MlflowException(str(error), error_code=INVALID_PARAMETER_VALUE) from error
        return pd.DataFrame(self.scorer.predict_images(images), columns=self.scorer.labels)


def signature(labels: Sequence[str]) -> ModelSignature:
    """One double per label comes back; the request's columns are the model's to check, not MLflow's.

    An input schema would make MLflow drop every column it does not name before the model sees the request, so a
    mistyped column was answered ``got []``; without one, :func:`decode_request` names the columns sent.
    """
    return ModelSignature(outputs=Schema([ColSpec("double", name) for name in labels]))


def example_request(size: int) -> pd.DataFrame:
    """A one-row request (a uniform grey PNG as base64): MLflow scores it when logging, proving the model loads."""
    import cv2

    ok, png = cv2.imencode(".png", np.full((size, size), 128, np.uint8))
    return pd.DataFrame({"image_b64": [base64.b64encode(png.tobytes()).decode("ascii")]})


def save_artifacts(scorer: Scorer, folder: Path) -> dict[str, str]:
    """Write the weights (``state_dict`` only, no optimiser state) and the JSON spec; returns pyfunc artifacts."""
    folder.mkdir(parents=True, exist_ok=True)
    torch.save(scorer.network.state_dict(), folder / "weights.pt")
    (folder / "spec.json").write_text(json.dumps(scorer.spec(), indent=1, default=str))
    return {"weights": str(folder / "weights.pt"), "spec": str(folder / "spec.json")}
