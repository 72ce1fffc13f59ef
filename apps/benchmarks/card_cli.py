"""Entry point of ``make card MODEL=<run id | models:/name/version | models:/name@alias> [CARD=<yaml>]``.

Runs every benchmark of the card's YAML (``configs/card.yaml``) whose data is present and that the model can take,
each exactly as ``make benchmark`` runs and logs it (one MLflow run per benchmark in ``benchmark-<name>``), adds
the model's own test results read from its run, and logs the one table to the model's run as ``card/card.md``,
``card/card.html`` and ``card/card.csv``; a registered version also gets it in its description. A mistyped
model, card or field is one line on stderr and exit status 2, never a traceback.

    python -m apps.benchmarks.card_cli --model models:/cxrlt-task1@champion
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import sys
import time
from typing import TYPE_CHECKING

from apps.benchmarks.framework.options import add_run_options
from training.config_files import config_file

if TYPE_CHECKING:  # the heavy modules (torch, mlflow, the protocols) load only once the arguments are checked
    from mlflow import MlflowClient

    from apps.benchmarks.card import Card, CardResult

USAGE = "make card MODEL=<run id | models:/<name>/<version> | models:/<name>@<alias>> [CARD=<yaml>] [ARGS=...]"
DEFAULT_CARD = config_file("card.yaml")
DESCRIPTION_LIMIT = 5000
"""Longest model-version description MLflow's SQL stores keep."""
CARD_END = "<!-- model card: end -->"
"""Closes the card at the start of a version's description, so a new card replaces the old one and nothing else.
The card opens with its title line (:data:`CARD_TITLE`), the line MLflow's version list shows; a marker there
would be all the list shows."""
CARD_TITLE = "# Model card: "
LEGACY_START = "<!-- model card: start -->"
"""The opening marker of cards written before the title opened them, removed when a new card replaces one."""

log = logging.getLogger(__name__)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="make card", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=None, help="run id | models:/name/N | models:/name@alias")
    parser.add_argument("--card", default=str(DEFAULT_CARD), help="the card's YAML (default: configs/card.yaml)")
    add_run_options(parser)
    return parser.parse_args(argv)


def model_problem(model: str | None) -> str | None:
    """Why ``model`` cannot name a run to hold the card, from its text alone (before anything heavy loads)."""
    if not model or not model.strip():
        return f"MODEL (--model) is required; usage: {USAGE}"
    prefix, colon, _ = model.strip().partition(":")
    if colon and prefix not in ("run", "models"):  # a bare run id has no prefix; clip: and the like have no run
        return f"{model!r} has no run to hold the card: name a platform run or a registered version"
    return None


def model_run(model: str, client: MlflowClient):
    """The model's MLflow run and, for ``models:/...``, ``(name, version)``; the card is logged there.

    Raises:
        BadInput: a run / version the store does not have, or one not FINISHED.
    """
    from mlflow.exceptions import MlflowException

    from apps.benchmarks.framework.protocol import BadInput
    from training.run_lookup import MODEL_URI, resolve_run

    try:
        run_id, version = resolve_run(model, client)
        run = client.get_run(run_id)
    except MlflowException as error:
        raise BadInput(f"model {model!r}: no run {run_id!r} in {client.tracking_uri}") from error
    except ValueError as error:  # a malformed models:/ URI
        raise BadInput(f"model {error}") from error
    if run.info.status != "FINISHED":
        raise BadInput(f"model {model!r}: run {run_id} is {run.info.status}, not FINISHED (no tested checkpoint)")
    registered = (MODEL_URI.match(model.strip())["name"], version) if version else None
    return run, registered


