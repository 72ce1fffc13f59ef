"""``make register``: pick a task's best finished run, register it as ``cxrlt-<task>``, point ``champion`` at it.

Ranking. Runs are ordered by ``--metric`` (default: the task's ``selection_metric`` from
``configs/task/<task>.yaml``, the one its checkpoints were kept by, e.g. ``val/mAP`` for Task 1 and
``val/proxy_ood_mAP`` for the zero-shot Task 2; always on validation, so the test set stays a test), then by the
challenge's own order as tie-breaks (``evaluation.metric_registry``) on the test set of the classes the task is
ranked on (its ``headline``, :mod:`evaluation.headline`): ``test/mAP``, ``test/mAUROC``, ``test/mF1``,
``test/mECE`` (lower is better), ``test/mPrecision``, ``test/mRecall`` (Task 2: ``test_unseen/...``, its six unseen
findings), then the earlier run. For a per-epoch
metric the value of the kept checkpoint (``<metric>_best``, logged by the pipeline) is used when the run has it,
otherwise the last logged value. Runs without the metric, unfinished runs (pruned trials are KILLED) and study
parent runs are never candidates.

Comparability. A validation metric compares two runs only when both were judged on the same validation rows, so
only runs of the task with one validation-set fingerprint (tag ``cxrlt.val_fingerprint``, recorded by
:mod:`training.tracking.run_context`) are ranked together, and debug runs (a debug preset's subset, tag
``cxrlt.debug``) only with ``--include-debug``. The group ranked is the one asked for (``--val-set``), else the
current champion's (a new champion must beat the old one on the same rows), else the newest run's (the data the
user last trained on). The command prints the metric, the ranked candidates with their values and every run it
left out, counted by reason.

Registry. Aliases, not the deprecated stages: the new version gets ``champion`` and the previous holder keeps its
version number, tags and history (plus ``cxrlt.replaced_by``). Registering a run that already has a version
re-points the alias to that version instead of adding a duplicate.
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import mlflow
from mlflow import MlflowClient
from mlflow.exceptions import MlflowException
from omegaconf import OmegaConf

from apps.compare import require_significant_gain, task_headline
from evaluation.headline import DEFAULT, Headline
from evaluation.metric_registry import SUITE
from training.allowed_targets import UnsafeConfig
from training.config_files import CONFIGS
from training.errors import UserError, unknown_choice, user_errors
from training.interrupts import warn_abandoned
from training.run_lookup import ModelNotFound, existing_store_client  # without torch: ranking needs none
from training.tracking.run_context import DEBUG_TAG, VAL_FINGERPRINT_TAG
from training.tracking.uri import resolve_tracking_uri

log = logging.getLogger(__name__)

ALIAS = "champion"
TASK_CONFIGS = CONFIGS / "task"
#: Metric sets of the default evaluation that a tuning trial skips; a champion without them is evaluated first.
FULL_EVALUATION_KEYS = ("test_tta/mAP", "test_perturbed/mAP")
FALLBACK_METRIC = "val/mAP"  # for an experiment that is not a task of configs/task/
#: Challenge tie-breaks after the chosen metric: (metric key, larger is better), the metric registry's chain on test
#: (a task ranked on other classes ties on its headline's test set instead: :func:`task_headline`).
TIE_BREAKS: tuple[tuple[str, bool], ...] = DEFAULT.tie_breaks()
#: Metric names (last path part, before any ``_best``) where lower is better; everything else is maximised. The
#: registry's lower-is-better metrics, plus the training loss, which is no evaluation metric.
LOWER_IS_BETTER = SUITE.lower_is_better() | {"loss"}
STUDY_KIND = ("cxrlt.kind", "tuning-study")
SHOWN = 10  # ranked candidates and excluded ids printed per list; the rest are counted
#: Pinned requirements written into the model (``--env-manager local`` serves in the project's own env).
REQUIREMENTS = ("torch", "torchvision", "timm", "lightning", "albumentations", "opencv-python-headless", "mlflow",
                "pandas", "numpy", "omegaconf", "hydra-core", "cxrlt-lab")  # fmt: skip


class NoCandidate(UserError, ValueError):
    """Nothing to register: no such experiment, or no finished run of it logged the ranking metric."""


def model_name(task: str) -> str:
    return f"cxrlt-{task}"


def selection_metric(task: str) -> str:
    """The metric ``task``'s runs are compared by: the same one training kept their checkpoints by."""
    path = TASK_CONFIGS / f"{task}.yaml"
    if not path.is_file():
        return FALLBACK_METRIC
    return str(OmegaConf.load(path).get("selection_metric", FALLBACK_METRIC))


