"""Which runs ``make compare RUNS=...`` compares: references resolved to entries, their stored predictions read.

A reference is a run id, a registered version (``models:/<name>/<version>``, ``models:/<name>@<alias>``:
``training.run_refs``) or a grid tag (``make compare``'s ``cxrlt.grid``, also written ``grid:<tag>``). A run or a
version is an entry of its own; a grid becomes one entry per value of ``--by`` (``loss.name``), whose runs are that
configuration's seeds. Only FINISHED runs are compared: only they hold the tested predictions.
"""

from __future__ import annotations

import re
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
from mlflow import MlflowClient
from mlflow.exceptions import MlflowException

from evaluation.prediction_columns import ID_COLUMN
from evaluation.tables import PER_CLASS_TABLE
from training.errors import UserError
from training.run_refs import ModelNotFound, finished_run
from training.tracking.artifacts import download

RUN_ID = re.compile(r"^(run:|runs:/)?[0-9a-f]{32}(/.*)?$")
GRID_TAG = "cxrlt.grid"
GRID_PREFIX = "grid:"


class CompareError(UserError, ValueError):
    """Nothing to compare, or a reference that names nothing comparable; the message says which."""


@dataclass
class Entry:
    """One column of the comparison: a run, a registered version, or one configuration of a grid (its seeds)."""

    name: str
    runs: list = field(default_factory=list)  # mlflow Run objects, one per seed

    @property
    def run_ids(self) -> list[str]:
        return [run.info.run_id for run in self.runs]


def grid_runs(client: MlflowClient, tag: str, experiment: str | None = None) -> list:
    """The FINISHED runs tagged ``cxrlt.grid = tag`` (in ``experiment`` when given, else in every experiment)."""
    if experiment is not None:
        found = client.get_experiment_by_name(experiment)
        if found is None:
            raise CompareError(f"no MLflow experiment named {experiment!r}")
        ids = [found.experiment_id]
    else:
        ids = [e.experiment_id for e in client.search_experiments()]
    runs = client.search_runs(ids, filter_string=f"tags.`{GRID_TAG}` = '{tag}'", max_results=50000) if ids else []
    return [run for run in runs if run.info.status == "FINISHED"]


def resolve_entries(client: MlflowClient, references: Sequence[str], by: str = "loss.name",
                    experiment: str | None = None) -> list[Entry]:  # fmt: skip
    """Entries in the order given (a grid's in sorted ``by`` order); each run at most once."""
    entries: list[Entry] = []
    for reference in references:
        reference = reference.strip()
        if reference.startswith("models:/") or RUN_ID.match(reference):
            try:
                run, version = finished_run(reference, client)
            except ValueError as error:  # a malformed models:/ reference
                raise CompareError(str(error)) from None
            name = reference if version is not None else (run.info.run_name or run.info.run_id[:8])
            entries.append(Entry(name, [run]))
            continue
        tag = reference.removeprefix(GRID_PREFIX)
        runs = grid_runs(client, tag, experiment)
        if not runs:
            raise CompareError(f"{reference!r} is no run id, registered version (models:/...) or grid tag with "
                               f"finished runs ({GRID_TAG}) in {client.tracking_uri}")  # fmt: skip
        groups: dict[str, list] = {}
        for run in runs:
            groups.setdefault(run.data.params.get(by, "?"), []).append(run)
        for value in sorted(groups):
            entries.append(Entry(value, sorted(groups[value], key=lambda r: r.data.params.get("seed", ""))))
    seen: dict[str, str] = {}
    for entry in entries:
        for run_id in entry.run_ids:
            if run_id in seen:
                raise CompareError(f"run {run_id} is named twice ({seen[run_id]} and {entry.name}); compare it once")
            seen[run_id] = entry.name
    names = [entry.name for entry in entries]
    for entry in entries:  # two runs with one name (same config, other data) get their id beside it
        if names.count(entry.name) > 1:
            entry.name = f"{entry.name} ({entry.run_ids[0][:8]})"
    if len(entries) < 2:
        raise CompareError(f"need at least two runs or configurations to compare, got {len(entries)} "
                           f"({', '.join(names) or 'none'})")  # fmt: skip
    return entries


def task_of(entries: Sequence[Entry]) -> str:
    """The task every compared run belongs to (tag ``task``); refused when they differ."""
    tasks = {run.data.tags.get("task", "?") for entry in entries for run in entry.runs}
    if len(tasks) != 1:
        raise CompareError(f"the runs belong to different tasks ({', '.join(sorted(tasks))}); compare within one")
    return tasks.pop()


def read_split(client: MlflowClient, run_id: str, split: str, folder: str) -> pd.DataFrame:
    """A run's stored ``predictions/<split>.csv``, ids kept as text."""
    try:
        path = download(client, run_id, f"predictions/{split}.csv", folder)
    except (MlflowException, OSError):
        raise ModelNotFound(f"run {run_id} has no predictions/{split}.csv to compare on; make evaluate "
                            f"RUN={run_id} writes it") from None  # fmt: skip
    return pd.read_csv(path, dtype={ID_COLUMN: str})


def read_groups(client: MlflowClient, run_id: str, folder: str) -> dict[str, str]:
    """``{class: head-to-tail group}`` from the run's per-class table; empty when it has none."""
    try:
        path = download(client, run_id, PER_CLASS_TABLE, folder)
    except (MlflowException, OSError):
        return {}
    table = pd.read_json(Path(path), orient="split")
    return dict(zip(table["class"].astype(str), table["group"].astype(str), strict=True)) if "group" in table else {}


def read_predictions(client: MlflowClient, entries: Sequence[Entry], split: str = "test"
                     ) -> tuple[dict[str, pd.DataFrame], dict[str, str]]:  # fmt: skip
    """``({run id: predictions}, {class: group of the first run})``."""
    frames = {}
    with tempfile.TemporaryDirectory() as tmp:
        for entry in entries:
            for run_id in entry.run_ids:
                folder = Path(tmp) / run_id
                folder.mkdir()
                frames[run_id] = read_split(client, run_id, split, str(folder))
        groups = read_groups(client, entries[0].run_ids[0], str(Path(tmp) / entries[0].run_ids[0]))
    return frames, groups
