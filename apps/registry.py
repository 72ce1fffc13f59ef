"""``make register``: pick a task's best finished run, register it as ``cxrlt-<task>``, point ``champion`` at it.

Ranking. Runs are ordered by ``--metric`` (default: the task's ``selection_metric`` from
``configs/task/<task>.yaml``, the one its checkpoints were kept by, e.g. ``val/mAP`` for Task 1 and
``val/proxy_ood_mAP`` for the zero-shot Task 2; always on validation, so the test set stays a test), then by the
challenge's own order as tie-breaks (``evaluation.metric_registry``): ``test/mAP``, ``test/mAUROC``, ``test/mF1``,
``test/mECE`` (lower is better), ``test/mPrecision``, ``test/mRecall``, then the earlier run. For a per-epoch
metric the value of the kept checkpoint (``<metric>_best``, logged by the pipeline) is used when the run has it,
otherwise the last logged value. Runs without the metric, unfinished runs (pruned trials are KILLED) and study
parent runs are never candidates.

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
from dataclasses import dataclass
from pathlib import Path

import mlflow
from mlflow import MlflowClient
from mlflow.exceptions import MlflowException
from omegaconf import OmegaConf

from apps.serving import Scorer, example_request, save_artifacts, signature
from evaluation.metric_registry import SUITE
from training.config_files import CONFIGS
from training.errors import UserError, user_errors
from training.runs import ModelNotFound
from training.targets import UnsafeConfig
from training.tracking.tracked_run import TrackedRun
from training.tracking.uri import resolve_tracking_uri, tracking_client

log = logging.getLogger(__name__)

PYFUNC_CODE = Path(__file__).with_name("pyfunc_model.py")  # models-from-code: the registry stores code, no pickle
ALIAS = "champion"
TASK_CONFIGS = CONFIGS / "task"
#: Metric sets of the default evaluation that a tuning trial skips; a champion without them is evaluated first.
FULL_EVALUATION_KEYS = ("test_tta/mAP", "test_perturbed/mAP")
FALLBACK_METRIC = "val/mAP"  # for an experiment that is not a task of configs/task/
#: Challenge tie-breaks after the chosen metric: (metric key, larger is better), the metric registry's chain on test.
TIE_BREAKS: tuple[tuple[str, bool], ...] = tuple(
    (f"test/{m.name}", m.higher_is_better) for m in SUITE.tie_break_chain()
)
#: Metric names (last path part, before any ``_best``) where lower is better; everything else is maximised. The
#: registry's lower-is-better metrics, plus the training loss, which is no evaluation metric.
LOWER_IS_BETTER = SUITE.lower_is_better() | {"loss"}
STUDY_KIND = ("cxrlt.kind", "tuning-study")
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
    """A run as ranking sees it: id, start time and its metrics."""

    run_id: str
    start_time: int
    metrics: dict[str, float]

    def value(self, metric: str) -> float:
        """The kept checkpoint's value of ``metric`` when logged, else the latest; NaN when absent."""
        value = self.metrics.get(f"{metric}_best", self.metrics.get(metric, math.nan))
        return float(value)


def rank(candidates: Iterable[Candidate], metric: str) -> list[Candidate]:
    """Best first: ``metric``, then :data:`TIE_BREAKS` (missing values last), then the earlier run."""
    keys = [(metric, larger_is_better(metric))] + [(k, up) for k, up in TIE_BREAKS if k != metric]

    def sort_key(candidate: Candidate) -> tuple:
        parts = []
        for key, up in keys:
            value = candidate.value(key)
            parts.append(math.inf if math.isnan(value) else (-value if up else value))
        return (*parts, candidate.start_time, candidate.run_id)

    return sorted(candidates, key=sort_key)


def candidates(client: MlflowClient, experiment: str, metric: str) -> list[Candidate]:
    """Finished runs of the experiment that logged ``metric`` (or its ``_best``), study parents excluded."""
    found = client.get_experiment_by_name(experiment)
    if found is None:
        raise NoCandidate(f"no MLflow experiment {experiment!r}; train first (make train TASK={experiment})")
    runs = client.search_runs([found.experiment_id], filter_string="attributes.status = 'FINISHED'", max_results=50000)
    return [
        Candidate(run.info.run_id, run.info.start_time, dict(run.data.metrics))
        for run in runs
        if run.data.tags.get(STUDY_KIND[0]) != STUDY_KIND[1]
        and (metric in run.data.metrics or f"{metric}_best" in run.data.metrics)
    ]


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
                  run_id: str | None = None, alias: str = ALIAS, full_evaluation: bool = True):  # fmt: skip
    """Rank the task's runs, register the best (or ``run_id``) and make it the ``alias`` holder."""
    ranked = rank(candidates(client, experiment or task, metric), metric)
    if run_id is None:
        if not ranked:
            raise NoCandidate(f"no finished run in experiment {experiment or task!r} logged {metric!r}")
        run_id = ranked[0].run_id
    best = next((c for c in ranked if c.run_id == run_id), None)
    reason = {"rank_metric": metric, "rank_value": best.value(metric) if best else "n/a", "candidates": len(ranked)}
    return register_run(client, run_id, model_name(task), alias, reason, full_evaluation)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--task", default="task1")
    parser.add_argument("--metric", default=None, help="ranking metric (default: the task's selection_metric)")
    parser.add_argument("--experiment", default=None, help="MLflow experiment (default: the task name)")
    parser.add_argument("--run", default=None, help="register this run id instead of the best one")
    parser.add_argument("--alias", default=ALIAS)
    parser.add_argument(
        "--no-full-evaluation",
        action="store_true",
        help="register a tuning trial as it is, without first giving it the full evaluation",
    )
    parser.add_argument("--debug", action="store_true", help="show the traceback of an input error")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    uri = resolve_tracking_uri()
    mlflow.set_tracking_uri(uri)  # log_model below uses MLflow's fluent API
    metric = args.metric or selection_metric(args.task)
    # An unknown or unsafe run is the user's to fix from the message; anything else is a bug, with its traceback.
    with user_errors(UnsafeConfig, ModelNotFound, NoCandidate, debug=args.debug):
        version = register_best(
            tracking_client(uri), args.task, metric, args.experiment, args.run, args.alias, not args.no_full_evaluation
        )
    log.info("%s version %s (run %s) is now @%s: models:/%s@%s", version.name, version.version, version.run_id,
             args.alias, version.name, args.alias)  # fmt: skip


if __name__ == "__main__":
    main()
