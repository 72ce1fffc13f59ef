"""The shared runner: any protocol, any model, the same steps.

Draw the subsets, load one encoder answering all the protocol's targets, encode every image column once
(cached on disk), let the protocol predict, bootstrap its metrics, then ask for its extras. The runner is
independent of where the results go: it returns a :class:`BenchmarkResult`, which
:mod:`apps.benchmarks.framework.report` prints and :mod:`apps.benchmarks.framework.tracking` logs.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from apps.benchmarks.framework.embeddings import DEFAULT_CACHE_DIR, encode_subset
from apps.benchmarks.framework.encoders import Encoded, Encoder
from apps.benchmarks.framework.models import load_encoder
from apps.benchmarks.framework.protocol import (
    BOOTSTRAPS,
    BadInput,
    Draw,
    Extras,
    Features,
    Prediction,
    Protocol,
    Targets,
)
from evaluation.bootstrap import percentile_ci

TABLE_COLUMNS = ["protocol", "metric", "value", "ci_low", "ci_high"]
"""Columns of the metric table (``table.csv``); ``protocol`` holds the method key (zero_shot, probe)."""


@dataclass
class BenchmarkResult:
    """What one benchmark run produced.

    Attributes:
        table: one row per (method, metric): :data:`TABLE_COLUMNS`.
        scores: one row per test item, from the protocol's methods.
        params: the draw's and the methods' facts, logged as MLflow params.
        cache_hits: subset name -> whether all its encoder outputs came from the cache.
    """

    protocol: Protocol
    draw: Draw
    encoder: Encoder
    table: pd.DataFrame
    scores: pd.DataFrame
    n_boot: int
    notes: list[str] = field(default_factory=list)
    params: dict[str, Any] = field(default_factory=dict)
    cache_hits: dict[str, bool] = field(default_factory=dict)
    extras: Extras = field(default_factory=Extras)

    def metrics(self) -> dict[str, float]:
        """Flat ``<method>/<metric>`` (+ ``_ci_low`` / ``_ci_high``) for MLflow, then the protocol's extra
        metrics; missing methods and NaN extras left out."""
        out = table_metrics(self.table)
        out.update({key: float(value) for key, value in self.extras.metrics.items() if np.isfinite(value)})
        return out


def table_metrics(table: pd.DataFrame) -> dict[str, float]:
    """The metric table as flat MLflow metrics (rows without a value left out)."""
    out = {}
    for row in table.dropna(subset=["value"]).itertuples():
        key = f"{row.protocol}/{row.metric}"
        out.update({key: row.value, f"{key}_ci_low": row.ci_low, f"{key}_ci_high": row.ci_high})
    return out


def draw_subsets(protocol: Protocol, root: str | Path, version: str | None = None) -> Draw:
    """The protocol's subsets of ``version`` (default: its first) on the data under ``root``.

    Raises:
        BadInput: an unknown version, a missing data root, or data the protocol cannot read.
    """
    version = version or protocol.default_version
    if version not in protocol.versions:
        raise BadInput(f"unknown version {version!r} of benchmark {protocol.name}; "
                       f"choose one of {', '.join(protocol.versions)}")  # fmt: skip
    if not Path(root).is_dir():
        raise BadInput(f"data root {root} is not a folder (benchmark {protocol.name} reads its data set there)")
    try:
        return protocol.draw(Path(root), version)
    except BadInput:
        raise
    except ValueError as error:  # the folder does not hold the data set the protocol expects
        raise BadInput(f"benchmark {protocol.name} cannot use data root {root}: {error}") from error


def load_model(protocol: Protocol, spec: str, tracking_uri: str) -> Encoder:
    """The model ``spec`` names, answering all the protocol's targets; seeded with the protocol's seed.

    Raises:
        BadInput: an unknown model kind, or a run / model version the store does not have.
    """
    try:
        return load_encoder(spec, protocol.targets, tracking_uri, seed=protocol.seed)
    except (ValueError, LookupError) as error:
        raise BadInput(f"model {spec!r}: {error}") from error


def encode_draw(
    draw: Draw,
    encoder: Encoder,
    root: str | Path,
    cache_dir: str | Path | None = DEFAULT_CACHE_DIR,
    batch_size: int = 64,
) -> tuple[Features, dict[str, bool]]:
    """Every image column of every subset through the encoder, once; returns the features and per-subset cache hits.

    A column other than ``path`` (a pair's ``prior_path``) gets its own cache entry, keyed by the subset
    fingerprint and the column name.
    """
    encoded: dict[tuple[str, str], Encoded] = {}
    hits: dict[str, bool] = {}
    for name, subset in draw.subsets.items():
        fingerprint, hits[name] = subset.fingerprint, True
        for column in subset.images:
            table = pd.DataFrame({"image_id": subset.ids, "path": subset.table[column].tolist()})
            key = fingerprint if column == "path" else f"{fingerprint}:{column}"
            encoded[(name, column)], hit = encode_subset(encoder, root, table, key, cache_dir, batch_size)
            hits[name] = hits[name] and hit
    return Features(encoded, encoder.target_labels, cache_dir), hits


def bootstrap_scores(
    protocol: Protocol,
    truth: Targets,
    methods: Mapping[str, Prediction | None],
    n_boot: int = 1000,
    ci: float = 0.95,
) -> pd.DataFrame:
    """Point values and percentile CIs of every metric of every method, on shared (paired) resamples.

    Resamples come from the protocol's bootstrap kind with the protocol's seed, resample ``b`` from its own
    generator (``evaluation.bootstrap.resample_generator``); a method without answers gets NaN rows.
    """
    resample = BOOTSTRAPS[protocol.bootstrap][1]
    resamples = resample(truth, n_boot, protocol.seed) if n_boot > 0 else np.empty((0, len(truth)), int)
    rows = []
    for method, prediction in methods.items():
        if prediction is None:
            rows += [dict(zip(TABLE_COLUMNS, (method, metric, np.nan, np.nan, np.nan), strict=True))
                     for metric in protocol.metrics]  # fmt: skip
            continue
        point = protocol.score(truth, prediction)
        replicates = pd.DataFrame([protocol.score(truth.take(idx), prediction.take(idx)) for idx in resamples])
        for metric in protocol.metrics:
            low, high = percentile_ci(replicates[metric].to_numpy(), ci) if n_boot > 0 else (np.nan, np.nan)
            rows.append(dict(zip(TABLE_COLUMNS, (method, metric, point[metric], low, high), strict=True)))
    return pd.DataFrame(rows, columns=TABLE_COLUMNS)


def check_extras(protocol: Protocol, extras: Extras, table: pd.DataFrame) -> None:
    """Refuse extras that would overwrite the run's own artifacts or metrics, before any MLflow run exists."""
    reserved = {"table", "scores"}
    for kind, names in (("table", extras.tables), ("figure", extras.figures)):
        clashes = [n for n in names if n in reserved or n.startswith("subsets/") or not n or n.startswith("/")]
        if clashes:
            raise ValueError(f"{protocol.name}: extra {kind} name(s) {clashes} clash with the run's own artifacts")
    clashes = sorted(set(extras.metrics) & set(table_metrics(table)))
    if clashes:
        raise ValueError(f"{protocol.name}: extra metric(s) {clashes} clash with the table's")


def run_benchmark(
    protocol: Protocol,
    draw: Draw,
    encoder: Encoder,
    root: str | Path,
    n_boot: int = 1000,
    cache_dir: str | Path | None = DEFAULT_CACHE_DIR,
    batch_size: int = 64,
) -> BenchmarkResult:
    """Encode the draw (cached), let the protocol answer, score the answers with bootstrap intervals.

    ``root`` is the data root the subsets' image paths are relative to; ``cache_dir=None``: no cache.
    """
    missing = [t.label for t in protocol.targets if t.label not in encoder.target_labels]
    if missing:
        raise ValueError(f"{protocol.name}: the encoder does not answer target(s) {missing}")
    features, hits = encode_draw(draw, encoder, root, cache_dir, batch_size)
    outcome = protocol.predict(draw, encoder, features)
    if list(outcome.methods) != list(protocol.methods):
        raise ValueError(
            f"{protocol.name}: predict answered {list(outcome.methods)}, its methods are {list(protocol.methods)}"
        )
    table = bootstrap_scores(protocol, draw.test.targets, outcome.methods, n_boot)
    extras = protocol.extras(draw, outcome, table, n_boot)
    check_extras(protocol, extras, table)
    used = [name for name, hit in hits.items() if hit]
    notes = [*outcome.notes, f"embeddings from the cache: {', '.join(used) if used else 'none (computed now)'}"]
    params = {**draw.params, **outcome.params}
    return BenchmarkResult(protocol, draw, encoder, table, outcome.scores, n_boot, notes, params, hits, extras)
