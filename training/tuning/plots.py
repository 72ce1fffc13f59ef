"""A study's plots as one interactive page (``plots.html`` in the parent run), drawn by Optuna's plotly backend.

Interactive because a study's questions are (which trials a parallel-coordinate line belongs to, where the pruned
ones sit); Optuna's static plots answer none of that. One page with plotly.js inlined once, because MLflow's
artifact viewer cannot fetch a CDN script on an offline cluster and four files would carry it four times.
"""

from __future__ import annotations

import html
import logging
import warnings
from collections.abc import Callable
from pathlib import Path

import optuna
from optuna import visualization
from plotly.offline import get_plotlyjs

from training.tuning.goals import OBJECTIVES_ATTR

log = logging.getLogger(__name__)

#: Section id -> (title, Optuna plot). Importance needs two complete trials with a varying parameter, intermediate
#: values a pruner's reports; a plot Optuna cannot draw yet is left out with a log line, never an error.
PLOTS: dict[str, tuple[str, Callable[[optuna.Study], object]]] = {
    "optimization_history": ("Optimisation history", visualization.plot_optimization_history),
    "param_importances": ("Parameter importances", visualization.plot_param_importances),
    "parallel_coordinate": ("Parallel coordinates", visualization.plot_parallel_coordinate),
    "intermediate_values": (
        "Intermediate values (per epoch, as the pruner saw them)",
        visualization.plot_intermediate_values,
    ),
    "pareto_front": ("Pareto front", lambda study: _pareto_front(study)),
}


def _pareto_front(study: optuna.Study):
    """A multi-objective study's front (two or three objectives: Optuna refuses more); a one-objective study has
    none to draw, which is no news worth a log line."""
    if len(study.directions) < 2:
        return None
    return visualization.plot_pareto_front(study, target_names=_names(study))


def _names(study: optuna.Study) -> list[str] | None:
    held = study.user_attrs.get(OBJECTIVES_ATTR)
    return [metric for metric, _ in held] if held else None


STYLE = "body{font-family:system-ui,sans-serif;max-width:1200px;margin:1em auto;padding:0 1em}"


def figures(study: optuna.Study) -> dict[str, object]:
    """The plotly figures Optuna can draw for the study now, by section id."""
    drawn = {}
    for key, (_, plot) in PLOTS.items():
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # "You need to set up the pruning feature ...": we skip instead
                figure = plot(study)
        except (ValueError, RuntimeError, ZeroDivisionError) as error:
            log.info("plot %s skipped: %s", key, error)
            continue
        if figure is not None and figure.data:  # no intermediate values without a pruner: an empty frame says nothing
            drawn[key] = figure
    return drawn


def write_plots_page(study: optuna.Study, path: Path) -> list[str]:
    """Write the page; returns the section ids it holds."""
    drawn = figures(study)
    sections = [
        f'<section id="{key}"><h2>{html.escape(PLOTS[key][0])}</h2>'
        f"{figure.to_html(full_html=False, include_plotlyjs=False, div_id=f'plot-{key}')}</section>"
        for key, figure in drawn.items()
    ]
    title = html.escape(f"Study {study.study_name}")
    path.write_text(f"<!doctype html><html><head><meta charset='utf-8'><title>{title}</title><style>{STYLE}</style>"
                    f"<script>{get_plotlyjs()}</script></head><body><h1>{title}</h1>{''.join(sections)}</body></html>\n")  # fmt: skip
    return list(drawn)
