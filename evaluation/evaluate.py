"""Judge a trained model on its data module: every metric set of the tracking contract, plots and a report.

Metric sets (docs/rules.md §7), each with bootstrap CIs on its macro metrics:

- ``test/...``: plain predictions, per class, per head-to-tail group, per source (``test/source/<name>/...``);
- ``test_<postprocessor>/...``: optional logit post-processing (normal gating, logit adjustment);
- ``test_tta/...``: test-time augmentation, never mixed into ``test/``;
- ``test_perturbed/...``: the challenge's fixed perturbed copy of the test set, plus ``test_perturbed/delta/...``.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
from hydra.utils import instantiate

from evaluation.conventions import Conventions, alternative_metrics
from evaluation.metric_registry import SUITE
from evaluation.metrics import prevalence_baseline_map
from evaluation.perturbed_split import predict_perturbed
from evaluation.plots import write_plots
from evaluation.prediction_columns import ID_COLUMN, TRUE_PREFIX
from evaluation.report import write_html, write_report
from evaluation.suite import COUNT_SUFFIXES, SuiteResult, compute_suite
from evaluation.tables import PER_CLASS_TABLE, logged_tables_tag, per_class_metric_names, per_class_table, write_table
from evaluation.thresholds import select_thresholds
from evaluation.tta import Identity, TTAPredictor

log = logging.getLogger(__name__)

MACROS = SUITE.headline()  # macro (and pooled) names every metric set logs, from evaluation.metric_registry


@dataclass
class MetricSet:
    """One evaluated variant of the test predictions."""

    prefix: str
    probs: np.ndarray
    result: SuiteResult
    metrics: dict[str, float] = field(default_factory=dict)


@dataclass
class Evaluation:
    """Everything an evaluation produced: the metric sets, the flat metrics to log, and the split predictions."""

    sets: dict[str, MetricSet]
    metrics: dict[str, float]
    predictions: dict[str, pd.DataFrame]
    labels: list[str]
    groups: dict[str, list[int]]
    train_prevalence: np.ndarray
    sources: dict[str, dict[str, float]]
    #: ``evaluation.per_class_metrics``: whether :func:`store` logs ``test/<key>/<class>`` as metrics as well as in
    #: the per-class table. Carried here so every caller of ``store`` honours the run's config.
    per_class_metrics: bool = True
    #: ``{label: readable name}`` where the data source has one (ROCOv2's CUI -> concept name); shown beside the
    #: label in the per-class table and the report.
    label_titles: dict[str, str] = field(default_factory=dict)
    #: The readings of the open conventions every metric set used (``evaluation.conventions``), printed beside the
    #: figures by the report and the terminal.
    conventions: Conventions = field(default_factory=Conventions)


def predict(model, datamodule, split: str, predictor: TTAPredictor | None = None) -> np.ndarray:
    """``(N, C)`` probabilities of a split in manifest order (plain unless a TTA predictor is given)."""
    predictor = predictor or TTAPredictor(["identity"])
    return predictor.predict(model, datamodule.eval_dataloader(split))


def _frame(datamodule, split: str, probs: np.ndarray, labels: list[str]) -> pd.DataFrame:
    rows = datamodule.split_frame(split)
    meta = rows[[ID_COLUMN, "patient_id"] + [c for c in ("source", "view") if c in rows]].reset_index(drop=True)
    truth = datamodule.datasets[split].targets.numpy().astype(int)
    return pd.concat(
        [meta, pd.DataFrame(probs, columns=labels), pd.DataFrame(truth, columns=[TRUE_PREFIX + n for n in labels])],
        axis=1,
    )


def _prefixed(prefix: str, metrics: dict[str, float], macros_only: bool = False) -> dict[str, float]:
    keep = (
        # the left-out counts too: the card's and report's note on an interval reads them per set (evaluation.intervals)
        (lambda key: key.split("_ci_")[0] in MACROS or key.startswith("group/") or key.endswith(COUNT_SUFFIXES))
        if macros_only
        else (lambda key: True)
    )
    return {f"{prefix}/{key}": value for key, value in metrics.items() if keep(key) and np.isfinite(value)}


def evaluate(model, datamodule, cfg, val_logits: np.ndarray | None = None) -> Evaluation:
    """Run every configured metric set on the test split.

    Each model pass over a split happens once: the TTA views include the plain one, whose logits are the plain
    test predictions, and the validation logits may come from the caller (the temperature fit already ran the
    model over validation), giving the same numbers a second pass would.

    Args:
        val_logits: ``(N, C)`` validation logits of ``model`` exactly as it is now, or None to compute them.
    """
    labels = list(model.labels)
    groups = model.groups
    prevalence = model.train_counts.cpu().numpy() / max(float(model.train_size), 1.0)
    conventions = Conventions.from_config(cfg.evaluation)
    suite = dict(labels=labels, n_boot=cfg.evaluation.n_boot, seed=cfg.evaluation.seed, class_groups=groups,
                 **conventions.suite_kwargs())  # fmt: skip
    test_targets = datamodule.datasets["test"].targets.numpy()
    val_targets = datamodule.datasets["val"].targets.numpy()
    plain = TTAPredictor(["identity"])
    val_probs = predict(model, datamodule, "val") if val_logits is None else plain.merge(val_logits[None])
    suite["val_thresholds"] = select_thresholds(val_targets, val_probs)
    tta = TTAPredictor.from_config(cfg.tta) if cfg.tta.enabled else None
    identity = next((i for i, view in enumerate(tta.views) if isinstance(view, Identity)), None) if tta else None
    if identity is None:
        test_probs = predict(model, datamodule, "test")
        tta_probs = tta.predict(model, datamodule.eval_dataloader("test")) if tta else None
    else:  # one pass for both: the plain predictions are the identity view's
        tta_logits = tta.predict_logits(model, datamodule.eval_dataloader("test"))
        test_probs, tta_probs = plain.merge(tta_logits[identity : identity + 1]), tta.merge(tta_logits)
    predictions = {
        "val": _frame(datamodule, "val", val_probs, labels),
        "test": _frame(datamodule, "test", test_probs, labels),
    }

    sets: dict[str, MetricSet] = {}

    def add(prefix: str, probs: np.ndarray, macros_only: bool, **overrides) -> MetricSet:
        result = compute_suite(test_targets, probs, **{**suite, **overrides})
        metric_set = MetricSet(prefix, probs, result, _prefixed(prefix, result.metrics, macros_only))
        other = alternative_metrics(test_targets, probs, labels, conventions, suite["n_boot"], suite["seed"])
        metric_set.metrics.update({f"{prefix}/{key}": value for key, value in other.items()})
        sets[prefix] = metric_set
        return metric_set

    add("test", test_probs, macros_only=False)
    for spec in cfg.evaluation.postprocess or []:
        processor = instantiate(spec)
        # Thresholds re-chosen on post-processed validation scores: the processors change the probability scale.
        thresholds = select_thresholds(val_targets, processor(val_probs, labels, prevalence))
        add(f"test_{processor.name}", processor(test_probs, labels, prevalence), True, val_thresholds=thresholds)
    if tta_probs is not None:
        add("test_tta", tta_probs, macros_only=True)
        predictions["test_tta"] = _frame(datamodule, "test", tta_probs, labels)
    if cfg.evaluation.perturbation.enabled:
        perturbed_probs = _predict_perturbed(model, datamodule, cfg.evaluation.perturbation)
        base = add("test_perturbed", perturbed_probs, macros_only=True)
        for macro in MACROS:
            key = f"test_perturbed/{macro}"
            if key in base.metrics and f"test/{macro}" in sets["test"].metrics:
                base.metrics[f"test_perturbed/delta/{macro}"] = (
                    base.metrics[key] - sets["test"].metrics[f"test/{macro}"]
                )
        predictions["test_perturbed"] = _frame(datamodule, "test", perturbed_probs, labels)

    sources = _per_source(datamodule, test_targets, test_probs, suite) if cfg.evaluation.per_source else {}
    metrics = {k: v for s in sets.values() for k, v in s.metrics.items()}
    metrics.update({f"test/source/{name}/{k}": v for name, values in sources.items() for k, v in values.items()})
    metrics["test/prevalence_baseline_mAP"] = prevalence_baseline_map(test_targets)
    per_class_metrics = bool(cfg.evaluation.get("per_class_metrics", True))
    titles = dict(getattr(datamodule.source, "label_titles", None) or {})
    return Evaluation(sets, metrics, predictions, labels, groups, prevalence, sources, per_class_metrics,
                      {name: titles[name] for name in labels if name in titles}, conventions)  # fmt: skip


def _predict_perturbed(model, datamodule, cfg) -> np.ndarray:
    """Predictions on the fixed perturbed test copy, perturbed at the source resolution once for every model
    (:mod:`evaluation.perturbed_split`) and resized to this model's input."""
    return predict_perturbed(model, datamodule, cfg, "test")


