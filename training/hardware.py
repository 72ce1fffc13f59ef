"""Device-dependent training defaults, in one place: what a GPU needs and a CPU must not get.

The same config has to train on the two-core CPU machines and on a CUDA node without edits, so every setting
here is decided from the device the Trainer actually runs on, never from the config alone. Precision comes from
the ``device_precision`` OmegaConf resolver registered on import (an explicit ``trainer.precision`` wins; a
stored run's config is resolved, so a reload never needs it); channels-last and compile from :class:`GpuSpeedups`;
pinned memory and persistent workers from :func:`pin_memory` and :func:`persistent_workers`.
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

    Native only: ``torch.cuda.is_bf16_supported()`` also says yes where bfloat16 is emulated and slower than float32.
    bf16 rather than fp16: float32's exponent range, so no loss scaling and the long-tailed losses' tiny rare-class
    gradients do not underflow. Not on CPU: slower there, and it would change every CPU run's numbers.
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

    Applied to the evaluation loaders only; the training loader restarts its workers every epoch on purpose
    (:meth:`training.data.datamodule.CXRDataModule.train_dataloader`).
    """
    return num_workers > 0 and _setting(setting) in (AUTO, True)


class GpuSpeedups(L.Callback):
    """Channels-last weights and optional in-place ``torch.compile`` on CUDA, loader settings for the data module.

    Applied in ``setup``, before the strategy moves, wraps (DDP) and optimises the model, so every later step sees
    the final layout. Channels-last lets cuDNN use tensor-core kernels without transposes; converting the weights is
    enough. Skipped on CPU (no gain, and it would change CPU runs' numbers). ``compile`` is in place
    (``nn.Module.compile()``): ``torch.compile(module)`` would prefix ``state_dict`` keys with ``_orig_mod.`` and
    checkpoints would not load uncompiled. Only ``backbone(images)`` is compiled, and it is honoured on CPU when asked.
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
