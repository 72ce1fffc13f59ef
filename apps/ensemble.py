"""Ensemble weights fitted on validation predictions, stored in an MLflow run and reused by ``make submit``.

``make submit`` with several models averages their probabilities. The plain mean treats a weak member like a
strong one; the weightings here (``configs/ensemble/``) instead choose nonnegative weights that sum to one, on
the members' stored validation predictions, to maximise what the challenge ranks by: macro average precision.

- :class:`MeanWeights`: the plain mean, kept as a weighting so that its numbers come out of the same code.
- :class:`PerModelWeights`: one weight per member, shared by every class.
- :class:`PerClassWeights`: one weight vector per class, fitted on that class's AP, then shrunk toward a
  prior weighting by how few labelled validation positives the class has (docs/recipes.md, "Ensemble weights tuned on validation").

AP is piecewise constant in the weights (it only changes when two images swap ranks), so gradients are useless;
the search is a seeded, derivative-free ascent on the simplex (:func:`simplex_ascent`). Everything read back from
a run (predictions, ``ensemble/weights.json``) is untrusted: it is checked and refused with a message naming the
run and what is wrong (:class:`EnsembleError`).

``make ensemble`` (:func:`fit_ensemble`, its command line :mod:`apps.ensemble_cli`) fits a weighting on the
members' stored validation predictions, scores it with the suite and logs it as a run. The test numbers are
reported, never used for fitting: they say whether the weights that won on validation still win on images they
were not chosen on.
"""

from __future__ import annotations

import json
import math
import re
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
from hydra.utils import instantiate
from mlflow import MlflowClient
from mlflow.exceptions import MlflowException
from omegaconf import OmegaConf

from evaluation.metric_registry import average_precision
from evaluation.predictions import PredictionsError, read_predictions
from evaluation.suite import compute_suite
from training.config_files import config_file
from training.errors import UserError
from training.run_lookup import ModelNotFound, resolve_run, split_checkpoint
from training.runs import read_config
from training.top_checkpoints import INDEX, kept_ranks, predictions_artifact
from training.tracking.artifacts import download
from training.tracking.tracked_run import TrackedRun, ensure_experiment

WEIGHTS_ARTIFACT = "ensemble/weights.json"
KIND_TAG = ("cxrlt.kind", "ensemble")
FORMAT = 1
#: A member must be a run of this store, named by its id (hex), never by a path or URI from the file.
RUN_ID = re.compile(r"^[0-9a-zA-Z_-]{1,64}$")
#: A member as stored: a run id, or a run id and one of its kept checkpoints (``<run id>:rank<n>``, n >= 2).
MEMBER = re.compile(r"^[0-9a-zA-Z_-]{1,64}(?::rank(?:[2-9]|[1-9]\d{1,3}))?$")
#: How far a stored weight column may be from summing to one (float round trip through JSON).
SUM_TOLERANCE = 1e-6
CONFIGS = config_file("ensemble")
ARTIFACT_ROOT = "mlruns/artifacts"  # configs/tracking/mlflow.yaml, for an experiment this command creates
SPLITS = ("val", "test")


class EnsembleError(UserError, ValueError):
    """Members that cannot be combined, or stored weights that cannot be trusted; the message names the run."""


# --- the objective -------------------------------------------------------------------------------------------


def class_ap(targets: np.ndarray, scores: np.ndarray) -> float:
    """AP of one class over its labelled rows (target -1 left out); NaN without a positive, as the suite does."""
    known = targets >= 0
    return average_precision(targets[known] == 1, scores[known])


def macro_ap(targets: np.ndarray, probs: np.ndarray) -> float:
    """Mean AP over the classes with a labelled positive: the challenge's mAP (``evaluation.suite``'s rule)."""
    values = [class_ap(targets[:, c], probs[:, c]) for c in range(targets.shape[1])]
    defined = [v for v in values if math.isfinite(v)]
    return float(np.mean(defined)) if defined else float("nan")


