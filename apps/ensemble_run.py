"""What ``make ensemble`` does once its arguments passed (:mod:`apps.ensemble_cli`): read the members' stored
predictions, fit the weighting on validation, score it with the suite and log it as a run.

The test numbers are reported, never used for fitting: they say whether the weights that won on validation
still win on images they were not chosen on.
"""

from __future__ import annotations

import json
import logging
import tempfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from hydra.utils import instantiate
from mlflow import MlflowClient
from mlflow.exceptions import MlflowException
from omegaconf import OmegaConf

from apps.ensemble import (
    KIND_TAG,
    WEIGHTS_ARTIFACT,
    EnsembleError,
    MeanWeights,
    SplitPredictions,
    StoredEnsemble,
    align,
    combine,
    read_split,
)
from evaluation.suite import compute_suite
from training.config_files import config_file, option_names
from training.runs import ModelNotFound, read_config, resolve_run
from training.tracking.artifacts import download
from training.tracking.tracked_run import TrackedRun, ensure_experiment

log = logging.getLogger(__name__)

CONFIGS = config_file("ensemble")
ARTIFACT_ROOT = "mlruns/artifacts"  # configs/tracking/mlflow.yaml, for an experiment this command creates
SPLITS = ("val", "test")


def build_weighting(name: str):
    """The weighting of ``configs/ensemble/<name>.yaml`` (its ``_target_`` and arguments; ``name`` is metadata)."""
    if name not in option_names("ensemble"):
        raise EnsembleError(f"no weighting {name!r}; choose one of {option_names('ensemble')} (configs/ensemble/)")
    cfg = OmegaConf.load(CONFIGS / f"{name}.yaml")
    return instantiate({key: value for key, value in OmegaConf.to_container(cfg).items() if key != "name"})


def member_labels(client: MlflowClient, run_id: str, task: str, folder: str) -> list[str]:
    """The labels run ``run_id`` predicts, from its checked config; a run of another task is refused."""
    run = client.get_run(run_id)
    if run.info.status != "FINISHED":
        raise EnsembleError(f"run {run_id} is {run.info.status}; only a finished run has stored predictions")
    cfg = read_config(client, run_id, folder)
    if str(cfg.task.name) != task:
        raise EnsembleError(f"run {run_id} is a run of task {cfg.task.name}, not {task}")
    return [str(name) for name in cfg.task.labels]


def read_members(client: MlflowClient, run_ids: Sequence[str], task: str
                 ) -> tuple[list[str], dict[str, tuple[np.ndarray, np.ndarray]]]:  # fmt: skip
    """The shared labels and, per split, the aligned ``(K, N, C)`` probabilities and ``(N, C)`` targets."""
    per_split: dict[str, list[SplitPredictions]] = {split: [] for split in SPLITS}
    labels: list[str] | None = None
    with tempfile.TemporaryDirectory() as tmp:
        for index, run_id in enumerate(run_ids):
            folder = Path(tmp) / str(index)
            folder.mkdir()
            try:
                own = member_labels(client, run_id, task, str(folder))
            except MlflowException as error:
                raise ModelNotFound(f"run {run_id}: {error.message}") from None
            if labels is None:
                labels = own
            elif own != labels:
                raise EnsembleError(f"run {run_id} predicts other labels than run {run_ids[0]}: "
                                    f"{sorted(set(own) ^ set(labels))[:5]} differ (or their order)")  # fmt: skip
            for split in SPLITS:
                try:
                    path = download(client, run_id, f"predictions/{split}.csv", str(folder))
                except (MlflowException, OSError):
                    raise EnsembleError(f"run {run_id} has no predictions/{split}.csv to fit or check weights on; "
                                        f"make evaluate RUN={run_id} writes it") from None  # fmt: skip
                per_split[split].append(read_split(path, run_id, labels, split))
    return labels, {split: align(members, split) for split, members in per_split.items()}


def suite_map(targets: np.ndarray, probs: np.ndarray, labels: Sequence[str]) -> float:
    """mAP exactly as a training run logs ``test/mAP`` (the suite's point estimate; no resampling needed)."""
    return float(compute_suite(targets, np.clip(probs, 0.0, 1.0), labels, n_boot=0).metrics["mAP"])


def fit_ensemble(client: MlflowClient, uri: str, task: str, references: Sequence[str], weighting: str,
                 experiment: str | None = None) -> tuple[str, dict[str, float], StoredEnsemble]:  # fmt: skip
    """Fit, score and log one ensemble; returns ``(run id, metrics, stored weights)``."""
    if len(references) < 2:
        raise EnsembleError(f"an ensemble needs at least two members, got {len(references)}")
    try:
        run_ids = [resolve_run(reference, client)[0] for reference in references]
    except ValueError as error:  # a malformed models:/ reference
        raise EnsembleError(str(error)) from None
    if len(set(run_ids)) != len(run_ids):
        raise EnsembleError(f"a member is named twice (run ids {run_ids}); each run can weigh only once")
    labels, splits = read_members(client, run_ids, task)
    val_probs, val_targets = splits["val"]
    weights = build_weighting(weighting).fit(val_probs, val_targets)
    mean = MeanWeights().fit(val_probs, val_targets)
    metrics: dict[str, float] = {}
    for split, (probs, targets) in splits.items():
        metrics[f"ensemble/{split}/mAP_mean"] = suite_map(targets, combine(probs, mean), labels)
        metrics[f"ensemble/{split}/mAP_tuned"] = suite_map(targets, combine(probs, weights), labels)
        for k in range(len(run_ids)):
            metrics[f"ensemble/{split}/mAP_member{k}"] = suite_map(targets, probs[k], labels)
    experiment_ref = ensure_experiment(client, experiment or task, uri, ARTIFACT_ROOT)
    tags = {KIND_TAG[0]: KIND_TAG[1], "task": task, "cxrlt.ensemble.weighting": weighting}
    with TrackedRun.start(client, experiment_ref, f"ensemble-{weighting}-{len(run_ids)}", tags) as run:
        run_id = run.run_id
        stored = StoredEnsemble(run_id, run_ids, labels, weights, weighting)
        params = {"weighting": weighting, "members": " ".join(run_ids), "references": " ".join(references),
                  "n_members": len(run_ids)}  # fmt: skip
        run.log(params=params, tags={"cxrlt.ensemble.members": " ".join(run_ids)},
                metrics={k: v for k, v in metrics.items() if np.isfinite(v)})  # fmt: skip
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / Path(WEIGHTS_ARTIFACT).name
            path.write_text(json.dumps(stored.to_json(), indent=1) + "\n")
            run.log_artifact(path, str(Path(WEIGHTS_ARTIFACT).parent))
    return run_id, metrics, stored


def table(metrics: dict[str, float], stored: StoredEnsemble) -> str:
    """mAP of each member, the mean and the tuned weights on both splits, with each member's mean weight."""
    rows = [(f"member {k} {run_id[:12]}", f"{stored.weights[k].mean():.3f}", f"member{k}")
            for k, run_id in enumerate(stored.members)]  # fmt: skip
    rows += [("plain mean", "", "mean"), (f"tuned ({stored.weighting})", "", "tuned")]
    lines = [f"{'':28} {'weight':>7} {'val mAP':>8} {'test mAP':>8}"]
    for name, weight, key in rows:
        val, test = metrics[f"ensemble/val/mAP_{key}"], metrics[f"ensemble/test/mAP_{key}"]
        lines.append(f"{name:28} {weight:>7} {val:8.4f} {test:8.4f}")
    return "\n".join(lines)
