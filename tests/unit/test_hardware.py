"""Device-dependent defaults (training/hardware.py, configs/gpu, configs/trainer/default.yaml).

A CPU run must come out exactly as before the GPU defaults existed (float32, default layout, unpinned loaders);
the GPU-only assertions are marked ``gpu`` and run with ``pytest -m gpu`` on a CUDA machine.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from hydra import compose, initialize_config_dir

from training import hardware
from training.data.datamodule import CXRDataModule
from training.data.sources import ManifestSource
from training.hardware import GpuSpeedups, apply_speedups, default_precision, persistent_workers, pin_memory
from training.pipeline import config_callbacks

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
CUDA = torch.cuda.is_available()


def train_config(*overrides: str):
    with initialize_config_dir(str(CONFIGS), version_base="1.3"):
        return compose("train", overrides=list(overrides))


def small_net() -> torch.nn.Module:
    net = torch.nn.Module()
    # The second convolution has several input channels: a one-channel weight is channels-last and contiguous at once.
    layers = [torch.nn.Conv2d(1, 4, 3), torch.nn.ReLU(), torch.nn.Conv2d(4, 4, 3), torch.nn.AdaptiveAvgPool2d(1)]
    net.backbone = torch.nn.Sequential(*layers)
    net.head = torch.nn.Linear(4, 3)
    return net


def trainer_on(device: str):
    return SimpleNamespace(strategy=SimpleNamespace(root_device=torch.device(device)), datamodule=None)


@pytest.fixture
def no_cuda(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


def test_precision_resolves_to_full_float32_without_cuda(no_cuda):
    assert train_config().trainer.precision == "32-true"
    assert train_config("trainer=ddp").trainer.precision == "32-true"


def test_precision_is_bf16_mixed_only_on_a_cuda_device_with_native_bf16(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    native = {"value": True}
    monkeypatch.setattr(
        torch.cuda, "is_bf16_supported", lambda including_emulation=True: native["value"] or including_emulation
    )
    assert train_config().trainer.precision == "bf16-mixed"
    assert train_config("trainer.accelerator=cpu").trainer.precision == "32-true"  # a GPU present but not used
    native["value"] = False  # a pre-Ampere GPU: bf16 only emulated, slower than float32
    assert train_config().trainer.precision == "32-true"


def test_an_explicit_precision_wins(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: True)
    assert train_config("trainer.precision=32-true").trainer.precision == "32-true"
    assert train_config("trainer.precision=16-mixed").trainer.precision == "16-mixed"


def test_the_resolver_is_registered_once_and_stays():
    hardware.register_resolvers()
    hardware.register_resolvers()  # a second importer must not raise "resolver already registered"
    assert default_precision("cpu") == "32-true"


def test_pinned_memory_only_when_batches_go_to_cuda():
    assert pin_memory("auto", cuda=False) is False
    assert pin_memory(True, cuda=False) is False  # pinning for a CPU step only costs locked pages
    assert pin_memory("auto", cuda=True) is True
    assert pin_memory("false", cuda=True) is False


def test_persistent_workers_only_with_workers():
    assert persistent_workers("auto", 0) is False
    assert persistent_workers(True, 0) is False  # PyTorch raises for persistent workers without workers
    assert persistent_workers("auto", 2) is True
    assert persistent_workers(False, 2) is False
    with pytest.raises(ValueError, match="true, false or auto"):
        persistent_workers("sometimes", 2)


def test_loaders_on_cpu_are_unpinned_and_train_workers_restart(make_manifest, task1_labels):
    module = CXRDataModule(ManifestSource(make_manifest(n=18)), task1_labels, image_size=32, batch_size=4,
                           num_workers=1, cache=False, in_process_pixels=0)  # fmt: skip
    module.prepare_data()
    module.setup("fit")
    train, val = module.train_dataloader(), module.val_dataloader()
    assert train.pin_memory is False and val.pin_memory is False
    assert train.persistent_workers is False  # per-epoch workers keep resumed augmentation exact
    assert val.persistent_workers is True
    module.loader_settings = {"pin_memory": "auto", "persistent_workers": False}
    assert module.val_dataloader().persistent_workers is False


def test_the_callback_hands_its_loader_settings_to_the_data_module(make_manifest, task1_labels):
    module = CXRDataModule(ManifestSource(make_manifest(n=18)), task1_labels, image_size=32, batch_size=4)
    trainer = trainer_on("cpu")
    trainer.datamodule = module
    GpuSpeedups(pin_memory="false", persistent_workers="false").setup(trainer, small_net(), "validate")
    assert module.loader_settings == {"pin_memory": False, "persistent_workers": False}


def test_channels_last_is_a_no_op_on_cpu():
    net = small_net()
    before = {key: value.clone() for key, value in net.state_dict().items()}
    GpuSpeedups(channels_last=True).setup(trainer_on("cpu"), net, "fit")
    weight = net.backbone[2].weight
    assert weight.is_contiguous() and not weight.is_contiguous(memory_format=torch.channels_last)
    assert all(torch.equal(before[key], value) for key, value in net.state_dict().items())


def test_compile_in_place_keeps_the_checkpoint_keys():
    net = small_net()
    keys = list(net.state_dict())
    applied = apply_speedups(net, cuda=False, compile=True, compile_options={"backend": "eager"})
    assert applied == ["torch.compile(Sequential)"]
    assert list(net.state_dict()) == keys  # no `_orig_mod.` prefix: the checkpoint loads into a plain model
    fresh = small_net()
    fresh.load_state_dict(net.state_dict())
    images = torch.randn(2, 1, 8, 8)
    assert torch.allclose(net.head(net.backbone(images).flatten(1)), fresh.head(fresh.backbone(images).flatten(1)))


def test_the_default_config_adds_the_callback_and_gpu_off_turns_it_all_off():
    (callback,) = [c for c in config_callbacks(train_config()) if isinstance(c, GpuSpeedups)]
    assert callback.channels_last is True and callback.compile is False and callback.pin_memory == "auto"
    (compiled,) = [c for c in config_callbacks(train_config("gpu.compile=true")) if isinstance(c, GpuSpeedups)]
    assert compiled.compile is True
    (off,) = [c for c in config_callbacks(train_config("gpu=off")) if isinstance(c, GpuSpeedups)]
    assert (off.channels_last, off.compile, off.pin_memory) == (False, False, False)
    assert off.persistent_workers == "auto"  # the evaluation loaders keep their workers, as before


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a CUDA device")
def test_on_cuda_bf16_channels_last_and_pinned_batches(make_manifest, task1_labels):
    native = torch.cuda.is_bf16_supported(including_emulation=False)
    assert train_config().trainer.precision == ("bf16-mixed" if native else "32-true")
    net = small_net()
    GpuSpeedups().setup(trainer_on("cuda"), net, "fit")
    assert net.backbone[2].weight.is_contiguous(memory_format=torch.channels_last)
    module = CXRDataModule(ManifestSource(make_manifest(n=18)), task1_labels, image_size=32, batch_size=4)
    module.prepare_data()
    module.setup("fit")
    module.trainer = SimpleNamespace(strategy=SimpleNamespace(root_device=torch.device("cuda")), world_size=1,
                                     global_rank=0)  # fmt: skip
    assert module.train_dataloader().pin_memory is True
    net.cuda()
    with torch.autocast("cuda", dtype=torch.bfloat16):
        out = net.backbone(torch.randn(2, 1, 16, 16, device="cuda").contiguous(memory_format=torch.channels_last))
    assert out.dtype == torch.bfloat16
