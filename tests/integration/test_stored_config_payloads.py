"""A stored config or spec that names code through a project module never runs it, on every path that reads a run back.

The payloads are the two of the trust-boundary probe: ``training.runs.torch.load`` (``torch.load`` reached through an
import of ``training.runs``) unpickling a file that writes a marker, and ``training.checkpoint_io.os.system``. Each
read-back path is called as its command calls it, on a finished run made here without training (a composed config,
the weights of a freshly built network), with the payload where that path would build it: the loss (every path
that rebuilds the network) and the data source (evaluate, submit, register).
"""

from __future__ import annotations

import json
import pickle
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from mlflow import MlflowClient
from omegaconf import OmegaConf

from apps.benchmarks.framework.platform_models import PlatformRunEncoder
from apps.ensemble import member_labels
from apps.evaluate import evaluate_run
from apps.registry import ensure_full_evaluation
from apps.serving import CXRClassifierModel
from apps.submit import run_manifest
from tests.finished_runs import Payload, fabricate_finished_run
from training.allowed_targets import UnsafeConfig, allowed_targets
from training.runs import load_finished
from training.stages import ClassifierRetraining


def payloads(tmp: Path) -> dict[str, dict]:
    """Target name -> the node that would run it when built; each writes ``tmp/<name>.marker``."""
    pickled = tmp / "weights.pt"
    pickled.write_bytes(pickle.dumps(Payload(tmp / "torch.load.marker")))
    return {
        "training.runs.torch.load": {"_target_": "training.runs.torch.load", "f": str(pickled), "weights_only": False},
        "training.checkpoint_io.os.system": {"_target_": "training.checkpoint_io.os.system",
                                             "_args_": [f"touch {tmp / 'os.system.marker'}"]},
    }  # fmt: skip


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    return fabricate_finished_run(tmp_path_factory.mktemp("store"))


def tamper(client: MlflowClient, run_id: str, plain: dict, node: dict) -> None:
    """The run's ``config.yaml`` with ``node`` as its loss and its data source, as an attacker would edit it."""
    edited = json.loads(json.dumps(plain))
    edited["loss"] = edited["data"]["source"] = node
    client.log_text(run_id, OmegaConf.to_yaml(edited), "config.yaml")


def outcome(call) -> BaseException | None:
    """What ``call`` raised (None if nothing): the marker is checked first, whatever the path raised."""
    try:
        call()
    except Exception as error:  # noqa: BLE001 - the assertions below say which error was owed
        return error
    return None


READ_BACK_PATHS = {
    "make evaluate": lambda client, run, tmp: evaluate_run(run, OmegaConf.create({}), OmegaConf.create({}), client),
    "make submit": lambda client, run, tmp: run_manifest(client, run),
    "make register": lambda client, run, tmp: ensure_full_evaluation(client, run),
    "make crt": lambda client, run, tmp: ClassifierRetraining(run).prepare(None, client),
    "make benchmark / make card": lambda client, run, tmp: PlatformRunEncoder(run, [], client.tracking_uri),
    "make ensemble": lambda client, run, tmp: member_labels(client, run, "task1", str(tmp)),
}


@pytest.mark.parametrize("path", READ_BACK_PATHS)
@pytest.mark.parametrize("target", ["training.runs.torch.load", "training.checkpoint_io.os.system"])
def test_a_payload_in_a_stored_config_is_refused_by_name_and_never_runs(finished, tmp_path, path, target):
    client, run_id, plain = finished
    tamper(client, run_id, plain, payloads(tmp_path)[target])
    refusal = outcome(lambda: READ_BACK_PATHS[path](client, run_id, tmp_path))
    assert not list(tmp_path.glob("*.marker")), f"{path} ran {target}"
    assert isinstance(refusal, UnsafeConfig), refusal
    assert f"= '{target}' is not a class or function that this project's configs/ name" in str(refusal)


@pytest.mark.parametrize("target", ["training.runs.torch.load", "training.checkpoint_io.os.system"])
@pytest.mark.parametrize("part", ["loss_cfg", "model_cfg"])
def test_a_payload_in_a_registered_models_spec_is_refused_when_served(finished, tmp_path, target, part):
    """``make serve`` rebuilds from ``spec.json`` alone: its loss and model sections are as untrusted as a config."""
    client, run_id, plain = finished
    client.log_text(run_id, OmegaConf.to_yaml(plain), "config.yaml")
    model = load_finished(run_id, client)
    spec = model.spec()
    node = payloads(tmp_path)[target]
    if part == "loss_cfg":
        spec["loss_cfg"] = node
    else:
        spec["model_cfg"]["head"] = node
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    torch.save(model.network.state_dict(), tmp_path / "weights.pt.state")
    context = SimpleNamespace(
        artifacts={"spec": str(tmp_path / "spec.json"), "weights": str(tmp_path / "weights.pt.state")}
    )
    refusal = outcome(lambda: CXRClassifierModel().load_context(context))
    assert not list(tmp_path.glob("*.marker")), f"make serve ran {target}"
    assert isinstance(refusal, UnsafeConfig) and f"'{target}'" in str(refusal), refusal


def test_the_allow_list_is_what_the_configs_name_and_each_entry_is_defined_where_it_is_named():
    """An entry like ``training.runs.torch.load`` would be a re-export; every allowed name must be the object's own
    ``module.qualname``, so no allowed string reaches something merely imported by a project module."""
    import importlib

    allowed = allowed_targets()
    assert {"training.losses.asl.AsymmetricLoss", "albumentations.Affine", "optuna.pruners.MedianPruner"} <= allowed
    assert not {"training.runs.torch.load", "training.checkpoint_io.os.system"} & allowed
    for name in sorted(allowed):
        module_name, _, attribute = name.rpartition(".")
        found = getattr(importlib.import_module(module_name), attribute)
        home = f"{found.__module__}.{found.__qualname__}"
        assert home == name or (name.split(".")[0] in ("albumentations", "optuna") and home.endswith(attribute)), (
            f"{name} is {home}"
        )
