"""``make compare``'s work: references -> entries -> one shared test set -> paired comparison -> files -> MLflow."""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from pathlib import Path

from mlflow import MlflowClient

from apps.compare_report import write_all
from apps.compare_runs import read_predictions, resolve_entries, task_of
from apps.compare_tracking import log_comparison
from apps.registry import task_headline
from evaluation.comparison import Comparison, Settings, compare
from evaluation.paired_data import align


def run_comparison(client: MlflowClient, uri: str, references: Sequence[str], by: str = "loss.name",
                   experiment: str | None = None, settings: Settings | None = None, log: bool = True,
                   out: Path | None = None, split: str | None = None) -> tuple[Comparison, str, str | None]:  # fmt: skip
    """Compare the runs ``references`` name; returns the comparison, the task and the comparison's MLflow run id
    (None with ``log=False``).

    ``split`` names the stored predictions compared (``predictions/<split>.csv``); by default those of the classes
    the task is ranked on (its headline, :mod:`evaluation.headline`: ``test``, Task 2's ``test_unseen``), so a
    verdict is about the figures the challenge ranks.

    Raises:
        CompareError: fewer than two entries, a reference naming nothing, runs of different tasks.
        DifferentTestSets: the runs were not scored on one test set.
        ModelNotFound / RunNotFinished: an unknown or unfinished run, or one without stored predictions.
    """
    entries = resolve_entries(client, references, by, experiment)
    task = task_of(entries)
    headline = task_headline(task)
    split = split or headline.prefix
    frames, groups = read_predictions(client, entries, split)
    label = {run_id: f"run {run_id[:8]} ({entry.name})" for entry in entries for run_id in entry.run_ids}
    data = align({label[run_id]: frame for run_id, frame in frames.items()})  # refusals name the run and its entry
    members = {entry.name: [label[run_id] for run_id in entry.run_ids] for entry in entries}
    comparison = compare(data, members, groups, settings or Settings())
    if headline.ranks(split):
        what = f"{headline.title or 'the labels'}: the classes {task} is ranked on"
    else:
        what = headline.others or f"not the classes {task} is ranked on"
    comparison.notes.insert(0, f"compared on predictions/{split}.csv ({what})")
    runs = {entry.name: entry.run_ids for entry in entries}
    with tempfile.TemporaryDirectory() as tmp:
        folder = out or Path(tmp) / "compare"
        write_all(comparison, runs, folder)
        run_id = log_comparison(client, uri, task, comparison, runs, folder) if log else None
    return comparison, task, run_id