def larger_is_better(metric: str) -> bool:
    return metric.rsplit("/", 1)[-1].removesuffix("_best") not in LOWER_IS_BETTER


@dataclass(frozen=True)
class Candidate:
    """A run as ranking sees it: id, start time, its metrics and what it is comparable by."""

    run_id: str
    start_time: int
    metrics: dict[str, float]
    val_set: str | None = None  # validation-set fingerprint; None for a run logged before runs recorded one
    debug: bool = False
    name: str = ""

    def value(self, metric: str) -> float:
        """The kept checkpoint's value of ``metric`` when logged, else the latest; NaN when absent."""
        value = self.metrics.get(f"{metric}_best", self.metrics.get(metric, math.nan))
        return float(value)


def rank(candidates: Iterable[Candidate], metric: str,
         tie_breaks: Sequence[tuple[str, bool]] = TIE_BREAKS) -> list[Candidate]:  # fmt: skip
    """Best first: ``metric``, then ``tie_breaks`` (missing values last), then the earlier run."""
    keys = [(metric, larger_is_better(metric))] + [(k, up) for k, up in tie_breaks if k != metric]

    def sort_key(candidate: Candidate) -> tuple:
        parts = []
        for key, up in keys:
            value = candidate.value(key)
            parts.append(math.inf if math.isnan(value) else (-value if up else value))
        return (*parts, candidate.start_time, candidate.run_id)

    return sorted(candidates, key=sort_key)


def is_debug(run) -> bool:
    """A debug run: tagged so by training, or (runs logged before the tag) trained with ``data.debug_size`` set."""
    tag = run.data.tags.get(DEBUG_TAG)
    if tag is not None:
        return tag == "true"
    return any(key.startswith("data.debug_size.") for key in run.data.params)


def _candidate(run) -> Candidate:
    return Candidate(run.info.run_id, run.info.start_time, dict(run.data.metrics),
                     run.data.tags.get(VAL_FINGERPRINT_TAG), is_debug(run), run.info.run_name or "")  # fmt: skip


@dataclass
class Ranking:
    """The comparable group ranked, best first, and every other run of the experiment with why it was left out."""

    metric: str
    val_set: str | None
    chosen_by: str  # why this group: asked, the champion's, the newest run's
    ranked: list[Candidate]
    excluded: dict[str, list[str]] = field(default_factory=dict)  # reason -> run ids
    headline: Headline = DEFAULT  # the classes the task is ranked on: their test set breaks ties

    def lines(self) -> list[str]:
        """What ``make register`` prints: the metric, the tie-breaks, the ranked candidates with values, the
        excluded by reason."""
        direction = "higher" if larger_is_better(self.metric) else "lower"
        out = [f"ranking {len(self.ranked)} comparable run(s) by {self.metric} ({direction} is better; the kept "
               f"checkpoint's {self.metric}_best where logged), validation set {self.val_set} ({self.chosen_by}):"]  # fmt: skip
        if not self.ranked:
            out = [f"no comparable run to rank by {self.metric}"]
        else:
            chain = [(key, up) for key, up in self.headline.tie_breaks() if key != self.metric]
            ties = [key + ("" if up else " (lower wins)") for key, up in chain]
            which = f" ({self.headline.title})" if self.headline.title else ""
            out.append(f"  ties broken by the ranking chain on test{which}: {', '.join(ties)}, then the earlier run")
        for place, candidate in enumerate(self.ranked[:SHOWN], 1):
            out.append(f"  {place:>2}. {candidate.run_id}  {candidate.value(self.metric):.4f}  {candidate.name}")
        if len(self.ranked) > SHOWN:
            out.append(f"      ... and {len(self.ranked) - SHOWN} more")
        total = sum(len(ids) for ids in self.excluded.values())
        if total:
            out.append(f"excluded {total} run(s):")
        for reason, ids in self.excluded.items():
            more = f" and {len(ids) - SHOWN} more" if len(ids) > SHOWN else ""
            out.append(f"  {len(ids)} {reason}: {', '.join(ids[:SHOWN])}{more}")
        return out