def _per_source(datamodule, targets, probs, suite) -> dict[str, dict[str, float]]:
    """Macro metrics with CIs per centre, the bootstrap done within each centre's images."""
    rows = datamodule.split_frame("test")
    if "source" not in rows or rows["source"].nunique() < 2:
        return {}
    out = {}
    for name, index in rows.groupby("source").indices.items():
        result = compute_suite(targets[index], probs[index], **{**suite, "class_groups": None})
        out[str(name)] = {k: v for k, v in result.metrics.items() if k.split("_ci_")[0] in MACROS and np.isfinite(v)}
    return out


def store(evaluation: Evaluation, log_metrics: Callable[[dict], None], log_artifacts: Callable[[Path, str], None],
          workdir: Path, make_plots: bool = True, set_tags: Callable[[dict], None] | None = None) -> None:  # fmt: skip
    """Log the metrics and write predictions, plots, ``metrics.json``, ``report.md``/``report.html`` and the
    per-class table (``evaluation/per_class.json``) as run artifacts.

    The per-class values are always in the table, ``metrics.json`` and the report; they are logged as MLflow
    metrics too unless ``evaluation.per_class_metrics`` is false, which leaves a run's metric list to its macros,
    groups and sources (docs/rules.md §7). ``set_tags`` (the run's) registers the table with MLflow's UI, which
    then shows it as a table and compares it across runs; without it the table is a plain JSON artifact.
    """
    logged = evaluation.metrics
    if not evaluation.per_class_metrics:
        per_class = per_class_metric_names(evaluation)
        logged = {key: value for key, value in logged.items() if key not in per_class}
    log_metrics(logged)
    predictions = workdir / "predictions"
    predictions.mkdir(parents=True, exist_ok=True)
    for split, frame in evaluation.predictions.items():
        frame.to_csv(predictions / f"{split}.csv", index=False)
    log_artifacts(predictions, "predictions")
    report = workdir / "evaluation"
    report.mkdir(parents=True, exist_ok=True)
    (report / "metrics.json").write_text(json.dumps(evaluation.metrics, indent=1, sort_keys=True))
    write_table(per_class_table(evaluation), workdir / PER_CLASS_TABLE)
    plots = write_plots(evaluation, report) if make_plots else []
    write_html(write_report(evaluation, report / "report.md", plots), report / "report.html")
    log_artifacts(report, "evaluation")
    if set_tags is not None:
        set_tags(logged_tables_tag([PER_CLASS_TABLE]))
