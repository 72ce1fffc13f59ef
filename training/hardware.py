"""Device-dependent training defaults, in one place: what a GPU needs and a CPU must not get.

The same config has to train on the two-core CPU machines and on a CUDA node without edits, so every setting
here is decided from the device the Trainer actually runs on, never from the config alone:

* **precision**: ``configs/trainer/default.yaml`` reads ``${device_precision:${trainer.accelerator}}``, which
  this module registers as an OmegaConf resolver on import: ``bf16-mixed`` where the Trainer will run on a CUDA
  device with native bfloat16 (compute capability 8.0 and up), ``32-true`` everywhere else. An explicit
  ``trainer.precision=...`` replaces the interpolation and wins. The stored ``config.yaml`` of a run is
  resolved, so a reloaded run never needs the resolver.
* **channels-last** and **torch.compile**: :class:`GpuSpeedups`, the callback ``configs/gpu/default.yaml``
  adds under ``callbacks.gpu``.
* **pinned memory** and **persistent loader workers**: :func:`pin_memory` and :func:`persistent_workers`,
  which the data module's loaders ask (the callback hands them the configured settings).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

import lightning.pytorch as L
import torch
from omegaconf import OmegaConf

log = logging.getLogger(__name__)

PRECISION_RESOLVER = "device_precision"
#: Lightning accelerator names that select a CUDA device when one is present.
CUDA_ACCELERATORS = ("auto", "gpu", "cuda")
AUTO = "auto"


def cuda_selected(accelerator: str | None = AUTO) -> bool:
    """Whether a Trainer with this ``accelerator`` would run on CUDA here (``auto`` prefers CUDA, as Lightning)."""
    return str(accelerator or AUTO).lower() in CUDA_ACCELERATORS and torch.cuda.is_available()


def default_precision(accelerator: str | None = AUTO) -> str:
    """``bf16-mixed`` on a CUDA device with native bfloat16, else ``32-true``.

    Native only: ``torch.cuda.is_bf16_supported()`` says yes on older GPUs too, where bfloat16 is emulated and
    slower than float32. bf16 rather than fp16 because it needs no loss scaling: its exponent range is
    float32's, so the long-tailed losses' tiny gradients on rare classes do not underflow. On CPU, autocast to
    bf16 is slower than float32 on the machines this platform uses, and it would change the numbers of every
    CPU run.
    """
    if cuda_selected(accelerator) and torch.cuda.is_bf16_supported(including_emulation=False):
        return "bf16-mixed"
    return "32-true"


def register_resolvers() -> None:
    """Make ``${device_precision:...}`` resolvable; idempotent, so every importer may call it."""
    if not OmegaConf.has_resolver(PRECISION_RESOLVER):
        OmegaConf.register_new_resolver(PRECISION_RESOLVER, default_precision)


register_resolvers()


def on_cuda(trainer: L.Trainer | None) -> bool:
    """Whether ``trainer`` runs on a CUDA device; False without a trainer (evaluation, tests)."""
    return trainer is not None and trainer.strategy.root_device.type == "cuda"


def _setting(value) -> str | bool:
    """``auto`` or a bool, from YAML (``true``/``false``/``auto``) or a command-line string."""
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text == AUTO:
        return AUTO
    if text in ("true", "1", "yes"):
        return True
    if text in ("false", "0", "no"):
        return False
    raise ValueError(f"expected true, false or auto, got {value!r}")


def pin_memory(setting="auto", cuda: bool = False) -> bool:
    """Page-locked batches let the host-to-GPU copy run asynchronously; on CPU they only cost locked memory.

    ``auto`` pins exactly when the batches go to a CUDA device; ``true`` is still refused without one, since
    PyTorch would pin for nothing (and warns).
    """
    value = _setting(setting)
    return cuda and value in (AUTO, True)


def persistent_workers(setting="auto", num_workers: int = 0) -> bool:
    """Keep loader workers alive between passes, which only exists with workers (PyTorch refuses it without).

    ``auto`` and ``true`` mean the same: keep them whenever there are any. The data module applies this to the
    evaluation loaders only; the training loader restarts its workers every epoch on purpose (see
    :meth:`training.data.datamodule.CXRDataModule.train_dataloader`).
    """
    return num_workers > 0 and _setting(setting) in (AUTO, True)


class GpuSpeedups(L.Callback):
    """Channels-last weights and optional in-place ``torch.compile`` on CUDA, loader settings for the data module.

    Applied in ``setup``, before the strategy moves the model to the device, wraps it (DDP) and builds the
    optimiser, so every later step, the DDP buckets and the optimiser state see the final layout.

    Channels-last (NHWC) lets cuDNN use the tensor-core convolution kernels without transposing every
    activation; a convolution with channels-last weights produces channels-last output, so converting the
    weights is enough. On CPU it is skipped: it gains nothing there and would change the numbers of CPU runs.

    ``compile`` uses ``nn.Module.compile()`` on the backbone, in place: ``torch.compile(module)`` would return a
    wrapper whose ``state_dict`` keys start with ``_orig_mod.``, and checkpoints would then not load into an
    uncompiled model (evaluation, serving). Only calls of ``backbone(images)`` are compiled; a head that reads
    the feature map (``forward_features``) runs that part uncompiled. Compilation is honoured on CPU too when
    asked, since the user chose it explicitly.

    Args:
        channels_last: convert the model's 4-D weights to channels-last on CUDA.
        compile: compile the backbone in place.
        compile_options: keyword arguments of ``torch.compile`` (``mode``, ``backend``, ``dynamic``, ...).
        pin_memory: ``auto`` (on CUDA), ``true`` or ``false``; see :func:`pin_memory`.
        persistent_workers: ``auto``/``true`` or ``false``; see :func:`persistent_workers`.
    """

    def __init__(
        self,
        channels_last: bool = True,
        compile: bool = False,
        compile_options: Mapping | None = None,
        pin_memory="auto",
        persistent_workers="auto",
    ):
        self.channels_last = channels_last
        self.compile = compile
        self.compile_options = dict(compile_options or {})
        self.pin_memory = _setting(pin_memory)
        self.persistent_workers = _setting(persistent_workers)

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        datamodule = getattr(trainer, "datamodule", None)
        if datamodule is not None and hasattr(datamodule, "loader_settings"):
            datamodule.loader_settings = {"pin_memory": self.pin_memory, "persistent_workers": self.persistent_workers}
        if stage != "fit":
            return
        apply_speedups(pl_module, on_cuda(trainer), self.channels_last, self.compile, self.compile_options)


def apply_speedups(
    model: torch.nn.Module, cuda: bool, channels_last: bool = True, compile: bool = False, compile_options=None
) -> list[str]:
    """Apply the speed-ups that fit the device to ``model`` in place; returns what was applied (for the log)."""
    applied = []
    if channels_last and cuda:
        model.to(memory_format=torch.channels_last)
        applied.append("channels-last")
    if compile:
        target = getattr(model, "backbone", model)
        target.compile(**dict(compile_options or {}))
        applied.append(f"torch.compile({type(target).__name__})")
    if applied:
        log.info("GPU speed-ups: %s", ", ".join(applied))
    return applied