#: Why a finished run with the metric is left out of the ranked group, in the order they are checked and printed.
OTHER_TASK = "of another task"
DEBUG_RUN = "debug run(s) (a debug preset's subset; ARGS=--include-debug ranks them)"
NO_VAL_SET = "without a validation-set fingerprint (logged before runs recorded one; RUN=<id> registers one)"
OTHER_VAL_SET = "on another validation set"


def comparable(client: MlflowClient, experiment: str, task: str, metric: str, include_debug: bool = False,
               val_set: str | None = None) -> Ranking:  # fmt: skip
    """Rank the experiment's runs that are comparable with each other (module docstring, Comparability)."""
    found = client.get_experiment_by_name(experiment)
    if found is None:
        unknown = unknown_choice("task", experiment)  # then `make train TASK=<it>` would be refused too
        raise NoCandidate(
            f"no MLflow experiment {experiment!r}; " + (unknown or f"train first (make train TASK={experiment})")
        )
    excluded: dict[str, list[str]] = {}

    def leave_out(reason: str, run_id: str) -> None:
        excluded.setdefault(reason, []).append(run_id)

    pool = []
    for run in client.search_runs([found.experiment_id], max_results=50000, order_by=["attributes.start_time DESC"]):
        tags, run_id = run.data.tags, run.info.run_id
        if tags.get(STUDY_KIND[0]) == STUDY_KIND[1]:
            leave_out("tuning-study parent run(s)", run_id)
        elif run.info.status != "FINISHED":
            leave_out("unfinished (running, failed or pruned)", run_id)
        elif metric not in run.data.metrics and f"{metric}_best" not in run.data.metrics:
            leave_out(f"without {metric}", run_id)
        elif tags.get("task", task) != task:
            leave_out(OTHER_TASK, run_id)
        elif is_debug(run) and not include_debug:
            leave_out(DEBUG_RUN, run_id)
        elif tags.get(VAL_FINGERPRINT_TAG) is None:
            leave_out(NO_VAL_SET, run_id)
        else:
            pool.append(_candidate(run))
    chosen_by = "asked with --val-set"
    if val_set is None:
        val_set, chosen_by = _default_group(client, task, pool)
    for candidate in pool:
        if candidate.val_set != val_set:
            leave_out(OTHER_VAL_SET, candidate.run_id)
    headline = task_headline(task)
    ranked = rank([c for c in pool if c.val_set == val_set], metric, headline.tie_breaks())
    return Ranking(metric, val_set, chosen_by, ranked, excluded, headline)


def _default_group(client: MlflowClient, task: str, pool: list[Candidate]) -> tuple[str | None, str]:
    """The champion's validation set when it has comparable runs, else the newest candidate's (``pool`` is newest
    first)."""
    holder = _alias_holder(client, model_name(task), ALIAS)
    if holder is not None:
        champion = _run_or_none(client, holder.run_id)
        fingerprint = champion.data.tags.get(VAL_FINGERPRINT_TAG) if champion else None
        if any(c.val_set == fingerprint for c in pool):
            return fingerprint, f"the champion's, run {holder.run_id}"
    if not pool:
        return None, "no comparable run"
    return pool[0].val_set, f"the newest run's, {pool[0].run_id}"


def _run_or_none(client: MlflowClient, run_id: str):
    try:
        return client.get_run(run_id)
    except MlflowException:
        return None


def ensure_full_evaluation(client: MlflowClient, run_id: str) -> bool:
    """Give ``run_id`` the full evaluation (TTA, perturbed copy, plots, 1,000 resamples) if it lacks it.

    A tuning trial is tested with the plain metric set only (configs/tune.yaml), but a champion is what people
    open, compare and submit, so it should carry every result an ordinary run has. Returns whether it ran.
    """
    missing = [key for key in FULL_EVALUATION_KEYS if key not in client.get_run(run_id).data.metrics]
    if not missing:
        return False
    log.info("run %s has no %s (a tuning trial is tested with the plain metric set only): running the full "
             "evaluation into it first, as `make evaluate RUN=%s` would", run_id, ", ".join(missing), run_id)  # fmt: skip
    from apps.evaluate import evaluate_run  # the whole training stack; only needed here

    evaluate_run(run_id, OmegaConf.load(CONFIGS / "evaluation" / "default.yaml"),
                 OmegaConf.load(CONFIGS / "tta" / "default.yaml"), client)  # fmt: skip
    return True


