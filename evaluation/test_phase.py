"""The test phase of a trained model, one sequence for training and for ``make evaluate``: temperature fitted on
validation (evaluation/temperature.py) -> evaluate -> held-out stability subset -> store -> zero-shot (unseen-class)
report -> store.

Training runs it on the best checkpoint right after fitting; ``make evaluate RUN=<id>`` runs it again on a
finished run with new evaluation or TTA settings. Both write through a :class:`RunSink`, so a new metric set or
report lands in both at once.
"""

from __future__ import annotations

import logging
import tempfile
from pathlib import Path
from typing import Protocol

from evaluation.evaluate import Evaluation, evaluate, store
from evaluation.headline import headline_of
from evaluation.heldout import ARTIFACT, attach, evaluate_heldout, tags, write_record
from evaluation.report import interval_notes
from evaluation.tau_norm import ARTIFACT as TAU_NORM_ARTIFACT
from evaluation.tau_norm import normalise_classifier
from evaluation.temperature import ARTIFACT as TEMPERATURE_ARTIFACT
from evaluation.temperature import calibrate
from evaluation.unseen import UnseenReport, compute_unseen, store_unseen

log = logging.getLogger(__name__)


class RunSink(Protocol):
    """Where the results go: the training's tracking session, or an existing run re-evaluated."""

    def log_metrics(self, metrics: dict[str, float]) -> None: ...

    def log_artifacts(self, folder: Path, artifact_path: str | None = None) -> None: ...

    def log_artifact(self, path: Path, artifact_path: str | None = None) -> None: ...

    def set_tags(self, tags: dict[str, str]) -> None: ...


def run_test_phase(model, datamodule, cfg, sink: RunSink) -> tuple[Evaluation, UnseenReport | None]:
    """Judge ``model`` (the weights to test, in eval mode) on the set-up ``datamodule``'s test split, into ``sink``.

    With ``calibration`` naming a fitter, ``model.logit_temperature`` holds the fitted temperatures afterwards, so
    the caller's checkpoint can carry them (training.pipeline re-saves ``best.ckpt``).

    Returns:
        The evaluation and the unseen-class report (None unless the model is zero-shot).
    """
    # First, so every prediction below (test, TTA, perturbed, held-out, predictions/*.csv) is of the normalised
    # classifier (postprocess=tau_norm), then of the scaled model; the temperature is fitted on the normalised head.
    tau_norm = normalise_classifier(model, datamodule, cfg.get("postprocess"))
    temperature = calibrate(model, datamodule, cfg.get("calibration"))
    unscaled = temperature is not None and not temperature.applied  # then the fit's validation pass is this model's
    evaluation = evaluate(model, datamodule, cfg, val_logits=temperature.val_logits if unscaled else None)
    if tau_norm is not None:
        evaluation.metrics.update(tau_norm.logged())
    if temperature is not None:
        temperature.add_test(datamodule.datasets["test"].targets.numpy(), evaluation.sets["test"].probs)
        evaluation.metrics.update(temperature.logged())
        evaluation.calibration = temperature  # read by evaluation.report for the before/after section
    # Before `store`, as one more metric set: logged, tabled and reported like the others (docs/rules.md §10).
    heldout = evaluate_heldout(model, datamodule, cfg, evaluation)
    if heldout is not None:
        attach(evaluation, heldout, datamodule)
        log.warning("held-out subset: %s", heldout.draw.describe())
    for note in interval_notes(evaluation):  # the terminal says it too, not only report.md
        log.warning("%s", note)
    # Before `store`, so report.md carries the Task 2 analyses beside the seen classes (read by evaluation.report).
    unseen = compute_unseen(model, datamodule, cfg)
    evaluation.unseen = unseen
    evaluation.headline = headline_of(cfg.get("task"))  # which sets report.md leads with (Task 2: the unseen ones)
    with tempfile.TemporaryDirectory() as tmp:
        store(evaluation, sink.log_metrics, sink.log_artifacts, Path(tmp), cfg.evaluation.plots, sink.set_tags)
        if heldout is not None:
            sink.log_artifact(write_record(heldout.draw, Path(tmp) / ARTIFACT), str(Path(ARTIFACT).parent))
            sink.set_tags(tags(heldout.draw))
        if tau_norm is not None:
            sink.log_artifact(tau_norm.write(Path(tmp) / TAU_NORM_ARTIFACT), str(Path(TAU_NORM_ARTIFACT).parent))
        if temperature is not None:
            record = temperature.write(Path(tmp) / TEMPERATURE_ARTIFACT)
            sink.log_artifact(record, str(Path(TEMPERATURE_ARTIFACT).parent))
    if unseen is not None:
        store_unseen(unseen, sink.log_metrics, sink.log_artifact, sink.set_tags)
    return evaluation, unseen