def combine(probs: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """``(N, C)`` weighted sum of member probabilities ``(K, N, C)`` with per-class weights ``(K, C)``."""
    return np.einsum("knc,kc->nc", np.asarray(probs, dtype=np.float64), np.asarray(weights, dtype=np.float64))


# --- the search ----------------------------------------------------------------------------------------------

STEPS = (0.5, 0.25, 0.1, 0.05, 0.02, 0.01)


def simplex_ascent(objective: Callable[[np.ndarray], float], k: int, rng: np.random.Generator,
                   n_random: int = 32, steps: Sequence[float] = STEPS,
                   start: np.ndarray | None = None) -> np.ndarray:  # fmt: skip
    """Weights on the ``k``-simplex maximising ``objective``: best of a few seeded starts, then pairwise moves.

    A move shifts ``step`` of weight from one member to another and is kept only when it strictly improves the
    objective, so among equally good weightings the search stays at its start (the uniform mean or ``start``):
    a plateau of AP is no reason to move away from the prior. The starts are ``start`` (else uniform), the
    vertices, and ``n_random`` Dirichlet draws, evaluated in that order with ties kept by the earliest.
    """
    first = np.full(k, 1.0 / k) if start is None else np.asarray(start, dtype=np.float64)
    if k == 1:
        return np.ones(1)
    candidates = [first, *np.eye(k), *rng.dirichlet(np.ones(k), size=n_random)]
    best, best_value = first, _value(objective, first)
    for candidate in candidates[1:]:
        value = _value(objective, candidate)
        if value > best_value:
            best, best_value = candidate, value
    for step in steps:
        improved = True
        while improved:
            improved = False
            for giver in range(k):
                for taker in range(k):
                    if giver == taker or best[giver] <= 0:
                        continue
                    moved = min(step, best[giver])
                    candidate = best.copy()
                    candidate[giver] -= moved
                    candidate[taker] += moved
                    value = _value(objective, candidate)
                    if value > best_value + 1e-12:
                        best, best_value, improved = candidate, value, True
    return np.clip(best, 0.0, None) / np.clip(best, 0.0, None).sum()


def _value(objective: Callable[[np.ndarray], float], weights: np.ndarray) -> float:
    value = objective(weights)
    return value if math.isfinite(value) else -math.inf


# --- the weightings (configs/ensemble/*.yaml) -----------------------------------------------------------------


@dataclass
class MeanWeights:
    """Every member weighs ``1/K`` in every class: ``make submit``'s plain mean."""

    seed: int = 0

    def fit(self, probs: np.ndarray, targets: np.ndarray) -> np.ndarray:
        """``(K, C)`` uniform weights (``probs`` ``(K, N, C)``, ``targets`` ``(N, C)`` are only used for shapes)."""
        k, _, c = probs.shape
        return np.full((k, c), 1.0 / k)


@dataclass
class PerModelWeights:
    """One weight per member maximising validation macro AP; ``K - 1`` free numbers, so hard to overfit."""

    seed: int = 0
    n_random: int = 32

    def fit(self, probs: np.ndarray, targets: np.ndarray) -> np.ndarray:
        """``(K, C)`` weights, every column the same vector."""
        k, _, c = probs.shape
        rng = np.random.default_rng(self.seed)
        vector = simplex_ascent(lambda w: macro_ap(targets, combine(probs, np.repeat(w[:, None], c, axis=1))), k,
                                rng, self.n_random)  # fmt: skip
        return np.repeat(vector[:, None], c, axis=1)


@dataclass
class PerClassWeights:
    """One weight vector per class, each maximising that class's validation AP, then shrunk toward ``prior``.

    A class with ``n`` labelled validation positives keeps ``n / (n + prior_positives)`` of its own fit and takes
    the rest from the prior weighting (``per_model`` or ``mean``): a class seen positive twice would otherwise get
    weights that only sort those two images to the top. A class without a positive gets the prior alone.
    """

    seed: int = 0
    n_random: int = 16
    prior: str = "per_model"
    prior_positives: float = 20.0

    def __post_init__(self) -> None:
        if self.prior not in ("per_model", "mean"):
            raise EnsembleError(f"per_class prior must be per_model or mean, not {self.prior!r}")
        if not math.isfinite(self.prior_positives) or self.prior_positives < 0:
            raise EnsembleError(f"per_class prior_positives must be a number >= 0, not {self.prior_positives!r}")

    def fit(self, probs: np.ndarray, targets: np.ndarray) -> np.ndarray:
        """``(K, C)`` weights, column ``c`` fitted on class ``c`` and shrunk (see the class docstring)."""
        k, _, c = probs.shape
        prior_model = PerModelWeights(self.seed, self.n_random) if self.prior == "per_model" else MeanWeights()
        prior = prior_model.fit(probs, targets)
        weights = prior.copy()
        rng = np.random.default_rng(self.seed)
        for column in range(c):
            positives = int((targets[:, column] == 1).sum())
            if positives == 0:
                continue
            truth, scores = targets[:, column], probs[:, :, column]  # (N,), (K, N)
            own = simplex_ascent(lambda w, t=truth, s=scores: class_ap(t, w @ s), k, rng, self.n_random,
                                 start=prior[:, column])  # fmt: skip
            keep = positives / (positives + self.prior_positives)
            weights[:, column] = keep * own + (1.0 - keep) * prior[:, column]
        return weights / weights.sum(axis=0, keepdims=True)


# --- members' stored predictions ------------------------------------------------------------------------------


@dataclass(frozen=True)
class SplitPredictions:
    """One member's stored predictions on one split: ids, ``(N, C)`` probabilities and ``(N, C)`` targets, and the
    file as read (its other columns, such as each image's source, carry over to the ensemble's own predictions)."""

    run_id: str
    ids: list[str]
    probs: np.ndarray
    targets: np.ndarray
    frame: pd.DataFrame | None = None


def read_split(path: str | Path, run_id: str, labels: Sequence[str], split: str) -> SplitPredictions:
    """A run's ``predictions/<split>.csv``, checked: the label and ``true/`` columns, probabilities in [0, 1],
    targets in {-1, 0, 1}, unique ids."""
    where = f"run {run_id} predictions/{split}.csv"
    try:
        frame = read_predictions(path)
    except PredictionsError as error:
        raise EnsembleError(f"{where}: {error}") from None
    needed = ["image_id", *labels, *(f"true/{name}" for name in labels)]
    missing = [column for column in needed if column not in frame]
    if missing:
        raise EnsembleError(f"{where}: missing column(s) {missing[:5]} (the labels of the first member)")
    ids = frame["image_id"].astype(str)
    if ids.duplicated().any():
        raise EnsembleError(f"{where}: duplicated image_id(s) {ids[ids.duplicated()].unique().tolist()[:5]}")
    probs = frame[list(labels)].apply(pd.to_numeric, errors="coerce").to_numpy(dtype=np.float64)
    if not (np.isfinite(probs) & (probs >= 0) & (probs <= 1)).all():
        raise EnsembleError(f"{where}: a probability is missing, not a number or outside [0, 1]")
    targets = frame[[f"true/{name}" for name in labels]].apply(pd.to_numeric, errors="coerce").to_numpy(float)
    if not np.isin(targets, (-1.0, 0.0, 1.0)).all():
        raise EnsembleError(f"{where}: a true/ cell is not -1, 0 or 1")
    return SplitPredictions(run_id, ids.tolist(), probs, targets, frame)


def align(members: Sequence[SplitPredictions], split: str) -> tuple[np.ndarray, np.ndarray]:
    """``(K, N, C)`` probabilities in the first member's row order and its ``(N, C)`` targets.

    Weights fitted on rows that are not the same images would be fitted to nothing, so every member must hold
    the same ids (any order) with the same targets; the first that does not is named.
    """
    first = members[0]
    position = {image: row for row, image in enumerate(first.ids)}
    stacked = [first.probs]
    for member in members[1:]:
        absent, extra = sorted(set(first.ids) - set(member.ids)), sorted(set(member.ids) - set(first.ids))
        if absent or extra:
            raise EnsembleError(
                f"run {member.run_id} predictions/{split}.csv holds other images than run {first.run_id}: "
                f"{len(absent)} missing (e.g. {absent[:3]}), {len(extra)} extra (e.g. {extra[:3]}); ensemble "
                "members must be evaluated on the same split of the same data"
            )
        order = np.array([position[image] for image in member.ids])
        probs, targets = np.empty_like(member.probs), np.empty_like(member.targets)
        probs[order], targets[order] = member.probs, member.targets
        if not np.array_equal(targets, first.targets):
            row = int(np.argwhere(targets != first.targets)[0][0])
            raise EnsembleError(f"run {member.run_id} predictions/{split}.csv: the true labels of {first.ids[row]!r} "
                                f"differ from run {first.run_id}'s; the members were not trained on the same "
                                "labels")  # fmt: skip
        stacked.append(probs)
    return np.stack(stacked), first.targets


# --- weights.json ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class StoredEnsemble:
    """What ``make submit`` needs from an ensemble run: its members' run ids, labels and ``(K, C)`` weights."""

    run_id: str
    members: list[str]
    labels: list[str]
    weights: np.ndarray
    weighting: str = ""

    def to_json(self) -> dict:
        return {"format": FORMAT, "weighting": self.weighting, "members": self.members, "labels": self.labels,
                "weights": self.weights.tolist()}  # fmt: skip


def parse_weights(document: object, run_id: str) -> StoredEnsemble:
    """Check a ``weights.json`` read back from run ``run_id`` before anything is predicted with it.

    Members are bare run ids (the weights belong to those exact checkpoints, not to whatever an alias points at
    today); labels are distinct strings; weights form a ``(K, C)`` matrix of finite nonnegative numbers whose
    columns sum to one.
    """
    where = f"run {run_id} {WEIGHTS_ARTIFACT}"
    if not isinstance(document, dict):
        raise EnsembleError(f"{where}: expected a JSON object")
    if document.get("format") != FORMAT:
        raise EnsembleError(f"{where}: format {document.get('format')!r} is not {FORMAT}")
    members, labels, weights = document.get("members"), document.get("labels"), document.get("weights")
    if not isinstance(members, list) or not members or not all(isinstance(m, str) and MEMBER.match(m) for m in members):
        raise EnsembleError(f"{where}: 'members' must be a non-empty list of run ids (or <run id>:rank<n>)")
    if len(set(members)) != len(members):
        raise EnsembleError(f"{where}: a member is listed twice")
    if not isinstance(labels, list) or not labels or not all(isinstance(name, str) for name in labels):
        raise EnsembleError(f"{where}: 'labels' must be a non-empty list of class names")
    if len(set(labels)) != len(labels):
        raise EnsembleError(f"{where}: a label is listed twice")
    shape_ok = isinstance(weights, list) and len(weights) == len(members) and all(
        isinstance(row, list) and len(row) == len(labels) for row in weights
    )  # fmt: skip
    if not shape_ok:
        raise EnsembleError(f"{where}: 'weights' must be a {len(members)} x {len(labels)} matrix (members x labels)")
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for row in weights for v in row):
        raise EnsembleError(f"{where}: 'weights' holds something that is not a number")
    matrix = np.asarray(weights, dtype=np.float64)
    if not np.isfinite(matrix).all() or (matrix < 0).any():
        raise EnsembleError(f"{where}: weights must be finite and nonnegative")
    sums = matrix.sum(axis=0)
    if (np.abs(sums - 1.0) > SUM_TOLERANCE).any():
        column = int(np.argmax(np.abs(sums - 1.0)))
        raise EnsembleError(f"{where}: the weights of {labels[column]!r} sum to {sums[column]:.6g}, not 1")
    return StoredEnsemble(run_id, list(members), list(labels), matrix, str(document.get("weighting", "")))


