"""How a benchmark is run and where it is logged, as command-line options shared by ``make benchmark`` and
``make card`` (so the two run a protocol the same way).

A module of its own, importing nothing heavy, so an entry point can parse and check its arguments before torch,
mlflow and the protocols load (a missing ``MODEL`` is answered at once).
"""

from __future__ import annotations

import argparse

from training.config_files import config_file
from training.tracking.uri import DEFAULT_TRACKING_URI

DEFAULT_CACHE_DIR = "data/cache/benchmarks"
"""The model-output cache (embeddings, heatmap scores): the project's git-ignored ``data/cache``."""
DEFAULT_ARTIFACT_ROOT = "mlruns/artifacts"
CONFIG_DIR = config_file("benchmark")


def add_run_options(parser: argparse.ArgumentParser) -> None:
    """The options of a benchmark run, on ``parser``."""
    parser.add_argument("--n-boot", type=int, default=1000, help="bootstrap resamples (the protocols': 1000)")
    parser.add_argument("--batch-size", type=int, default=64, help="images per forward pass")
    parser.add_argument("--cache-dir", default=DEFAULT_CACHE_DIR, help="model-output cache folder")
    parser.add_argument("--no-cache", action="store_true", help="compute again and store nothing")
    parser.add_argument("--tracking-uri", default=None, help=f"default: $MLFLOW_TRACKING_URI or {DEFAULT_TRACKING_URI}")
    parser.add_argument("--artifact-root", default=DEFAULT_ARTIFACT_ROOT, help="artifacts of a new local experiment")
    parser.add_argument("--config-dir", default=str(CONFIG_DIR), help="folder of the protocol YAML files")