def build(card: Card, model: str, uri: str, args: argparse.Namespace) -> CardResult:
    """Every benchmark of the card on ``model`` (each logged as ``make benchmark`` logs it), as card rows."""
    from apps.benchmarks.card import CardResult, data_problem, na_rows, not_run_row, protocol_cell, result_rows, unmet
    from apps.benchmarks.cli import record
    from apps.benchmarks.framework.catalog import load_protocol
    from apps.benchmarks.framework.protocol import BadInput
    from apps.benchmarks.framework.runner import draw_subsets, load_model, run_benchmark
    from training.errors import UserError

    result = CardResult(model, [])
    for entry in card.entries:
        started = time.perf_counter()
        protocol = load_protocol(entry.name, args.config_dir)
        version = entry.version or protocol.default_version
        problem = data_problem(entry, card.path)
        if problem:
            result.rows.append(not_run_row(entry, version, problem))
            continue
        try:
            draw = draw_subsets(protocol, entry.data, version)
            cell = protocol_cell(entry.name, version, draw.test.fingerprint)
            encoder = load_model(protocol, model, uri)
            reasons = unmet(entry, encoder)
            if len(reasons) == len(entry.methods):  # nothing the model can take: not worth encoding the data
                result.rows += na_rows(entry, cell, reasons)
                continue
            outcome = run_benchmark(protocol, draw, encoder, entry.data, n_boot=args.n_boot,
                                    cache_dir=None if args.no_cache else args.cache_dir, batch_size=args.batch_size)  # fmt: skip
        except (BadInput, UserError) as error:  # data the protocol cannot read: the other benchmarks still run
            result.rows.append(not_run_row(entry, version, str(error)))
            continue
        _, run_id, experiment = record(outcome, model, entry.data, uri, args.artifact_root)
        result.runs[entry.name], result.experiments[entry.name] = run_id, experiment
        result.rows += result_rows(entry, outcome.table, cell, reasons, run_id)
        log.info("card: %s %s in %.0f s (run %s)", entry.name, version, time.perf_counter() - started, run_id)
    return result


def with_card(description: str | None, card: str) -> str:
    """``card`` (which opens with its title line) first, then ``description`` without its old card: the one from
    its title line (or the legacy start marker) to :data:`CARD_END`."""
    block = f"{card.rstrip()}\n{CARD_END}"
    opening = f"(?:^{re.escape(CARD_TITLE)}|{re.escape(LEGACY_START)})"
    kept = re.sub(opening + r".*?" + re.escape(CARD_END), "", description or "", flags=re.S | re.M).strip()
    return f"{block}\n\n{kept}" if kept else block


def publish(client: MlflowClient, run_id: str, registered: tuple[str, str] | None, result: CardResult,
            title: str) -> None:  # fmt: skip
    """``card/card.{md,html,csv}`` in the model's run; the table in the registered version's description."""
    from apps.benchmarks.card import render_html, render_markdown
    from training.tracking.tracked_run import TrackedRun

    markdown = render_markdown(result, title)
    run = TrackedRun(client, run_id)
    run.log_text(markdown, "card/card.md")
    run.log_text(render_html(result, title), "card/card.html")
    run.log_text(result.frame().to_csv(index=False), "card/card.csv")
    if registered is None:
        return
    name, version = registered
    current = client.get_model_version(name, version).description
    description = with_card(current, render_markdown(result, title, note_limit=120))
    if len(description) > DESCRIPTION_LIMIT:  # a long card stays in the run; the description points at it
        description = with_card(
            current, f"# {title}\n\nThe card is too long for a description: runs:/{run_id}/card/card.md"
        )
    client.update_model_version(name, version, description=description)


def run(args: argparse.Namespace) -> None:
    from apps.benchmarks.card import load_card, render_markdown, run_metric_rows
    from evaluation.headline import logged_headline
    from training.tracking.uri import resolve_tracking_uri, tracking_client

    started = time.perf_counter()
    uri = args.tracking_uri or resolve_tracking_uri()
    client = tracking_client(uri)
    source, registered = model_run(args.model, client)  # the store answers before the protocols' modules load
    card = load_card(args.card, args.config_dir)  # checked against the protocols before any benchmark runs
    run_id = source.info.run_id
    task = str(source.data.params.get("task.name", "?"))
    result = build(card, args.model.strip(), uri, args)
    result.rows += run_metric_rows(card.run_metrics, source.data.metrics, task, logged_headline(source.data.params))
    named = "" if args.model.strip() == run_id else f"{args.model.strip()}, "
    title = f"{CARD_TITLE[2:]}{named}run {run_id} (task {task})"
    publish(client, run_id, registered, result, title)
    print(render_markdown(result, title))
    where = f"; version {registered[1]} of {registered[0]} described" if registered else ""
    print(f"Logged card/card.md, card.html, card.csv to run {run_id}{where} ({uri}); "
          f"{time.perf_counter() - started:.1f} s")  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    args = parse_args(argv)
    problem = model_problem(args.model)
    if problem:  # answered before torch, mlflow and the protocols load
        print(f"make card: {problem}", file=sys.stderr)
        return 2
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")  # keep the printed card readable
    from apps.benchmarks.framework.protocol import BadInput
    from training.errors import UserError

    try:
        run(args)
    except (BadInput, UserError) as error:
        print(f"make card: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
