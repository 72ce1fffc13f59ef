"""``make compare``: is run B really better than run A? A paired bootstrap of runs (or a grid's seeds) on one test set.

``make compare RUNS="<ref> <ref> ..."`` compares finished runs, registered versions (``models:/<name>/<version>``,
``models:/<name>@<alias>``: ``training.run_lookup``) or grid tags (``make compare``'s ``cxrlt.grid``, also written
``grid:<tag>``). A run or a version is an entry of its own; a grid becomes one entry per value of ``--by``
(``loss.name``), whose runs are that configuration's seeds. Only FINISHED runs are compared: only they hold the
tested predictions. ``make compare LOSSES=... SEEDS=...`` trains the grid first and prints its mean ± std table,
read back from MLflow so that it can be rebuilt any time from the tracking store alone.

The comparison is a run of its own in experiment ``compare-<task>`` (the files of :mod:`apps.compare_report`, as
artifacts, and the verdict), and each compared run gets the tag ``cxrlt.compared_in`` = the latest comparison that
included it, so the way from a training run to the verdict about it is one click. ``make register
ARGS=--require-significant`` asks the same question of the pick and the champion (:func:`require_significant_gain`).
The statistics are ``evaluation.paired`` / ``evaluation.comparison``; how to read them: docs/compare.md.
"""

from __future__ import annotations

import argparse
import re
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
from mlflow import MlflowClient
from mlflow.exceptions import MlflowException
from omegaconf import OmegaConf

from apps.compare_report import PAIRS_CSV, PER_CLASS_CSV, write_all
from evaluation.comparison import CORRECTION, P_VALUE, Comparison, Settings, compare
from evaluation.groups import GROUPS
from evaluation.headline import DEFAULT, Headline, headline_of
from evaluation.metric_registry import SUITE
from evaluation.paired import entry_replicates, higher_is_better, paired_difference, seed_noise
from evaluation.paired_data import DifferentTestSets, align
from evaluation.prediction_columns import ID_COLUMN
from evaluation.report import ranking_chain
from evaluation.tables import PER_CLASS_TABLE, logged_tables_tag, write_table
from training.config_files import CONFIGS
from training.errors import UserError, user_errors
from training.run_lookup import ModelNotFound, existing_store_client, finished_run
from training.tracking.artifacts import download
from training.tracking.uri import resolve_tracking_uri

RUN_ID = re.compile(r"^(run:|runs:/)?[0-9a-f]{32}(/.*)?$")
GRID_TAG = "cxrlt.grid"
GRID_PREFIX = "grid:"
ARTIFACT_ROOT = "mlruns/artifacts"  # configs/tracking/mlflow.yaml, for an experiment this command creates
COMPARED_IN = "cxrlt.compared_in"
FOLDER = "compare"
#: The splits whose stored predictions ``--require-significant`` can test a selection metric on.
SPLITS = ("val", "test")


class CompareError(UserError, ValueError):
    """Nothing to compare, or a reference that names nothing comparable; the message says which."""


class NotSignificant(UserError, ValueError):
    """The pick does not beat the champion significantly, or its metric cannot be tested from stored predictions."""


def task_headline(task: str) -> Headline:
    """The classes ``task``'s runs are ranked on (``configs/task/<task>.yaml``): compared by default, and the test
    set whose chain breaks ``make register``'s ties."""
    path = CONFIGS / "task" / f"{task}.yaml"
    return headline_of(OmegaConf.load(path)) if path.is_file() else DEFAULT


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


def columns(headline: Headline = DEFAULT) -> list[str]:
    """The grid table's columns: the whole tie-break chain of the headline's test set, so two losses can be ranked
    from the table alone (docs/rules.md §2), then its groups (where logged) and its perturbed copy."""
    test = headline.prefix
    return ([f"{test}/{name}" for name in ranking_chain()] + [f"{test}/group/{g}/mAP" for g in GROUPS]
            + [f"{headline.perturbed}/mAP"])  # fmt: skip


COLUMNS = columns()


def grid_table(client: MlflowClient, experiment: str, grid: str, by: str) -> pd.DataFrame:
    """One row per value of param ``by``: ``mean ± std (n)`` of each column over the grid's finished runs, on the
    classes the task is ranked on. Whether the differences are more than noise is the comparison's question."""
    runs = grid_runs(client, grid, experiment)
    if not runs:
        raise CompareError(f"no finished runs tagged {GRID_TAG}={grid!r} in experiment {experiment!r}")
    shown = columns(task_headline(runs[0].data.tags.get("task", experiment)))
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


