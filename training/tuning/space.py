"""Search spaces declared in YAML (``configs/hparams_search/<name>.yaml``), turned into Optuna suggestions.

Format: docs/tuning-registry-submission.md, "Tuning". Distributions are known only through
:data:`DISTRIBUTIONS`, so a new one is one entry there. Optuna parameter names are the config keys themselves,
so the trials table, importance plot and MLflow params all read ``model.lr``; a key declared under two options
must therefore use the same kind of distribution (Optuna rejects a float and a categorical under one name).
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import optuna
import yaml

#: Distribution name -> how a trial draws it. Arguments are the ones written in the YAML, in order.
DISTRIBUTIONS: dict[str, Callable[..., Any]] = {
    "uniform": lambda trial, name, low, high: trial.suggest_float(name, float(low), float(high)),
    "log_uniform": lambda trial, name, low, high: trial.suggest_float(name, float(low), float(high), log=True),
    "quniform": lambda trial, name, low, high, step: trial.suggest_float(name, float(low), float(high), step=step),
    "int": lambda trial, name, low, high, step=1: trial.suggest_int(name, int(low), int(high), step=int(step)),
    "log_int": lambda trial, name, low, high: trial.suggest_int(name, int(low), int(high), log=True),
    "choice": lambda trial, name, *options: trial.suggest_categorical(name, list(options)),
}

_CALL = re.compile(r"^\s*([A-Za-z_]\w*)\s*\((.*)\)\s*$", re.DOTALL)


class SearchSpaceError(ValueError):
    """A search-space file that cannot be used; the message names the key and the offending text."""


@dataclass(frozen=True)
class Distribution:
    """One parsed declaration, e.g. ``log_uniform(1e-5, 1e-2)`` -> ``Distribution("log_uniform", (1e-5, 0.01))``."""

    kind: str
    args: tuple

    def suggest(self, trial: optuna.trial.BaseTrial, name: str):
        """Draw this parameter in ``trial`` under ``name``."""
        return DISTRIBUTIONS[self.kind](trial, name, *self.args)


def _argument(text: str):
    """One argument as YAML reads it: ``1e-5`` -> float, ``3`` -> int, ``asl`` -> str, ``null`` -> None."""
    value = yaml.safe_load(text)
    # YAML 1.1 reads "1e-5" (no dot) as a string; a number is what was meant.
    if isinstance(value, str) and re.fullmatch(r"[-+]?\d+(\.\d*)?[eE][-+]?\d+", value):
        return float(value)
    return value


def parse_distribution(text: str, key: str = "?") -> Distribution:
    """Parse ``name(arg, ...)`` into a :class:`Distribution`, checking the name and argument count early.

    Raises:
        SearchSpaceError: unknown distribution, malformed text, or arguments the distribution does not take.
    """
    match = _CALL.match(str(text))
    if not match:
        raise SearchSpaceError(
            f"{key}: {text!r} is not a distribution like 'uniform(0, 1)'; known: {sorted(DISTRIBUTIONS)}"
        )
    kind, inner = match.groups()
    if kind not in DISTRIBUTIONS:
        raise SearchSpaceError(f"{key}: unknown distribution {kind!r} in {text!r}; known: {sorted(DISTRIBUTIONS)}")
    args = tuple(_argument(part) for part in inner.split(",")) if inner.strip() else ()
    try:  # binding the arguments catches a wrong count now, not in the middle of a study
        inspect.signature(DISTRIBUTIONS[kind]).bind(None, key, *args)
    except TypeError as error:
        raise SearchSpaceError(f"{key}: bad arguments in {text!r} ({error})") from error
    return Distribution(kind, args)


@dataclass(frozen=True)
class SearchSpace:
    """A parsed search space.

    Attributes:
        params: unconditional parameters, in file order.
        conditional: ``{parent key: {option: {key: Distribution}}}``, drawn after the parent.
    """

    params: dict[str, Distribution]
    conditional: dict[str, dict[str, dict[str, Distribution]]] = field(default_factory=dict)

    @classmethod
    def from_config(cls, node: Mapping) -> SearchSpace:
        """Build from the ``params`` / ``conditional`` mappings of a search-space config (plain or OmegaConf)."""
        params = {str(k): parse_distribution(v, str(k)) for k, v in (node.get("params") or {}).items()}
        conditional = {
            str(parent): {
                str(option): {
                    str(k): parse_distribution(v, f"{parent}={option}: {k}") for k, v in (space or {}).items()
                }
                for option, space in options.items()
            }
            for parent, options in (node.get("conditional") or {}).items()
        }
        for parent, options in conditional.items():
            if parent not in params or params[parent].kind != "choice":
                raise SearchSpaceError(f"conditional on {parent!r}, which is not a choice(...) parameter of the space")
            unknown = set(options) - {str(o) for o in params[parent].args}
            if unknown:
                raise SearchSpaceError(f"conditional on {parent}: options {sorted(unknown)} are not among its choices")
        return cls(params, conditional)

    def sample(self, trial: optuna.trial.BaseTrial) -> dict[str, Any]:
        """Draw every parameter that applies to this trial: ``{config key: value}``, parents before children."""
        values: dict[str, Any] = {}
        for key, distribution in self.params.items():
            values[key] = distribution.suggest(trial, key)
            for sub_key, sub in self.conditional.get(key, {}).get(str(values[key]), {}).items():
                values[sub_key] = sub.suggest(trial, sub_key)
        return values


def to_overrides(values: Mapping[str, Any]) -> list[str]:
    """Hydra override strings for sampled values (``loss=asl`` swaps a group, ``model.lr=0.001`` sets a value).

    Floats are written with ``repr`` so the run's config holds exactly the value Optuna recorded.
    """
    return [f"{key}={_format(value)}" for key, value in values.items()]


def _format(value) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    return repr(value) if isinstance(value, float) else str(value)
