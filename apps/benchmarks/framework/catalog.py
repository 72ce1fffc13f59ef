"""The benchmark protocols are the YAML files of ``configs/benchmark/``: adding one is adding a file there.

Each file names its :class:`~apps.benchmarks.framework.protocol.Protocol` subclass in ``_target_`` and holds its
settings; ``name`` must equal the file's stem (so ``NAME=`` and the experiment name agree) and ``description`` is
the line ``make benchmark`` prints without a name. Listing reads the YAML only, so one broken protocol module
cannot hide the others.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from omegaconf import OmegaConf

from apps.benchmarks.framework.bad_input import BadInput
from apps.benchmarks.framework.options import CONFIG_DIR

if TYPE_CHECKING:
    from apps.benchmarks.framework.protocol import Protocol

__all__ = ["CONFIG_DIR", "available", "load_protocol"]


def available(folder: str | Path = CONFIG_DIR) -> dict[str, str]:
    """Protocol name -> one line: its description and versions (the first is the default), sorted by name."""
    out = {}
    for path in sorted(Path(folder).glob("*.yaml")):
        node = OmegaConf.load(path)
        versions = ", ".join(node.get("versions") or {})
        out[path.stem] = f"{node.get('description', '(no description)')} [versions: {versions}]"
    return out


def load_protocol(name: str, folder: str | Path = CONFIG_DIR) -> Protocol:
    """Build the protocol of ``<folder>/<name>.yaml``.

    Raises:
        BadInput: no such file (the message lists those that exist).
        ValueError: the file's ``name`` is not its stem, or its target is not a protocol.
    """
    path = Path(folder) / f"{name}.yaml"
    if not path.is_file():
        known = ", ".join(available(folder)) or "none"
        raise BadInput(f"unknown benchmark {name!r}; known: {known} (configs in {folder})")
    node = OmegaConf.load(path)
    if node.get("name") != name:
        raise ValueError(f"{path}: name is {node.get('name')!r}, expected the file's stem {name!r}")
    from hydra.utils import instantiate

    from apps.benchmarks.framework.protocol import Protocol

    protocol = instantiate(node, _convert_="all")
    if not isinstance(protocol, Protocol):
        raise ValueError(f"{path}: _target_ {node.get('_target_')!r} is not a benchmark Protocol")
    return protocol