def load_weights(client: MlflowClient, run_id: str, folder: str | Path) -> StoredEnsemble:
    """The checked weights of ensemble run ``run_id`` (``make ensemble``'s output)."""
    if not RUN_ID.match(run_id):
        raise EnsembleError(f"{run_id!r} is not a run id")
    try:
        run = client.get_run(run_id)
    except MlflowException:
        raise EnsembleError(f"no run {run_id!r} in the tracking store {client.tracking_uri}") from None
    if run.data.tags.get(KIND_TAG[0]) != KIND_TAG[1]:
        raise EnsembleError(f"run {run_id} is not an ensemble run (no tag {KIND_TAG[0]}={KIND_TAG[1]}); "
                            "make ensemble writes those")  # fmt: skip
    try:
        path = download(client, run_id, WEIGHTS_ARTIFACT, str(folder))
        document = json.loads(Path(path).read_text())
    except (MlflowException, OSError) as error:
        raise EnsembleError(f"run {run_id} has no readable {WEIGHTS_ARTIFACT}: {error}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise EnsembleError(f"run {run_id} {WEIGHTS_ARTIFACT} is not JSON: {error}") from None
    return parse_weights(document, run_id)


# --- make ensemble's run: fit on validation, score with the suite, log ---------------------------------------


def build_weighting(name: str):
    """The weighting of ``configs/ensemble/<name>.yaml`` (its ``_target_`` and arguments; ``name`` is metadata), a
    name :func:`apps.ensemble_cli.check_arguments` has checked."""
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


def member_name(run_id: str, rank: int) -> str:
    """How a member is stored: the run id for a run's best checkpoint, ``<run id>:rank<n>`` for another it kept."""
    return run_id if rank == 1 else f"{run_id}:rank{rank}"


def kept_count(client: MlflowClient, run_id: str, folder: str) -> int:
    """How many checkpoints run ``run_id`` kept: its checked ``checkpoints/top/index.json``, 1 without one."""
    try:
        path = download(client, run_id, INDEX, folder)
    except (MlflowException, OSError):
        return 1
    try:
        document = json.loads(Path(path).read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise EnsembleError(f"run {run_id} {INDEX} is not JSON: {error}") from None
    return kept_ranks(document, f"run {run_id} {INDEX}")


def expand_members(client: MlflowClient, references: Sequence[str]) -> list[str]:
    """The stored member names of the references, ``<run id>:top<k>`` standing for the run's ``k`` best checkpoints
    (weighted checkpoint ensembling) and ``<run id>:rank<n>`` for one of them."""
    members: list[str] = []
    with tempfile.TemporaryDirectory() as tmp:
        for reference in references:
            try:
                bare, rank, top = split_checkpoint(reference)
                run_id = resolve_run(bare, client)[0]
            except ValueError as error:  # a malformed models:/ or checkpoint reference
                raise EnsembleError(str(error)) from None
            if top is None:
                members.append(member_name(run_id, rank))
                continue
            kept = kept_count(client, run_id, tmp)
            if top > kept:
                raise EnsembleError(f"{reference}: run {run_id} kept {kept} checkpoint(s), not {top} (train with "
                                    f"checkpoint.save_top_k={top} to keep more)")  # fmt: skip
            members += [member_name(run_id, r) for r in range(1, top + 1)]
    return members


def read_members(client: MlflowClient, members: Sequence[str], task: str
                 ) -> tuple[list[str], dict[str, tuple[np.ndarray, np.ndarray]], dict[str, pd.DataFrame]]:  # fmt: skip
    """The shared labels; per split, the aligned ``(K, N, C)`` probabilities and ``(N, C)`` targets; per split, the
    first member's file (the row order of the aligned arrays)."""
    per_split: dict[str, list[SplitPredictions]] = {split: [] for split in SPLITS}
    labels: list[str] | None = None
    with tempfile.TemporaryDirectory() as tmp:
        for index, member in enumerate(members):
            run_id, rank = split_checkpoint(member)[:2]
            folder = Path(tmp) / str(index)
            folder.mkdir()
            try:
                own = member_labels(client, run_id, task, str(folder))
            except MlflowException as error:
                raise ModelNotFound(f"run {run_id}: {error.message}") from None
            if labels is None:
                labels = own
            elif own != labels:
                raise EnsembleError(f"run {member} predicts other labels than run {members[0]}: "
                                    f"{sorted(set(own) ^ set(labels))[:5]} differ (or their order)")  # fmt: skip
            for split in SPLITS:
                artifact = predictions_artifact(rank, split)
                try:
                    path = download(client, run_id, artifact, str(folder))
                except (MlflowException, OSError):
                    remedy = f"make evaluate RUN={run_id} writes it" if rank == 1 else "its training writes it"
                    raise EnsembleError(f"run {run_id} has no {artifact} to fit or check weights on; "
                                        f"{remedy}") from None  # fmt: skip
                per_split[split].append(read_split(path, member, labels, split))
    firsts = {split: members[0].frame for split, members in per_split.items()}
    return labels, {split: align(members, split) for split, members in per_split.items()}, firsts


def suite_map(targets: np.ndarray, probs: np.ndarray, labels: Sequence[str]) -> float:
    """mAP exactly as a training run logs ``test/mAP`` (the suite's point estimate; no resampling needed)."""
    return float(compute_suite(targets, np.clip(probs, 0.0, 1.0), labels, n_boot=0).metrics["mAP"])


def fit_ensemble(client: MlflowClient, uri: str, task: str, references: Sequence[str], weighting: str,
                 experiment: str | None = None) -> tuple[str, dict[str, float], StoredEnsemble]:  # fmt: skip
    """Fit, score and log one ensemble of two or more members (checked by the command line); returns ``(run id,
    metrics, stored weights)``."""
    run_ids = expand_members(client, references)  # members: run ids, or <run id>:rank<n> for a kept checkpoint
    if len(set(run_ids)) != len(run_ids):
        raise EnsembleError(f"a member is named twice (members {run_ids}); each checkpoint can weigh only once")
    if len(run_ids) < 2:
        raise EnsembleError(f"an ensemble needs at least two members, {references} name {len(run_ids)}")
    labels, splits, frames = read_members(client, run_ids, task)
    val_probs, val_targets = splits["val"]
    weights = build_weighting(weighting).fit(val_probs, val_targets)
    mean = MeanWeights().fit(val_probs, val_targets)
    metrics: dict[str, float] = {}
    tuned: dict[str, np.ndarray] = {}
    for split, (probs, targets) in splits.items():
        metrics[f"ensemble/{split}/mAP_mean"] = suite_map(targets, combine(probs, mean), labels)
        tuned[split] = np.clip(combine(probs, weights), 0.0, 1.0)
        metrics[f"ensemble/{split}/mAP_tuned"] = suite_map(targets, tuned[split], labels)
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
            for split, probs in tuned.items():  # what make compare and make evaluate's readers judge a run by
                frame = frames[split].copy()
                frame[labels] = probs
                frame.to_csv(Path(tmp) / f"{split}.csv", index=False)
                run.log_artifact(Path(tmp) / f"{split}.csv", "predictions")
    return run_id, metrics, stored


def table(metrics: dict[str, float], stored: StoredEnsemble) -> str:
    """mAP of each member, the mean and the tuned weights on both splits, with each member's mean weight."""
    rows = [(f"member {k} {run_id[:12]}{run_id[run_id.find(':'):] if ':' in run_id else ''}",
             f"{stored.weights[k].mean():.3f}", f"member{k}") for k, run_id in enumerate(stored.members)]  # fmt: skip
    rows += [("plain mean", "", "mean"), (f"tuned ({stored.weighting})", "", "tuned")]
    lines = [f"{'':28} {'weight':>7} {'val mAP':>8} {'test mAP':>8}"]
    for name, weight, key in rows:
        val, test = metrics[f"ensemble/val/mAP_{key}"], metrics[f"ensemble/test/mAP_{key}"]
        lines.append(f"{name:28} {weight:>7} {val:8.4f} {test:8.4f}")
    return "\n".join(lines)
