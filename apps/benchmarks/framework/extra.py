"""The benchmark-only packages (pyproject's ``benchmarks`` extra), imported where a benchmark scores with them.

The core install (``make setup``: training, evaluation, submission, serving) does not carry them; ``make
benchmark`` and ``make card`` install them on first use. Code that needs one on an install without it raises
:class:`MissingExtra`, which the command lines print as one line naming the install command.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from apps.benchmarks.framework.bad_input import BadInput

INSTALL = "install the benchmark-only packages with make benchmarks-extra (or pip install -e '.[benchmarks]')"


class MissingExtra(BadInput):
    """A benchmark-only package is not installed."""


def require(module: str) -> ModuleType:
    """``module`` imported, or :class:`MissingExtra` naming the package that is missing and how to install it."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as error:
        package = (error.name or module).split(".")[0]
        raise MissingExtra(f"{package} is not installed: {INSTALL}") from error
