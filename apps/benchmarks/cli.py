"""Entry point of ``make benchmark NAME=<name> MODEL=<model> DATA_ROOT=<folder> [VERSION=<version>]``.

Without a name it lists the protocols of ``configs/benchmark/``; with one, it runs that protocol through the
shared runner, prints the report and logs one MLflow run in ``benchmark-<name>``. A mistyped argument is one line
on stderr and exit status 2, never a traceback. Listing and argument errors are answered from the protocols'
YAML alone; the heavy modules are imported only once the arguments are complete.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from apps.benchmarks.framework.bad_input import BadInput
from apps.benchmarks.framework.catalog import CONFIG_DIR, available, load_protocol
from apps.benchmarks.framework.options import DEFAULT_ARTIFACT_ROOT, add_run_options
from training.tracking.uri import resolve_tracking_uri

if TYPE_CHECKING:
    from apps.benchmarks.framework.runner import BenchmarkResult

USAGE = ("make benchmark NAME=<name> MODEL=<run id | models:/<name>@<alias> | models:/<name>/<version> | "
         "clip:<open_clip model>[:<pretrained>]> DATA_ROOT=<folder> [VERSION=<version>] [ARGS=...]")  # fmt: skip


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="make benchmark", description=__doc__.split("\n\n")[0])
    parser.add_argument("--name", default=None, help="benchmark protocol; without it, list the protocols")
    parser.add_argument("--model", default=None, help="run id | models:/name@alias | models:/name/N | clip:<spec>")
    parser.add_argument("--data-root", default=None, help="the data set's release folder")
    parser.add_argument("--version", default=None, help="protocol version (default: the protocol's first)")
    add_run_options(parser)
    parser.add_argument("--experiment", default=None, help="default: benchmark-<name>")
    return parser.parse_args(argv)


def listing(folder: str) -> str:
    """The protocols found in ``folder``, one line each, and how to run one."""
    protocols = available(folder)
    width = max((len(name) for name in protocols), default=0)
    where = "configs/benchmark/" if Path(folder).resolve() == CONFIG_DIR else folder
    lines = [f"Benchmark protocols ({where}):"]
    lines += [f"  {name:<{width}}  {line}" for name, line in protocols.items()] or ["  (none)"]
    return "\n".join([*lines, "", f"Run one: {USAGE}"])


def run(args: argparse.Namespace) -> None:
    """Draw, load, run, then log and print: everything is computed before the MLflow run is created."""
    uri = args.tracking_uri or resolve_tracking_uri()
    started = time.perf_counter()
    missing = [flag for flag, value in (("MODEL (--model)", args.model), ("DATA_ROOT (--data-root)", args.data_root))
               if not value]  # fmt: skip
    if missing and args.name in available(args.config_dir):  # from the YAML: before the protocol's module loads
        raise BadInput(f"benchmark {args.name} needs {' and '.join(missing)}; usage: {USAGE}")
    protocol = load_protocol(args.name, args.config_dir)  # an unknown name is refused before anything is imported
    from apps.benchmarks.framework.runner import draw_subsets, load_model, run_benchmark

    draw = draw_subsets(protocol, args.data_root, args.version)
    encoder = load_model(protocol, args.model, uri)
    result = run_benchmark(
        protocol, draw, encoder, args.data_root, n_boot=args.n_boot,
        cache_dir=None if args.no_cache else args.cache_dir, batch_size=args.batch_size,
    )  # fmt: skip
    report, run_id, experiment = record(result, args.model, args.data_root, uri, args.artifact_root, args.experiment)
    print(report)
    print(f"MLflow run {run_id} (experiment {experiment}, {uri}); {time.perf_counter() - started:.1f} s")


def record(result: BenchmarkResult, model: str, data_root: str, uri: str, artifact_root: str = DEFAULT_ARTIFACT_ROOT,
           experiment: str | None = None) -> tuple[str, str, str]:  # fmt: skip
    """The report of ``result`` and its MLflow run in ``experiment`` (default ``benchmark-<name>``), exactly as
    ``make benchmark`` logs it, so ``make card`` records each benchmark the same way; returns (report, run id,
    experiment)."""
    from apps.benchmarks.framework.report import render_report
    from apps.benchmarks.framework.tracking import experiment_id, log_run
    from training.tracking.uri import tracking_client

    report = render_report(result)
    client = tracking_client(uri)
    experiment = experiment or f"benchmark-{result.protocol.name}"
    run_id = log_run(client, experiment_id(client, experiment, uri, artifact_root), result, model, data_root, report)
    return report, run_id, experiment


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    args = parse_args(argv)
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")  # keep the printed report readable
    if not args.name:
        print(listing(args.config_dir))
        return 0
    try:
        run(args)
    except BadInput as error:
        print(f"make benchmark: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
