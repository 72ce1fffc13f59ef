"""Entry point of ``make benchmark NAME=pneumonia MODEL=<model> DATA_ROOT=<folder> [VERSION=full|n100]``.

Draws the protocol's subsets, runs zero-shot and the linear probe, prints the metric table with 95% CIs and
logs one MLflow run in experiment ``benchmark-<name>``: params (model, version, seed, ...), the subset
fingerprints (as params and tags), every metric with its CI, and artifacts ``table.csv``, ``table.md``,
``scores.csv`` (per test image) and ``subsets/{train,test}.csv``. Everything is computed before the run is
created, so a failure never leaves a half-filled run behind.

    python -m evaluation.benchmarks.cli --name pneumonia --model clip:ViT-B-32 --data-root ../shared/data/kermany-dev
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType

from mlflow import MlflowClient
from mlflow.entities import Param

from evaluation.benchmarks import pneumonia
from evaluation.benchmarks.embeddings import DEFAULT_CACHE_DIR
from evaluation.benchmarks.encoders import Encoder, Target
from evaluation.benchmarks.models import load_encoder, model_kind
from evaluation.benchmarks.pneumonia import Subsets
from evaluation.benchmarks.probe import MAX_ITER, C
from evaluation.benchmarks.runner import BenchmarkResult, format_table, run_benchmark
from training.tracking.session import git_commit, log_metric_batch

log = logging.getLogger(__name__)

BENCHMARKS: dict[str, ModuleType] = {"pneumonia": pneumonia}
"""Benchmark name -> protocol module (``NAME``, ``SEED``, ``VERSIONS``, ``LABEL``, prompts, ``build_subsets``)."""
DEFAULT_TRACKING_URI = "sqlite:///mlruns/mlflow.db"
DEFAULT_ARTIFACT_ROOT = "mlruns/artifacts"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="make benchmark", description=__doc__.split("\n\n")[0])
    parser.add_argument("--name", default="pneumonia", choices=sorted(BENCHMARKS), help="benchmark protocol")
    parser.add_argument("--model", required=True, help="run id | models:/name@alias | models:/name/N | clip:<spec>")
    parser.add_argument("--data-root", required=True, help="the data set's release folder")
    parser.add_argument("--version", default="full", help="protocol version (pneumonia: full | n100)")
    parser.add_argument("--n-boot", type=int, default=1000, help="bootstrap resamples (the protocol's: 1000)")
    parser.add_argument("--batch-size", type=int, default=64, help="images per forward pass")
    parser.add_argument("--cache-dir", default=DEFAULT_CACHE_DIR, help="embedding cache folder")
    parser.add_argument("--no-cache", action="store_true", help="encode again and store nothing")
    parser.add_argument("--tracking-uri", default=None, help=f"default: $MLFLOW_TRACKING_URI or {DEFAULT_TRACKING_URI}")
    parser.add_argument("--artifact-root", default=DEFAULT_ARTIFACT_ROOT, help="artifacts of a new local experiment")
    parser.add_argument("--experiment", default=None, help="default: benchmark-<name>")
    return parser.parse_args(argv)


def experiment_id(client: MlflowClient, name: str, uri: str, artifact_root: str) -> str:
    """The experiment's id, creating it with artifacts under ``artifact_root`` when the store is local.

    Same rule as training (``training.tracking.session``): a local store keeps artifacts in
    ``mlruns/artifacts``; a tracking server decides for itself.
    """
    experiment = client.get_experiment_by_name(name)
    if experiment is not None:
        return experiment.experiment_id
    local_store = uri.startswith(("sqlite:", "file:")) or "://" not in uri
    location = Path(artifact_root).resolve().as_uri() if local_store else None
    return client.create_experiment(name, artifact_location=location)


def log_run(
    client: MlflowClient,
    experiment: str,
    args: argparse.Namespace,
    protocol: ModuleType,
    encoder: Encoder,
    subsets: Subsets,
    result: BenchmarkResult,
    report: str,
) -> str:
    """One finished MLflow run holding the benchmark's params, fingerprints, metrics, table and scores."""
    fingerprints = subsets.fingerprints
    tags = {
        "benchmark": protocol.NAME,
        "benchmark.version": args.version,
        "benchmark.train_fingerprint": fingerprints["train"],
        "benchmark.test_fingerprint": fingerprints["test"],
        "model_kind": model_kind(args.model),
        "model_identity": encoder.identity[:5000],
        "zero_shot_available": str(encoder.has_zero_shot).lower(),
        "mlflow.source.git.commit": git_commit(),
    }
    params = {
        "model": args.model, "version": args.version, "seed": protocol.SEED, "n_boot": args.n_boot,
        "data_root": str(Path(args.data_root).resolve()), "train_fingerprint": fingerprints["train"],
        "test_fingerprint": fingerprints["test"], "n_train": len(subsets.train), "n_test": len(subsets.test),
        "train_pool": subsets.pools.get("train"), "test_pool": subsets.pools.get("test"),
        "excluded_train_images": subsets.excluded_images, "probe_C": C, "probe_max_iter": MAX_ITER,
        "zero_shot": encoder.zero_shot_kind if encoder.has_zero_shot else "n/a",
    }  # fmt: skip
    run = client.create_run(experiment, run_name=f"{protocol.NAME}-{args.version}-{args.model}"[:250], tags=tags)
    run_id = run.info.run_id
    try:
        client.log_batch(run_id, params=[Param(key, str(value)[:6000]) for key, value in params.items()])
        log_metric_batch(client, run_id, result.metrics())
        with tempfile.TemporaryDirectory() as tmp:
            folder = Path(tmp)
            (folder / "subsets").mkdir()
            result.table.to_csv(folder / "table.csv", index=False)
            (folder / "table.md").write_text(report)
            result.scores.to_csv(folder / "scores.csv", index=False)
            for name, part in subsets.parts.items():
                part.to_csv(folder / "subsets" / f"{name}.csv", index=False)
            client.log_artifacts(run_id, str(folder))
    except BaseException:
        client.set_terminated(run_id, "FAILED")
        raise
    client.set_terminated(run_id, "FINISHED")
    return run_id