def log_comparison(client: MlflowClient, uri: str, task: str, comparison: Comparison, runs: dict[str, list[str]],
                   folder: Path) -> str:  # fmt: skip
    """Log ``folder`` (:func:`apps.compare_report.write_all`'s files) as a new run, tagged onto every compared run;
    returns its id. Its params say how the comparison was computed."""
    from training.tracking.tracked_run import TrackedRun, ensure_experiment  # lightning: only when logging

    experiment = ensure_experiment(client, f"compare-{task}", uri, ARTIFACT_ROOT)
    settings = comparison.settings
    compared = [run_id for ids in runs.values() for run_id in ids]
    tables = [Path(name).stem + ".json" for name in (PAIRS_CSV, PER_CLASS_CSV)]
    for name, table in zip((PAIRS_CSV, PER_CLASS_CSV), tables, strict=True):  # the UI shows JSON tables as tables
        write_table(pd.read_csv(folder / name), folder / table)
    params = {"entries": " | ".join(comparison.entries), "n_boot": settings.n_boot, "seed": settings.seed,
              "alpha": settings.alpha, "correction": CORRECTION, "p_value": P_VALUE, "strata": comparison.strata,
              "runs": " ".join(compared)}  # fmt: skip
    pairs = comparison.pairs
    metrics = {"significant_pairs": float(pairs["significant"].sum()), "tests": float(len(pairs))}
    tags = {"cxrlt.kind": "comparison", "task": task, "cxrlt.compared_runs": " ".join(compared),
            "mlflow.note.content": "\n".join(comparison.verdict()),
            **logged_tables_tag([f"{FOLDER}/{table}" for table in tables])}  # fmt: skip
    with TrackedRun.start(client, experiment, f"compare-{len(comparison.entries)}-{task}", tags) as run:
        run.log(params=params, metrics=metrics)
        run.log_artifacts(folder, FOLDER)
    for run_id in compared:
        client.set_tag(run_id, COMPARED_IN, run.run_id)
    return run.run_id


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


def tested_metric(metric: str) -> tuple[str, str]:
    """``(split, macro name)`` of a selection metric computed from stored predictions: ``val/mAP_best`` ->
    ``("val", "mAP")``."""
    split, _, name = metric.partition("/")
    name = name.removesuffix("_best")
    macros = {m.name for m in SUITE.per_class(val_thresholds=False)}
    if split not in SPLITS or name not in macros:
        names = "|".join(sorted(macros))
        raise NotSignificant(f"--require-significant tests a suite metric on a split's stored predictions "
                             f"(<{'|'.join(SPLITS)}>/<{names}>); {metric!r} is not one: register without it, or "
                             "rank by METRIC=val/mAP")  # fmt: skip
    return split, name


