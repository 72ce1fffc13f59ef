"""``model.weights``: local files of every wrapping initialise the backbone exactly, or fail with a clear message.

Every file is built here (no network): a timm checkpoint of an RGB ResNet, this project's own Lightning
checkpoint, a TorchXRayVision-format DenseNet-121 written with torchvision (checked against torchvision's own
forward pass as the reference), a file of another architecture, and a whole pickled model.
"""

from __future__ import annotations

import logging
import os
import subprocess

import pytest
import timm
import torch
import torch.nn.functional as F
import torchvision
from torch import nn

from tests.conftest import train_command
from training.models.backbone import PretrainedWeightsUnavailable, create_backbone
from training.models.module import MultiLabelClassifier
from training.models.weights import WeightsError, load_weights

LOSS = {"name": "bce", "_target_": "training.losses.bce.BCELoss"}


def _randomise_batchnorm(model: nn.Module) -> None:
    """Non-trivial running statistics, so that a mix-up of BatchNorm buffers shows in the outputs."""
    generator = torch.Generator().manual_seed(0)
    for module in model.modules():
        if isinstance(module, nn.BatchNorm2d):
            module.running_mean.copy_(torch.randn(module.num_features, generator=generator) * 0.1)
            module.running_var.copy_(torch.rand(module.num_features, generator=generator) + 0.5)
            module.weight.data.copy_(torch.rand(module.num_features, generator=generator) + 0.5)
            module.bias.data.copy_(torch.randn(module.num_features, generator=generator) * 0.1)


def _xrv_densenet() -> nn.Module:
    """A TorchXRayVision DenseNet-121 in all but the class: torchvision's, one input channel, 18 outputs and the
    ``op_threshs`` buffer (the published ``densenet121-res224-*`` files have exactly these keys)."""
    torch.manual_seed(0)
    model = torchvision.models.densenet121(weights=None, num_classes=18)
    model.features.conv0 = nn.Conv2d(1, 64, kernel_size=7, stride=2, padding=3, bias=False)
    model.register_buffer("op_threshs", torch.rand(18))
    _randomise_batchnorm(model)
    return model.eval()


def test_timm_checkpoint_of_an_rgb_model_loads_with_the_stem_summed_to_one_channel(tmp_path, caplog):
    torch.manual_seed(0)
    timm_model = timm.create_model("resnet18", num_classes=7, in_chans=3)
    state = timm_model.state_dict()
    path = tmp_path / "resnet18.pth.tar"
    torch.save({"epoch": 3, "arch": "resnet18", "state_dict": state, "optimizer": {}}, path)  # timm's train.py
    with caplog.at_level(logging.INFO, logger="training.models.weights"):
        backbone = create_backbone("resnet18", weights=path)
    loaded = backbone.state_dict()
    assert torch.equal(loaded["conv1.weight"], state["conv1.weight"].sum(dim=1, keepdim=True))
    for key, value in loaded.items():
        if key != "conv1.weight":
            assert torch.equal(value, state[key]), key
    assert "fc.weight" in state and "fc.weight" not in loaded  # the old head is dropped, ours is new
    assert f"loaded {len(loaded)} of {len(loaded)} backbone tensors" in caplog.text


def test_safetensors_and_prefixed_state_dicts_load_too(tmp_path):
    from safetensors.torch import save_file

    torch.manual_seed(1)
    source = create_backbone("resnet10t")
    save_file(source.state_dict(), tmp_path / "w.safetensors")
    torch.save({"model": {f"module.{k}": v for k, v in source.state_dict().items()}}, tmp_path / "ddp.pt")
    for name in ("w.safetensors", "ddp.pt"):
        backbone = create_backbone("resnet10t", weights=tmp_path / name)
        for key, value in backbone.state_dict().items():
            assert torch.equal(value, source.state_dict()[key]), (name, key)


def test_a_runs_lightning_checkpoint_initialises_another_run(tmp_path, caplog):
    """A run's ``best.ckpt`` (``state_dict`` with ``backbone.``/``head.`` keys, hyperparameters, loops)."""
    torch.manual_seed(2)
    model_cfg = {"backbone": "resnet10t", "pretrained": False, "lr": 1e-3, "weight_decay": 0.0}
    trained = MultiLabelClassifier(model_cfg, LOSS, ["Normal", "A", "B"])
    path = tmp_path / "best.ckpt"
    torch.save({"epoch": 0, "global_step": 10, "pytorch-lightning_version": "2.5.0", "state_dict": trained.state_dict(),
                "hyper_parameters": {"model_cfg": model_cfg, "loss_cfg": LOSS, "labels": ["Normal", "A", "B"]},
                "loops": {}, "callbacks": {}, "optimizer_states": [], "lr_schedulers": []}, path)  # fmt: skip
    for weights_format in ("auto", "lightning"):
        cfg = {**model_cfg, "weights": str(path), "weights_format": weights_format}
        # the new run may have other labels: only the backbone is taken
        other = MultiLabelClassifier(cfg, LOSS, ["Normal", "X", "Y", "Z"])
        for key, value in other.backbone.state_dict().items():
            assert torch.equal(value, trained.backbone.state_dict()[key]), key
    x = torch.randn(2, 1, 48, 48)
    assert torch.allclose(other.backbone.eval()(x), trained.backbone.eval()(x))