def render_report(protocol: ModuleType, args, encoder: Encoder, subsets: Subsets, result: BenchmarkResult) -> str:
    """The printed (and logged) report: what was measured on which images, the table, the notes."""
    fingerprints = subsets.fingerprints
    counts = {name: part["label"].value_counts().to_dict() for name, part in subsets.parts.items()}
    lines = [
        f"# Benchmark {protocol.NAME} ({args.version})",
        "",
        f"- model: {encoder.description}",
        f"- test: {len(subsets.test)} images ({counts['test'].get(0, 0)} normal / {counts['test'].get(1, 0)} "
        f"pneumonia) of a pool of {subsets.pools.get('test')}, fingerprint {fingerprints['test']}",
        f"- train (probe): {len(subsets.train)} images ({counts['train'].get(0, 0)} normal / "
        f"{counts['train'].get(1, 0)} pneumonia) of a pool of {subsets.pools.get('train')} after the leakage rule "
        f"removed {subsets.excluded_images} image(s) of {len(subsets.excluded_patients)} test patient(s), "
        f"fingerprint {fingerprints['train']}",
        f"- draw seed {protocol.SEED}; {args.n_boot} bootstrap resamples stratified by label, 95% percentile CI",
        "",
        format_table(result.table),
        "",
        *[f"- {note}" for note in result.notes],
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    args = parse_args(argv)
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")  # keep the printed report readable
    protocol = BENCHMARKS[args.name]
    if args.version not in protocol.VERSIONS:
        raise SystemExit(
            f"unknown version {args.version!r} for {args.name}; choose one of {', '.join(protocol.VERSIONS)}"
        )
    uri = args.tracking_uri or os.environ.get("MLFLOW_TRACKING_URI") or DEFAULT_TRACKING_URI
    started = time.perf_counter()
    subsets = protocol.build_subsets(args.data_root, args.version)
    target = Target(protocol.LABEL, protocol.POSITIVE_PROMPT, protocol.NEGATIVE_PROMPT)
    encoder = load_encoder(args.model, target, uri, seed=protocol.SEED)
    result = run_benchmark(
        encoder, subsets, args.data_root, n_boot=args.n_boot, seed=protocol.SEED,
        cache_dir=None if args.no_cache else args.cache_dir, batch_size=args.batch_size,
    )  # fmt: skip
    used = [name for name, hit in result.cache_hits.items() if hit]
    result.notes.append(f"embeddings from the cache: {', '.join(used) if used else 'none (computed now)'}")
    report = render_report(protocol, args, encoder, subsets, result)
    client = MlflowClient(uri)
    experiment = experiment_id(client, args.experiment or f"benchmark-{protocol.NAME}", uri, args.artifact_root)
    run_id = log_run(client, experiment, args, protocol, encoder, subsets, result, report)
    print(report)
    print(f"MLflow run {run_id} (experiment {args.experiment or f'benchmark-{protocol.NAME}'}, {uri}); "
          f"{time.perf_counter() - started:.1f} s")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
