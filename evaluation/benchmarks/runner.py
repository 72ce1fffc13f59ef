"""Both protocols on one model: zero-shot (nothing trained) and the linear probe, scored with bootstrap CIs.

The runner is independent of where the results go: it returns the metric table, the per-image scores and the
notes a reader needs (why a protocol is missing, whether the probe converged); :mod:`evaluation.benchmarks.cli`
prints and logs them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from evaluation.benchmarks.embeddings import DEFAULT_CACHE_DIR, encode_subset
from evaluation.benchmarks.encoders import Encoder
from evaluation.benchmarks.metrics import METRICS, bootstrap_table
from evaluation.benchmarks.pneumonia import Subsets
from evaluation.benchmarks.probe import fit_probe, probe_probabilities

PROTOCOLS = {"zero_shot": "Zero-shot", "probe": "Linear probe"}
"""Protocol key (metric prefix in MLflow) -> column title."""
PROBE_THRESHOLD = 0.5


@dataclass
class BenchmarkResult:
    """What one benchmark run produced.

    Attributes:
        table: one row per (protocol, metric): ``protocol``, ``metric``, ``value``, ``ci_low``, ``ci_high``.
        scores: one row per test image: ids, label, each protocol's score and decision.
        notes: lines for the reader (missing zero-shot, probe convergence, leakage exclusions, cache use).
        cache_hits: subset name -> whether its embeddings came from the cache.
    """

    table: pd.DataFrame
    scores: pd.DataFrame
    notes: list[str] = field(default_factory=list)
    cache_hits: dict[str, bool] = field(default_factory=dict)

    def metrics(self) -> dict[str, float]:
        """Flat ``<protocol>/<metric>`` (+ ``_ci_low`` / ``_ci_high``) for MLflow; missing protocols left out."""
        out = {}
        for row in self.table.dropna(subset=["value"]).itertuples():
            key = f"{row.protocol}/{row.metric}"
            out.update({key: row.value, f"{key}_ci_low": row.ci_low, f"{key}_ci_high": row.ci_high})
        return out


def run_benchmark(
    encoder: Encoder,
    subsets: Subsets,
    root: str | Path,
    n_boot: int = 1000,
    seed: int = 0,
    cache_dir: str | Path | None = DEFAULT_CACHE_DIR,
    batch_size: int = 64,
) -> BenchmarkResult:
    """Encode both subsets (cached), score the test images both ways, bootstrap the metrics.

    Args:
        encoder: the model.
        subsets: the protocol's drawn train and test images.
        root: the data root the subsets' paths are relative to.
        n_boot: bootstrap resamples (1,000 in the protocol).
        seed: bootstrap seed.
        cache_dir: embedding cache folder (``None``: no cache).
        batch_size: images per forward pass.
    """
    fingerprints = subsets.fingerprints
    encoded, hits = {}, {}
    for name, part in subsets.parts.items():
        encoded[name], hits[name] = encode_subset(encoder, root, part, fingerprints[name], cache_dir, batch_size)
    test = subsets.test
    labels = test["label"].to_numpy().astype(int)
    scores = test[["image_id", "path", "patient_id", "label"]].copy()
    notes = []

    zero_shot = None
    if encoder.has_zero_shot:
        zs = encoded["test"].zero_shot  # (N,)
        zero_shot = (zs, zs > encoder.decision_threshold)
        scores["zero_shot_score"], scores["zero_shot_pneumonia"] = zs, (zs > encoder.decision_threshold).astype(int)
        notes.append(f"zero-shot score: {encoder.zero_shot_kind}, pneumonia when above {encoder.decision_threshold:g}")
    else:
        notes.append(f"zero-shot: not available: {encoder.zero_shot_note}")

    probe, converged = fit_probe(encoded["train"].embeddings, subsets.train["label"].to_numpy())
    probs = probe_probabilities(probe, encoded["test"].embeddings)  # (N,)
    scores["probe_probability"], scores["probe_pneumonia"] = probs, (probs > PROBE_THRESHOLD).astype(int)
    dim = encoded["train"].embeddings.shape[1]
    notes.append(f"probe: logistic regression on {dim}-d standardised embeddings of {len(subsets.train)} "
                 f"training images{'' if converged else ' (lbfgs did NOT converge within max_iter)'}")  # fmt: skip

    table = bootstrap_table(
        labels, {"zero_shot": zero_shot, "probe": (probs, probs > PROBE_THRESHOLD)}, n_boot=n_boot, seed=seed
    )
    return BenchmarkResult(table, scores, notes, hits)


def format_table(table: pd.DataFrame, digits: int = 3) -> str:
    """Markdown table: one row per metric, one column per protocol, ``value [low, high]`` (``n/a`` if missing)."""

    def cell(row) -> str:
        if not np.isfinite(row.value):
            return "n/a"
        if not (np.isfinite(row.ci_low) and np.isfinite(row.ci_high)):
            return f"{row.value:.{digits}f}"
        return f"{row.value:.{digits}f} [{row.ci_low:.{digits}f}, {row.ci_high:.{digits}f}]"

    cells = {(row.protocol, row.metric): cell(row) for row in table.itertuples()}
    header = "| metric (95% CI) | " + " | ".join(PROTOCOLS.values()) + " |"
    lines = [header, "|---" * (len(PROTOCOLS) + 1) + "|"]
    for metric, title in METRICS.items():
        lines.append(f"| {title} | " + " | ".join(cells.get((p, metric), "n/a") for p in PROTOCOLS) + " |")
    return "\n".join(lines)