def register_run(client: MlflowClient, run_id: str, name: str, alias: str = ALIAS, reason: dict | None = None,
                 full_evaluation: bool = True):  # fmt: skip
    """Register ``run_id`` as a new version of ``name`` (or reuse its version) and move ``alias`` to it.

    The pyfunc is logged into the source run (artifact ``model``), so the version's source is that run.
    Returns the ``ModelVersion`` now holding the alias.
    """
    from apps.serving import PYFUNC_CODE, Scorer, example_request, save_artifacts, signature  # torch: to build a model
    from training.tracking.tracked_run import TrackedRun  # lightning, likewise

    existing = client.search_model_versions(f"name = '{name}' and run_id = '{run_id}'")
    if existing:
        version = max(existing, key=lambda v: int(v.version))
        log.info("run %s is already %s version %s; moving %r to it", run_id, name, version.version, alias)
    else:
        scorer = Scorer.load(run_id, client)  # first: an unknown or unfinished run is refused by name
        if full_evaluation:
            ensure_full_evaluation(client, run_id)
        with tempfile.TemporaryDirectory() as tmp, TrackedRun(client, run_id).active():
            info = mlflow.pyfunc.log_model(
                name="model", python_model=str(PYFUNC_CODE), artifacts=save_artifacts(scorer, Path(tmp)),
                signature=signature(scorer.labels), input_example=example_request(scorer.image_size), pip_requirements=_requirements(), registered_model_name=name,
                metadata={"labels": scorer.labels, "image_size": scorer.image_size, "thresholds": scorer.thresholds,
                          "source_run_id": run_id},
                # Declared so that ``load_model(..., model_config={"image_root": ...})`` may set it: MLflow only
                # overrides keys the logged model has. Empty: no request path is opened (apps/serving.py).
                model_config={"image_root": ""},
            )  # fmt: skip
        version = client.get_model_version(name, str(info.registered_model_version))
    previous = _alias_holder(client, name, alias)
    client.set_registered_model_alias(name, alias, version.version)
    for key, value in {"source_run_id": run_id, **(reason or {})}.items():
        client.set_model_version_tag(name, version.version, f"cxrlt.{key}", str(value))
    if previous is not None and previous.version != version.version:
        client.set_model_version_tag(name, previous.version, "cxrlt.replaced_by", str(version.version))
        client.set_model_version_tag(name, version.version, "cxrlt.previous_champion", str(previous.version))
    return client.get_model_version(name, version.version)


def _alias_holder(client: MlflowClient, name: str, alias: str):
    try:
        return client.get_model_version_by_alias(name, alias)
    except MlflowException:
        return None


def _requirements() -> list[str]:
    from importlib.metadata import PackageNotFoundError, version

    pins = []
    for package in REQUIREMENTS:
        try:
            pins.append(f"{package}=={version(package)}")
        except PackageNotFoundError:
            continue
    return pins


def register_best(client: MlflowClient, task: str, metric: str = "val/mAP", experiment: str | None = None,
                  run_id: str | None = None, alias: str = ALIAS, full_evaluation: bool = True,
                  include_debug: bool = False, val_set: str | None = None,
                  require_significant: bool = False):  # fmt: skip
    """Rank the task's comparable runs, say how, register the best (or ``run_id``) and make it the ``alias``
    holder; with ``require_significant`` only if it beats the current holder significantly
    (:func:`apps.compare.require_significant_gain`)."""
    ranking = comparable(client, experiment or task, task, metric, include_debug, val_set)
    for line in ranking.lines():
        log.info("%s", line)
    if run_id is None:
        if not ranking.ranked:
            left = sum(len(ids) for ids in ranking.excluded.values())
            raise NoCandidate(f"no comparable finished run in experiment {experiment or task!r} logged {metric!r} "
                              f"({left} run(s) excluded, listed above)")  # fmt: skip
        run_id = ranking.ranked[0].run_id
    else:
        _say_if_not_comparable(client, task, run_id)
    best = next((c for c in ranking.ranked if c.run_id == run_id), None)
    reason = {"rank_metric": metric, "rank_value": best.value(metric) if best else "n/a",
              "candidates": len(ranking.ranked), "val_fingerprint": ranking.val_set if best else "n/a"}  # fmt: skip
    if require_significant:  # the paired bootstrap; raises when the gain is not significant
        log.info("%s", require_significant_gain(client, run_id, _alias_holder(client, model_name(task), alias), metric))
    return register_run(client, run_id, model_name(task), alias, reason, full_evaluation)


