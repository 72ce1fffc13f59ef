"""Building a selectable component from its config group node."""

from __future__ import annotations

from collections.abc import Mapping

from hydra.utils import instantiate


def build_component(node: Mapping):
    """Instantiate a ``configs/<group>/<name>.yaml`` node.

    Every selectable component carries ``name`` (its public name, used in run names and comparisons) beside
    ``_target_`` and the constructor arguments; ``name`` is not a constructor argument, so it is dropped here.
    """
    return instantiate({key: value for key, value in node.items() if key != "name"}, _convert_="all")
