"""Entry point of ``make benchmark NAME=<name> MODEL=<model> DATA_ROOT=<folder> [VERSION=<version>]``.

Without a name it lists the protocols of ``configs/benchmark/``. With one, it runs that protocol through the
shared runner (:mod:`apps.benchmarks.framework.runner`), prints the report and logs one MLflow run in experiment
``benchmark-<name>`` (:mod:`apps.benchmarks.framework.tracking`). A mistyped name, version, data root or model is
one line on stderr and exit status 2, never a traceback.

    python -m apps.benchmarks.cli --name pneumonia --model clip:ViT-B-32 --data-root ../shared/data/kermany-dev
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from pathlib import Path

from apps.benchmarks.framework.catalog import CONFIG_DIR, available, load_protocol
from apps.benchmarks.framework.embeddings import DEFAULT_CACHE_DIR
from apps.benchmarks.framework.protocol import BadInput
from apps.benchmarks.framework.report import render_report
from apps.benchmarks.framework.runner import BenchmarkResult, draw_subsets, load_model, run_benchmark
from apps.benchmarks.framework.tracking import experiment_id, log_run
from training.tracking.uri import DEFAULT_TRACKING_URI, resolve_tracking_uri, tracking_client

DEFAULT_ARTIFACT_ROOT = "mlruns/artifacts"
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


def add_run_options(parser: argparse.ArgumentParser) -> None:
    """How a benchmark is run and where it is logged: shared by ``make benchmark`` and ``make card``, so the two
    run a protocol the same way."""
    parser.add_argument("--n-boot", type=int, default=1000, help="bootstrap resamples (the protocols': 1000)")
    parser.add_argument("--batch-size", type=int, default=64, help="images per forward pass")
    parser.add_argument("--cache-dir", default=DEFAULT_CACHE_DIR, help="embedding cache folder")
    parser.add_argument("--no-cache", action="store_true", help="encode again and store nothing")
    parser.add_argument("--tracking-uri", default=None, help=f"default: $MLFLOW_TRACKING_URI or {DEFAULT_TRACKING_URI}")
    parser.add_argument("--artifact-root", default=DEFAULT_ARTIFACT_ROOT, help="artifacts of a new local experiment")
    parser.add_argument("--config-dir", default=str(CONFIG_DIR), help="folder of the protocol YAML files")


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
    protocol = load_protocol(args.name, args.config_dir)
    missing = [flag for flag, value in (("MODEL (--model)", args.model), ("DATA_ROOT (--data-root)", args.data_root))
               if not value]  # fmt: skip
    if missing:
        raise BadInput(f"benchmark {args.name} needs {' and '.join(missing)}; usage: {USAGE}")
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
