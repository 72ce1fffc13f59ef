"""What a config read back from a run may build: exactly the classes and functions this project's ``configs/`` name.

A run's config, spec or checkpoint hyperparameters can be edited by anyone with write access to the store, and a
dotted name reaches everything a module imports (``training.runs.torch.load`` is ``torch.load``), so a prefix rule
would allow arbitrary code. The rule is an explicit list of the ``_target_`` and ``model.module`` values in the
project's own ``configs/``, compared as whole strings before anything is imported; a new component is allowed by
adding its YAML (docs/architecture.md, "Finished runs").
"""

from __future__ import annotations

from collections.abc import Iterator
from functools import cache

from omegaconf import OmegaConf

from training.config_files import CONFIGS
from training.errors import UserError

#: Keys whose string value names something to import and build: Hydra's ``_target_`` and the model factory's
#: ``module`` (a ``MultiLabelClassifier`` subclass of another shape, docs/recipes.md).
TARGET_KEYS = ("_target_", "module")


class UnsafeConfig(UserError, ValueError):
    """A config read back from a run names something this project's configs do not name, so it is not built."""


def targets_in(node, path: str = "") -> Iterator[tuple[str, str]]:
    """Every ``(location, dotted name)`` under a target key of a plain config tree."""
    if isinstance(node, dict):
        for key, value in node.items():
            where = f"{path}.{key}" if path else str(key)
            if key in TARGET_KEYS and isinstance(value, str):
                yield where, value
            else:
                yield from targets_in(value, where)
    elif isinstance(node, list):
        for index, value in enumerate(node):
            yield from targets_in(value, f"{path}[{index}]")


@cache
def allowed_targets() -> frozenset[str]:
    """The dotted names that ``configs/**.yaml`` put under a target key: the whole allow-list."""
    found: set[str] = set()
    for path in sorted(CONFIGS.rglob("*.yaml")):
        found.update(target for _, target in targets_in(OmegaConf.to_container(OmegaConf.load(path), resolve=False)))
    return frozenset(found)


def check_target(target: str, where: str, source: str) -> None:
    """Refuse ``target`` by name unless the project's configs name it, before anything imports it."""
    if target not in allowed_targets():
        raise UnsafeConfig(
            f"{source}: {where} = {target!r} is not a class or function that this project's configs/ name; "
            "refusing to build it"
        )


def check_targets(tree, source: str) -> None:
    """:func:`check_target` on every target key of a plain config tree (a run's config, a spec, hyperparameters)."""
    for where, target in targets_in(tree):
        check_target(target, where, source)
