"""Everything that produces a model: data, backbones, losses, samplers, the LightningModule, entry points."""

from omegaconf import OmegaConf


def _device_precision(accelerator: str = "auto") -> str:
    """``${device_precision:...}`` of configs/trainer/default.yaml, registered as early as the package is imported
    (Hydra composes, and ``--cfg job --resolve`` resolves, before anything else is imported); torch loads lazily."""
    from training.hardware import default_precision

    return default_precision(accelerator)


if not OmegaConf.has_resolver("device_precision"):
    OmegaConf.register_new_resolver("device_precision", _device_precision)