@pytest.mark.parametrize("old_names", [False, True], ids=["torchvision-names", "pre-0.3-torchvision-names"])
def test_torchxrayvision_densenet121_gives_torchvisions_features(tmp_path, old_names):
    """Reference check: timm's densenet121 loaded from the file computes what the file's own network computes
    (torchvision's ``features -> relu -> global average pool``, TorchXRayVision's ``features2``)."""
    reference = _xrv_densenet()
    state = reference.state_dict()
    assert "op_threshs" in state and state["features.conv0.weight"].shape[1] == 1
    if old_names:  # torchvision's densenet keys before 0.3: norm.1 for norm1, conv.2 for conv2
        state = {key.replace(".norm1.", ".norm.1.").replace(".conv2.", ".conv.2."): v for key, v in state.items()}
        assert any(".norm.1." in key for key in state)
    path = tmp_path / "xrv-densenet121.pt"
    torch.save(state, path)
    backbone = create_backbone("densenet121", weights=path, weights_format="torchxrayvision").eval()
    x = torch.randn(2, 1, 64, 64)
    with torch.no_grad():
        expected = F.adaptive_avg_pool2d(F.relu(reference.features(x)), 1).flatten(1)
        assert torch.allclose(backbone(x), expected, atol=1e-5, rtol=1e-4)


def test_whole_pickled_model_needs_the_trust_flag(tmp_path):
    path = tmp_path / "xrv-old.pt"
    reference = _xrv_densenet()
    torch.save(reference, path)  # the older TorchXRayVision releases: the whole model object
    with pytest.raises(WeightsError, match=r"weights_trust_pickle=true") as refused:
        create_backbone("densenet121", weights=path)
    assert str(path) in str(refused.value) and "runs code" in str(refused.value)
    backbone = create_backbone("densenet121", weights=path, weights_trust_pickle=True)
    assert torch.equal(backbone.state_dict()["features.norm5.running_var"], reference.features.norm5.running_var)


def test_file_of_another_architecture_fails_naming_the_file(tmp_path):
    path = tmp_path / "resnet18.pt"
    torch.save(create_backbone("resnet18").state_dict(), path)
    with pytest.raises(WeightsError) as wrong:
        create_backbone("resnet10t", weights=path)  # same key names, other shapes
    message = str(wrong.value)
    assert str(path) in message and "wrong shapes" in message and "model.backbone" in message
    model = create_backbone("regnetx_002")
    before = {key: value.clone() for key, value in model.state_dict().items()}
    with pytest.raises(WeightsError, match=r"resnet18\.pt does not fit backbone 'regnetx_002'.*tensors found"):
        load_weights(model, path)  # other names altogether
    assert all(torch.equal(value, before[key]) for key, value in model.state_dict().items())  # left untouched


def test_unreadable_or_missing_file_and_bad_format_are_user_errors(tmp_path):
    (tmp_path / "junk.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(WeightsError, match="junk.pt"):
        create_backbone("resnet10t", weights=tmp_path / "junk.pt")
    with pytest.raises(WeightsError, match="no such file"):
        create_backbone("resnet10t", weights=tmp_path / "absent.pt")
    torch.save(create_backbone("resnet10t").state_dict(), tmp_path / "plain.pt")
    with pytest.raises(WeightsError, match="weights_format=lightning"):
        create_backbone("resnet10t", weights=tmp_path / "plain.pt", weights_format="lightning")
    with pytest.raises(WeightsError, match="expected one of"):
        create_backbone("resnet10t", weights=tmp_path / "plain.pt", weights_format="xrv")
    with pytest.raises(WeightsError, match="keep one"):
        create_backbone("resnet10t", pretrained=True, weights=tmp_path / "plain.pt")


def test_hub_weights_offline_raise_pretrained_weights_unavailable(monkeypatch):
    import huggingface_hub.constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(PretrainedWeightsUnavailable, match="hf-hub:nobody-here/no-such-weights"):
        create_backbone("resnet10t", weights="hf-hub:nobody-here/no-such-weights")
    with pytest.raises(WeightsError, match="is for 'resnet18'"):
        create_backbone("resnet10t", weights="timm:resnet18.a1_in1k")


@pytest.mark.slow
def test_smoke_training_from_a_torchxrayvision_file(tmp_path):
    """``make train TASK=task1 ARGS="model=densenet121 model.weights=<file> debug=smoke"`` runs to the end."""
    path = tmp_path / "xrv-densenet121.pt"
    torch.save(_xrv_densenet().state_dict(), path)
    env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path}/mlflow.db", "PYTHONUNBUFFERED": "1"}
    done = subprocess.run(
        train_command(tmp_path, "task=task1", "debug=smoke", "model=densenet121", f"model.weights={path}",
                      f"data.source.root={tmp_path}/synthetic", "trainer.enable_progress_bar=false"),
        env=env, capture_output=True, text=True, timeout=1800,
    )  # fmt: skip
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-4000:]
    assert "model.weights: loaded 725 of 725 backbone tensors" in output
