"""Finished runs as models (training.runs), the model factory and the one tracking-URI resolution."""

from __future__ import annotations

import pytest
import torch

from training.allowed_targets import UnsafeConfig, check_targets
from training.models.factory import UnsafeTarget, build_model
from training.runs import FinishedModel, ModelNotFound, load_finished, parse_reference
from training.tracking.health import TrackingUnavailable
from training.tracking.uri import DEFAULT_TRACKING_URI, resolve_tracking_uri, tracking_client

MODEL_CFG = {"backbone": "resnet18", "pretrained": False, "lr": 1e-3, "weight_decay": 0.0}
LOSS_CFG = {"_target_": "training.losses.bce.BCELoss"}


@pytest.mark.parametrize(
    ("reference", "expected"),
    [
        ("0123abcd", ("run", "0123abcd")),
        ("run:0123abcd", ("run", "0123abcd")),
        ("runs:/0123abcd/model", ("run", "0123abcd")),
        ("models:/cxrlt-task1@champion", ("registered", "models:/cxrlt-task1@champion")),
        ("models:/cxrlt-task1/3", ("registered", "models:/cxrlt-task1/3")),
    ],
)
def test_every_reference_form_is_understood(reference, expected):
    assert parse_reference(reference) == expected


def test_a_malformed_registry_reference_is_refused_by_name():
    with pytest.raises(ValueError, match="models:/cxrlt-task1@"):
        parse_reference("models:/cxrlt-task1@")


@pytest.mark.parametrize(
    "target", ["torch.load", "shutil.copy", "pathlib.Path.write_text", "os.system", "builtins.eval"]
)
def test_a_stored_config_naming_code_outside_the_project_is_refused(target):
    stored = {"data": {"source": {"_target_": "training.data.sources.SyntheticSource"}},
              "augment": {"train": [{"_target_": "albumentations.Affine"}, {"_target_": target, "f": "x"}]}}  # fmt: skip
    with pytest.raises(UnsafeConfig, match=rf"augment\.train\[1\]\._target_ = '{target}'"):
        check_targets(stored, "run r config.yaml")


def test_the_classes_our_configs_name_are_accepted_and_other_project_names_are_not():
    stored = {"loss": {"_target_": "training.losses.asl.AsymmetricLoss"},
              "evaluation": {"postprocess": [{"_target_": "evaluation.postprocess.NormalGating"}]},
              "augment": {"train": [{"_target_": "albumentations.RandomGamma"}]}}  # fmt: skip
    check_targets(stored, "config")  # nothing raised, and the refusal above shows the check is live
    # A project module's own name is not enough: the configs never name this function, so it is not built.
    with pytest.raises(UnsafeConfig, match="'training.runs.load_finished' is not a class or function"):
        check_targets({"data": {"source": {"_target_": "training.runs.load_finished"}}}, "config")


def test_the_factory_builds_adapters_of_this_project_only():
    with pytest.raises(UnsafeConfig, match="adapter._target_ = 'os.system' is not"):
        build_model(MODEL_CFG, LOSS_CFG, ["Mass"], adapter_cfg={"_target_": "os.system"})
    with pytest.raises(UnsafeTarget, match="not a MultiLabelClassifier"):
        build_model(MODEL_CFG, LOSS_CFG, ["Mass"], adapter_cfg={"_target_": "training.stages.FromScratch"})
    plain = build_model(MODEL_CFG, LOSS_CFG, ["Mass", "Nodule"], adapter_cfg={"name": "none"})
    assert type(plain).__name__ == "MultiLabelClassifier" and plain.head.out_features == 2


def test_a_plain_model_scores_its_labels_and_carries_no_adapter():
    network = build_model(MODEL_CFG, LOSS_CFG, ["Mass", "Nodule"]).eval()
    finished = FinishedModel(network, ["Mass", "Nodule"], image_size=32)
    assert finished.output_labels == ["Mass", "Nodule"] and finished.scoring_network is network
    assert "adapter_cfg" not in finished.spec() and finished.spec()["model_cfg"]["backbone"] == "resnet18"
    with torch.no_grad():
        assert finished.scoring_network(torch.zeros(1, 1, 32, 32)).shape == (1, 2)


def test_tracking_uri_precedence(monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    assert resolve_tracking_uri() == DEFAULT_TRACKING_URI == "sqlite:///mlruns/mlflow.db"
    assert resolve_tracking_uri("sqlite:///other.db") == "sqlite:///other.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://team:5000")
    assert resolve_tracking_uri("sqlite:///other.db") == "http://team:5000"
    with pytest.raises(TrackingUnavailable, match=r"^tracking server http://team:5000 is unreachable"):
        tracking_client()  # the variable's server is asked first, and does not answer: one line, no retries


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("store")
    client = tracking_client(f"sqlite:///{tmp}/mlflow.db")
    experiment = client.create_experiment("task1", artifact_location=(tmp / "artifacts").as_uri())
    return client, experiment


def test_unknown_runs_and_versions_are_named(store):
    client, _ = store
    with pytest.raises(ModelNotFound, match="no run 'deadbeef'"):
        load_finished("deadbeef", client)
    with pytest.raises(ModelNotFound, match="models:/nothing@champion: no such registered model version"):
        load_finished("models:/nothing@champion", client)


def test_an_unfinished_run_or_one_without_a_checkpoint_is_refused(store):
    client, experiment = store
    running = client.create_run(experiment).info.run_id
    with pytest.raises(ValueError, match=f"run {running} is RUNNING"):
        load_finished(running, client)
    client.set_terminated(running, "FINISHED")
    with pytest.raises(ModelNotFound, match="has no config.yaml / checkpoints/best.ckpt"):
        load_finished(f"runs:/{running}/model", client)


def test_a_run_whose_config_was_tampered_with_is_refused_before_building(store):
    client, experiment = store
    run = client.create_run(experiment).info.run_id
    client.log_text(run, "data:\n  source:\n    _target_: shutil.copy\n    src: a\n    dst: b\n", "config.yaml")
    client.set_terminated(run, "FINISHED")
    with pytest.raises(UnsafeConfig, match="data.source._target_ = 'shutil.copy'"):
        load_finished(run, client)