def require_significant_gain(client: MlflowClient, run_id: str, champion, metric: str,
                             settings: Settings | None = None) -> str:  # fmt: skip
    """The line to print when ``run_id`` may become champion; raises :class:`NotSignificant` otherwise.

    Ranking picks the run with the best selection metric, however small the lead; this gate runs the paired
    bootstrap between the pick and the current champion on the stored predictions of the split the metric is
    measured on (``val/mAP``: ``predictions/val.csv``, so the test set still plays no part in the choice) and lets
    the registration go on only when the pick is better with a two-sided bootstrap p below ``alpha``. One test, so
    no multiple-comparison correction. Without a champion, or when the pick already is it, there is nothing to beat.

    Args:
        run_id: the run about to be registered.
        champion: the current alias holder (a ``ModelVersion``) or None.
        metric: the ranking metric (``val/mAP``).
    """
    if champion is None:
        return f"--require-significant: no current champion, nothing to beat; registering run {run_id}"
    if champion.run_id == run_id:
        return f"--require-significant: run {run_id} already is the champion (version {champion.version})"
    split, name = tested_metric(metric)
    settings = settings or Settings()
    with tempfile.TemporaryDirectory() as tmp:
        frames = {}
        for label, run in ((f"champion run {champion.run_id[:8]}", champion.run_id), (f"run {run_id[:8]}", run_id)):
            folder = Path(tmp) / run
            folder.mkdir()
            frames[label] = read_split(client, run, split, str(folder))
    try:
        data = align(frames)
    except DifferentTestSets as error:
        raise NotSignificant(f"--require-significant cannot compare the two runs: {error}") from None
    old, new = (entry_replicates(data.targets, [probs], data.labels, n_boot=settings.n_boot, seed=settings.seed,
                                 strata=data.strata, threshold=settings.threshold, macros=(name,))[name]
                for probs in data.probs.values())  # fmt: skip
    (d,) = paired_difference(old, new, seed_noise(settings.n_boot, settings.seed), settings.ci)
    better = (d.value > 0) == higher_is_better(name) and d.value != 0
    summary = (f"{split}/{name} {d.value:+.4f} [{d.low:+.4f}, {d.high:+.4f}], p = {d.p:.2g} (paired bootstrap, "
               f"{settings.n_boot} resamples of the {split} predictions, against champion version {champion.version}, "
               f"run {champion.run_id})")  # fmt: skip
    if better and d.p < settings.alpha:
        return f"--require-significant: run {run_id} beats the champion significantly: {summary}; registering"
    raise NotSignificant(f"not registered: run {run_id} does not beat the champion significantly (p < "
                         f"{settings.alpha}, better direction): {summary}. Without --require-significant it would "
                         "be registered")  # fmt: skip


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("references", nargs="*", help="run ids, models:/<name>/<version> or @<alias>, grid tags")
    parser.add_argument("--experiment", default=None, help="look grid tags up in this experiment only")
    parser.add_argument("--grid", default=None, help="a cxrlt.grid tag: its mean ± std table, then the comparison")
    parser.add_argument("--by", default="loss.name", help="param that splits a grid into entries (loss.name)")
    parser.add_argument("--split", default=None, help="the stored predictions compared, predictions/<split>.csv "
                        "(default: the task's headline set, test; test_unseen for Task 2)")  # fmt: skip
    parser.add_argument("--n-boot", type=int, default=Settings.n_boot, help="shared resamples (default %(default)s)")
    parser.add_argument("--seed", type=int, default=Settings.seed, help="resampling seed (default %(default)s)")
    parser.add_argument("--alpha", type=float, default=Settings.alpha, help="family-wise level (default %(default)s)")
    parser.add_argument("--out", type=Path, default=None, help="also keep the tables, figure and report here")
    parser.add_argument("--no-log", action="store_true", help="do not log the comparison as an MLflow run")
    parser.add_argument("--debug", action="store_true", help="show the traceback of an input error")
    args = parser.parse_args(argv)
    if args.grid and not args.experiment:
        parser.error("--grid needs --experiment (the task's experiment the grid was trained in)")
    uri = resolve_tracking_uri()
    references = list(args.references) + ([f"grid:{args.grid}"] if args.grid else [])
    with user_errors(CompareError, DifferentTestSets, ModelNotFound, debug=args.debug):
        client = existing_store_client(uri)
        if args.grid:
            table = grid_table(client, args.experiment, args.grid, args.by)
            print(f"\ngrid {args.grid} in experiment {args.experiment}: mean ± std over seeds\n")
            print(table.to_string(index=False))
        settings = Settings(n_boot=args.n_boot, seed=args.seed, alpha=args.alpha)
        comparison, task, run_id = run_comparison(client, uri, references, args.by, args.experiment, settings,
                                            log=not args.no_log, out=args.out, split=args.split)  # fmt: skip
    print(f"\npaired bootstrap, {settings.n_boot} shared resamples, {comparison.strata}; p {CORRECTION}-adjusted, "
          f"significant below {settings.alpha}\n")  # fmt: skip
    print(comparison.verdict_table().to_string(index=False))
    print("\nverdict:")
    for line in comparison.verdict():
        print(f"  {line}")
    for note in comparison.notes:
        print(f"note: {note}")
    if run_id:
        report = f"{client.get_run(run_id).info.artifact_uri}/{FOLDER}/report.html"  # a file:// URL on a local store
        print(f"\nlogged as run {run_id} in experiment compare-{task}; each compared run is tagged cxrlt.compared_in "
              f"with it\nreport: {report}")  # fmt: skip


if __name__ == "__main__":
    main()
