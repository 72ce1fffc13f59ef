"""The metrics a multi-objective study optimises, each with the direction the metric registry gives it.

Why from the registry: whether smaller wins is a fact about the metric, so the user gives no direction and cannot
disagree with ``make register`` or the reports. An objective is judged on validation (the test set never picks a
model); names outside the accepted forms (docs/tuning-registry-submission.md, "Multi-objective tuning") are
refused before anything starts. Whether training really logs a known name is only seen once a trial validates.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from evaluation.groups import GROUPS
from evaluation.metric_registry import SUITE
from training.errors import UserError

#: Where an objective is read: validation, never the test set.
SPLIT = "val"
GROUP = "group"
DIRECTIONS = {True: "maximize", False: "minimize"}
#: Study user attribute and parent-run tag holding a multi-objective study's ``[[metric, direction], ...]``.
OBJECTIVES_ATTR = "cxrlt.objectives"


class ObjectiveError(UserError, ValueError):
    """``tune.objectives`` names a metric the platform does not know, twice, or fewer than two."""


@dataclass(frozen=True)
class Goal:
    """One objective: the logged metric key and whether the study maximises or minimises it."""

    metric: str
    direction: str

    @property
    def higher_is_better(self) -> bool:
        return self.direction == "maximize"


def registry_name(metric: str) -> str | None:
    """The registry metric behind a logged key: its last part, or the registry name that part ends in
    (``proxy_ood_mAP`` -> ``mAP``); ``None`` when it is none of the registry's."""
    last = metric.rsplit("/", 1)[-1].removesuffix("_best")
    if last in SUITE:
        return last
    tail = last.rsplit("_", 1)[-1]
    return tail if "_" in last and tail in SUITE else None


def known_names() -> list[str]:
    """Every overall and per-group validation key the registry defines (what an unknown name is matched against)."""
    names = [f"{SPLIT}/{m.name}" for m in SUITE]
    names += [f"{SPLIT}/{GROUP}/{g}/{m.name}" for g in GROUPS for m in SUITE if m.per_class]
    return names


def _problem(metric: str) -> str | None:
    parts = metric.split("/")
    if parts[0] != SPLIT or len(parts) < 2:
        return f"an objective is a validation metric ({SPLIT}/...): the test set never picks a model"
    if registry_name(metric) is None:
        return f"{parts[-1]!r} is no metric of the registry (evaluation/metric_registry.py: {', '.join(m.name for m in SUITE)})"
    if len(parts) > 2 and parts[1] == GROUP and (len(parts) != 4 or parts[2] not in GROUPS):
        return f"groups are {', '.join(GROUPS)} (docs/rules.md section 5)"
    return None


def parse_goals(metrics: Iterable[str]) -> tuple[Goal, ...]:
    """The study's objectives in the order given, directions from the registry.

    Raises:
        ObjectiveError: a metric outside :func:`known_names` (with the closest known names), a repeated metric, or
            fewer than two metrics.
    """
    names = [str(m).strip() for m in metrics]
    for metric in names:
        problem = _problem(metric)
        if problem:
            close = difflib.get_close_matches(metric, known_names(), n=4, cutoff=0.6)
            hint = f"; close names: {', '.join(close)}" if close else ""
            raise ObjectiveError(f"tune.objectives: unknown metric {metric!r}: {problem}{hint}")
    repeated = sorted({m for m in names if names.count(m) > 1})
    if repeated:
        raise ObjectiveError(f"tune.objectives: {', '.join(repeated)} given more than once")
    if len(names) < 2:
        raise ObjectiveError(f"tune.objectives: {names} is one objective; give two or more, or optimise one metric "
                             "with ARGS=tune.metric=<metric>")  # fmt: skip
    return tuple(Goal(m, DIRECTIONS[SUITE[registry_name(m)].higher_is_better]) for m in names)


def goals_from_config(objectives: Sequence[str] | None) -> tuple[Goal, ...] | None:
    """``tune.objectives`` parsed, or ``None`` for a single-objective study (the setting left null or empty)."""
    if objectives is None or (not isinstance(objectives, str) and len(objectives) == 0):
        return None
    if isinstance(objectives, str):  # ARGS='tune.objectives="val/mAP val/mECE"' is one string
        objectives = objectives.split()
    return parse_goals(objectives)


def stored_goals(held: Sequence[Sequence[str]] | None) -> tuple[Goal, ...] | None:
    """The goals a study (user attribute) or its parent run (tag, as JSON) recorded, or None: single-objective."""
    return tuple(Goal(str(m), str(d)) for m, d in held) if held else None
