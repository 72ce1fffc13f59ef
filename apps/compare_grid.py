"""A grid of runs at a glance: mean +/- std over seeds of the test ranking chain and head-to-tail group mAP, on the
classes the task is ranked on (its headline, :mod:`evaluation.headline`: Task 2's ``test_unseen/...``).

``make compare`` launches the grid with Hydra's multirun and tags every run with one grid id; this reads the
runs' logged metrics back from MLflow, so the table can be rebuilt any time from the tracking store alone. Whether
the differences in it are more than noise is the paired comparison's question (``evaluation.comparison``).
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from mlflow import MlflowClient

from apps.registry import task_headline
from evaluation.groups import GROUPS
from evaluation.headline import DEFAULT, Headline
from evaluation.report import ranking_chain


def columns(headline: Headline = DEFAULT) -> list[str]:
    """The whole tie-break chain of the headline's test set, so two losses can be ranked from the table alone
    (docs/rules.md §2), then its groups (where logged) and its perturbed copy."""
    test = headline.prefix
    return ([f"{test}/{name}" for name in ranking_chain()] + [f"{test}/group/{g}/mAP" for g in GROUPS]
            + [f"{headline.perturbed}/mAP"])  # fmt: skip


COLUMNS = columns()


def grid_table(client: MlflowClient, experiment: str, grid: str, by: str) -> pd.DataFrame:
    """One row per value of param ``by``: ``mean ± std (n)`` of each column over the grid's finished runs."""
    found = client.get_experiment_by_name(experiment)
    if found is None:
        raise ValueError(f"no MLflow experiment named {experiment!r}")
    runs = client.search_runs([found.experiment_id], filter_string=f"tags.`cxrlt.grid` = '{grid}'")
    runs = [r for r in runs if r.info.status == "FINISHED"]
    if not runs:
        raise ValueError(f"no finished runs tagged cxrlt.grid={grid!r} in experiment {experiment!r}")
    headline = task_headline(runs[0].data.tags.get("task", experiment))
    shown = columns(headline)
    frame = pd.DataFrame([{by: r.data.params.get(by, "?"), **{c: r.data.metrics.get(c, np.nan) for c in shown}}
                          for r in runs])  # fmt: skip
    rows = []
    for value, group in frame.groupby(by, sort=False):
        row = {by: value, "runs": len(group)}
        for column in shown:
            values = group[column].dropna()
            if len(values):
                row[column.removeprefix("test/")] = (  # Task 2's test_unseen/... keep their prefix: they say so
                    f"{values.mean():.4f} ± {values.std(ddof=1) if len(values) > 1 else 0:.4f}"
                )
        rows.append(row)
    return pd.DataFrame(rows).sort_values(by)
