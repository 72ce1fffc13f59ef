"""The one place a network is built from its description, for training and for loading a finished run alike.

Loading a run and the registered pyfunc build from the same plain dicts training built from, so the network that
is served is the network that was trained. The class is ``MultiLabelClassifier``, an adapter's ``_target_`` or
``model.module``. These configs may come from a stored run, which anyone with write access to the tracking
server can edit, so only classes the project's own configs name are imported (:mod:`training.allowed_targets`),
and only a ``MultiLabelClassifier`` among them is built (docs/architecture.md, "Finished runs").
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from hydra.utils import get_class
from omegaconf import DictConfig, OmegaConf

from training.allowed_targets import UnsafeConfig, check_target
from training.models.module import MultiLabelClassifier


class UnsafeTarget(UnsafeConfig):
    """A config names an allowed class that is not a network (an adapter or ``model.module`` must be one)."""


def adapter_class(adapter_cfg: Mapping) -> type[MultiLabelClassifier]:
    """The adapter's class, refusing anything that is not a ``MultiLabelClassifier`` of this project."""
    return checked_class(str(adapter_cfg["_target_"]), "adapter._target_")


def checked_class(target: str, where: str) -> type[MultiLabelClassifier]:
    """The class ``target`` names, refusing anything that is not a ``MultiLabelClassifier`` of this project."""
    check_target(target, where, "model config")
    cls = get_class(target)
    if not (isinstance(cls, type) and issubclass(cls, MultiLabelClassifier)):
        raise UnsafeTarget(f"{where} {target!r} is not a MultiLabelClassifier")
    return cls


def build_model(
    model_cfg: Mapping,
    loss_cfg: Mapping,
    labels: Sequence[str],
    adapter_cfg: Mapping | None = None,
    unseen: Sequence[str] = (),
) -> MultiLabelClassifier:
    """The adapter module when ``adapter_cfg`` names one (``adapter=none`` does not), else ``model.module``'s class
    (the plain classifier by default)."""
    args = (dict(model_cfg), dict(loss_cfg), list(labels))
    if not adapter_cfg or not adapter_cfg.get("_target_"):
        module = model_cfg.get("module")
        return (checked_class(str(module), "model.module") if module else MultiLabelClassifier)(*args)
    return adapter_class(adapter_cfg)(*args, adapter_cfg=dict(adapter_cfg), unseen=list(unseen or []))


def model_from_config(cfg: DictConfig) -> MultiLabelClassifier:
    """:func:`build_model` from a resolved ``train`` config (a fresh run, or one read back from MLflow)."""
    adapter = cfg.get("adapter")
    return build_model(
        OmegaConf.to_container(cfg.model, resolve=True),
        OmegaConf.to_container(cfg.loss, resolve=True),
        list(cfg.task.labels),
        OmegaConf.to_container(adapter, resolve=True) if adapter else None,
        list(cfg.task.get("unseen") or []),
    )
