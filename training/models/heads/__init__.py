"""Multi-label heads: ``configs/head/<name>.yaml`` puts one at ``model.head``; the linear head is the default.

Every head maps the backbone's features to ``(B, C)`` logits and owns a ``bias`` of shape ``(C,)``, which the loss's
prior-based initialisation (focal, DB) writes into and cRT resets. A head that reads the unpooled feature map sets
``uses_feature_map = True``; one whose training objective is more than the task loss on its logits (a gate, a
mixture of experts) defines ``training_loss(features, targets, mask, loss)``.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping, Sequence

from hydra.utils import get_class
from torch import nn

from training.allowed_targets import UnsafeConfig, check_target


class UnsafeHead(UnsafeConfig):
    """``model.head._target_`` names an allowed class that is not a torch module (configs read back are untrusted)."""


def build_head(
    cfg: Mapping | None, in_features: int, num_labels: int, labels: Sequence[str] | None = None
) -> nn.Module:
    """The head ``cfg`` describes; no config, or ``linear``, is the plain ``nn.Linear`` older runs were trained with.

    The linear head stays an ``nn.Linear`` at ``head`` so checkpoints of every earlier run keep their keys. Only a
    head whose constructor takes ``labels`` gets the label names (the two-stage head finds ``Normal`` by name).
    """
    cfg = dict(cfg or {})
    target = cfg.pop("_target_", None)
    cfg.pop("name", None)
    if target is None:
        return nn.Linear(in_features, num_labels)
    check_target(str(target), "model.head._target_", "model config")
    cls = get_class(str(target))
    if not (isinstance(cls, type) and issubclass(cls, nn.Module)):
        raise UnsafeHead(f"model.head._target_ {target!r} is not a torch module")
    if labels is not None and "labels" in inspect.signature(cls).parameters:
        cfg["labels"] = list(labels)
    return cls(in_features=in_features, num_labels=num_labels, **cfg)


def reset_head(head: nn.Module) -> None:
    """Re-initialise a head for cRT: small normal weights and zero bias for a linear head, its own reset otherwise."""
    if isinstance(head, nn.Linear):
        nn.init.normal_(head.weight, std=0.01)
        nn.init.zeros_(head.bias)
    else:
        head.reset_parameters()
