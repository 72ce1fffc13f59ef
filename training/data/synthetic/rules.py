"""Registry of finding rules: one entry per finding name, looked up by name, never dispatched by if/elif.

A rule has up to two stages, both keyed by the finding's name:

* ``alter(geometry, rng, conspicuity)`` changes the anatomy *before* it is drawn (heart size, dome height,
  spinal curve, bone density, a rib fracture...), so silhouettes stay coherent;
* ``draw(scene, rng, conspicuity)`` adds or removes density on the drawn scene (opacities, lucencies, lines).

``conspicuity`` in (0, 1] is sampled per finding instance: 1 is a textbook example, values near 0.1 are the
subtle cases a resident misses. Rules scale size and contrast with it. Both stages of a rule share one random
stream per (image, finding), so adding a finding to an image never changes how the others are drawn.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np


@dataclass
class FindingRule:
    """The two optional stages of one finding's drawing rule."""

    name: str
    alter: Callable | None = None
    draw: Callable | None = None


RULES: dict[str, FindingRule] = {}


def alters(name: str):
    """Register ``fn(geometry, rng, conspicuity)`` as the anatomy stage of finding ``name``."""

    def register(fn):
        RULES.setdefault(name, FindingRule(name)).alter = fn
        return fn

    return register


def draws(name: str):
    """Register ``fn(scene, rng, conspicuity)`` as the drawing stage of finding ``name``."""

    def register(fn):
        RULES.setdefault(name, FindingRule(name)).draw = fn
        return fn

    return register


def conspicuity(rng: np.random.Generator) -> float:
    """Per-instance conspicuity in [0.1, 1]: spread from subtle to obvious, a little skewed to subtle."""
    return float(0.1 + 0.9 * rng.beta(1.3, 1.5))


def lerp(lo: float, hi: float, c: float) -> float:
    """``lo`` at conspicuity 0, ``hi`` at 1 (sizes and contrasts of subtle vs obvious instances)."""
    return lo + (hi - lo) * c


def pick(rng: np.random.Generator, options, p=None):
    """One element of ``options`` (any sequence), optionally weighted."""
    return options[int(rng.choice(len(options), p=p))]


def side(rng: np.random.Generator, p_right: float = 0.5) -> str:
    """``"R"`` with probability ``p_right``, else ``"L"`` (patient sides)."""
    return "R" if rng.random() < p_right else "L"