def _say_if_not_comparable(client: MlflowClient, task: str, run_id: str) -> None:
    """``RUN=<id>`` registers what it is told; it warns when that run cannot be compared with the champion."""
    run, holder = _run_or_none(client, run_id), _alias_holder(client, model_name(task), ALIAS)
    if run is None:
        return  # register_run names the unknown run
    if is_debug(run):
        log.warning("note: run %s is a debug run (a debug preset's subset)", run_id)
    champion = _run_or_none(client, holder.run_id) if holder is not None else None
    if champion is None or holder.run_id == run_id:
        return
    mine, theirs = run.data.tags.get(VAL_FINGERPRINT_TAG), champion.data.tags.get(VAL_FINGERPRINT_TAG)
    if mine is None or mine != theirs:
        log.warning("note: run %s is not comparable with the current champion (run %s): validation set %s, the "
                    "champion's %s", run_id, holder.run_id, mine or "not recorded", theirs or "not recorded")  # fmt: skip


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--task", default="task1")
    parser.add_argument("--metric", default=None, help="ranking metric (default: the task's selection_metric)")
    parser.add_argument("--experiment", default=None, help="MLflow experiment (default: the task name)")
    parser.add_argument("--run", default=None, help="register this run id instead of the best one")
    parser.add_argument("--alias", default=ALIAS)
    parser.add_argument("--include-debug", action="store_true", help="rank debug runs (debug=smoke) too")
    parser.add_argument("--val-set", default=None, help="rank the runs of this validation-set fingerprint "
                        "(tag cxrlt.val_fingerprint; default: the champion's, else the newest run's)")  # fmt: skip
    parser.add_argument(
        "--no-full-evaluation",
        action="store_true",
        help="register a tuning trial as it is, without first giving it the full evaluation",
    )
    parser.add_argument("--pareto-front", action="store_true", help="register the trial the documented rule picks "
                        "from the newest multi-objective study's Pareto front (training/tuning/front_choice.py)")  # fmt: skip
    parser.add_argument("--require-significant", action="store_true", help="register only if the pick beats the "
                        "current champion on the metric by a paired bootstrap, p < 0.05 (docs/compare.md)")  # fmt: skip
    parser.add_argument("--debug", action="store_true", help="show the traceback of an input error")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    uri = resolve_tracking_uri()
    mlflow.set_tracking_uri(uri)  # log_model below uses MLflow's fluent API
    # An unknown or unsafe run is the user's to fix from the message; anything else is a bug, with its traceback.
    with user_errors(UnsafeConfig, ModelNotFound, NoCandidate, debug=args.debug):
        metric = args.metric or selection_metric(args.task)
        # A store that is not there is refused, not created empty (a mistyped MLFLOW_TRACKING_URI, a fresh clone).
        client = existing_store_client(uri)
        warn_abandoned(client, args.experiment or args.task)
        if args.pareto_front and args.run is None:  # the front's pick, registered as RUN=<id> is
            from training.tuning.front_choice import choose_from_front

            args.run = choose_from_front(client, args.experiment or args.task, metric, args.include_debug, log.info)
        version = register_best(client, args.task, metric, args.experiment, args.run, args.alias,
                                full_evaluation=not args.no_full_evaluation, include_debug=args.include_debug,
                                val_set=args.val_set, require_significant=args.require_significant)  # fmt: skip
    log.info("%s version %s (run %s) is now @%s: models:/%s@%s", version.name, version.version, version.run_id,
             args.alias, version.name, args.alias)  # fmt: skip


if __name__ == "__main__":
    main()
