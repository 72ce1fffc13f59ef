"""How an evaluation's numbers are laid out for MLflow 3's UI, where a run has hundreds of metrics.

MLflow lists metrics alphabetically, so per-class ones push ``test/mAP`` down the list and never read as a table
of classes. Two layouts help (docs/evaluation.md, "Comparing runs in the MLflow UI"): the per-class table
(``evaluation/per_class.json``, MLflow's table format, shown side by side by the *Artifact evaluation* view;
written even when per-class metrics are off, so nothing visible is lost) and the headline view (a saved runs-table
view stored as an experiment tag, so it lives on the server for every teammate). Both formats are UI
conventions read from MLflow's UI bundle, not a documented API, so ``tests/integration/test_ui_browser.py``
(``-m browser``) is what notices when an MLflow upgrade changes them.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from evaluation.headline import FAMILIES, SEEN_SETS, Headline
from evaluation.metric_registry import SUITE

#: Where the per-class table goes, relative to the run's artifact root.
PER_CLASS_TABLE = "evaluation/per_class.json"
#: The run tag through which MLflow's UI finds a run's tables (``mlflow.utils.mlflow_tags.MLFLOW_LOGGED_ARTIFACTS``).
LOGGED_TABLES_TAG = "mlflow.loggedArtifacts"
#: Experiment tags with this prefix are the runs table's saved views (MLflow 3.17's ``viewStateShareKey``).
SAVED_VIEW_PREFIX = "mlflow.sharedViewState."
HEADLINE_VIEW_ID = "cxrlt-headline"
#: How a macro metric's bootstrap interval is logged beside it (``evaluation.suite``: ``test/mAP_ci_low``).
CI_SUFFIXES = ("_ci_low", "_ci_high")


def per_class_metric_names(evaluation) -> set[str]:
    """The logged keys that hold one class's value (``test/ap/Hernia``), as opposed to macros and groups."""
    return {
        f"{metric_set.prefix}/{key}/{label}"
        for metric_set in evaluation.sets.values()
        for key in metric_set.result.per_class
        for label in evaluation.labels
    }


def per_class_table(evaluation) -> pd.DataFrame:
    """One row per class in label order: every per-class value of the plain test set (column ``test/ap`` holds
    metric ``test/ap/<class>``), the AP of each other metric set, then the class's group, training prevalence,
    test positives and readable name where the data source gives one.

    ``test/ap`` comes right after ``class`` because the *Artifact evaluation* view compares the first column after
    the one it groups by. An undefined value stays missing rather than zero, so it is never ranked or averaged as a
    real score.
    """
    labels = list(evaluation.labels)
    columns: dict[str, object] = {"class": labels}
    for metric_set in evaluation.sets.values():
        per_class = metric_set.result.per_class
        keys = [m.key for m in SUITE.per_class(val_thresholds=True) if m.key in per_class]
        for key in keys if metric_set.prefix == "test" else [k for k in keys if k == "ap"]:
            columns[f"{metric_set.prefix}/{key}"] = np.asarray(per_class[key], dtype=float)
    group_of = {index: group for group, members in evaluation.groups.items() for index in members}
    test = evaluation.predictions["test"]
    columns["group"] = [group_of.get(i, "") for i in range(len(labels))]
    columns["train_prevalence"] = np.asarray(evaluation.train_prevalence, dtype=float)
    columns["test_positives"] = [int((test[f"true/{name}"] == 1).sum()) for name in labels]
    titles = getattr(evaluation, "label_titles", None) or {}
    if titles:  # a label that is a code (a UMLS CUI) gets its name, last so `test/ap` stays next to `class`
        columns["name"] = [titles.get(name, "") for name in labels]
    return pd.DataFrame(columns)


def write_table(frame: pd.DataFrame, path: Path, decimals: int = 4) -> Path:
    """``frame`` in MLflow's table format, ``{"columns": [...], "data": [[...], ...]}``, missing values as null.

    Rounded to ``decimals`` because people read it side by side in the UI; full precision is in ``metrics.json``.
    """
    path.write_text(frame.to_json(orient="split", index=False, double_precision=decimals) + "\n")
    return path


def logged_tables_tag(paths: Sequence[str]) -> dict[str, str]:
    """The run tag that makes MLflow's UI show ``paths`` (JSON artifacts written by :func:`write_table`) as tables.

    It replaces the tag's value; this platform logs no other tables. ``mlflow.log_table`` is not used because it
    appends rows to an existing table, so ``make evaluate`` would list every class twice.
    """
    return {LOGGED_TABLES_TAG: json.dumps([{"path": path, "type": "table"} for path in paths])}


def headline_view_tag(
    selection_metric: str,
    set_prefix: str = "test",
    descending: bool = True,
    now_ms: int | None = None,
    tags: Sequence[str] = (),
) -> dict[str, str]:
    """The experiment tag of the runs table's *Headline metrics* saved view.

    Columns: the selection metric at the kept checkpoint, ``<set_prefix>/`` with the ranking chain's metrics, the
    perturbed and held-out mAP, each test figure with its interval (so runs a few thousandths apart are not read as
    ranked when their intervals overlap), then the run tags ``tags``. Rows are sorted by the selection metric, as
    ``make register`` ranks runs (never by a test metric: docs/rules.md §2). Open it from the *Views* button, or
    ``#/experiments/<id>/runs?viewStateShareKey=cxrlt-headline``. ``now_ms``: the view's creation time (None: now).
    """
    best = f"{selection_metric}_best"
    family = Headline(FAMILIES.get(set_prefix, SEEN_SETS))
    chain = (f"{set_prefix}/{m.name}" for m in SUITE.tie_break_chain())
    tested = [*chain, f"{family.perturbed}/mAP", f"{family.heldout}/mAP"]
    metrics = [best, *(f"{key}{suffix}" for key in tested for suffix in ("", *CI_SUFFIXES))]
    columns = ["attributes.`Dataset`", *(f"tags.`{key}`" for key in tags), *(f"metrics.`{key}`" for key in metrics)]
    state = {"orderByKey": f"metrics.`{best}`", "orderByAsc": not descending, "selectedColumns": columns}
    created = int(time.time() * 1000) if now_ms is None else now_ms
    envelope = {"name": "Headline metrics", "createdAt": created, "updatedAt": created, "state": json.dumps(state)}
    return {SAVED_VIEW_PREFIX + HEADLINE_VIEW_ID: json.dumps(envelope)}
