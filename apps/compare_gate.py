"""``make register ARGS=--require-significant``: a new champion must beat the current one beyond the noise.

Ranking picks the run with the best selection metric, however small the lead; this gate then runs the paired
bootstrap of ``make compare`` (``evaluation.paired``) between the pick and the current champion on the stored
predictions of the split the metric is measured on (``val/mAP``: ``predictions/val.csv``, so the test set still
plays no part in the choice) and lets the registration go on only when the pick is better with a two-sided
bootstrap p below ``alpha``. One test, so no multiple-comparison correction. Without a champion, or when the pick
already is it, there is nothing to beat and it says so.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from mlflow import MlflowClient

from apps.compare_runs import read_split
from evaluation.comparison import Settings
from evaluation.metric_registry import SUITE
from evaluation.paired import entry_replicates, higher_is_better, paired_difference, seed_noise
from evaluation.paired_data import DifferentTestSets, align
from training.errors import UserError

SPLITS = ("val", "test")


class NotSignificant(UserError, ValueError):
    """The pick does not beat the champion significantly, or its metric cannot be tested from stored predictions."""


def tested_metric(metric: str) -> tuple[str, str]:
    """``(split, macro name)`` of a selection metric computed from stored predictions: ``val/mAP_best`` ->
    ``("val", "mAP")``."""
    split, _, name = metric.partition("/")
    name = name.removesuffix("_best")
    macros = {m.name for m in SUITE.per_class(val_thresholds=False)}
    if split not in SPLITS or name not in macros:
        names = "|".join(sorted(macros))
        raise NotSignificant(f"--require-significant tests a suite metric on a split's stored predictions "
                             f"(<{'|'.join(SPLITS)}>/<{names}>); {metric!r} is not one: register without it, or "
                             "rank by METRIC=val/mAP")  # fmt: skip
    return split, name


def require_significant_gain(client: MlflowClient, run_id: str, champion, metric: str,
                             settings: Settings | None = None) -> str:  # fmt: skip
    """The line to print when ``run_id`` may become champion; raises :class:`NotSignificant` otherwise.

    Args:
        run_id: the run about to be registered.
        champion: the current alias holder (a ``ModelVersion``) or None.
        metric: the ranking metric (``val/mAP``).
    """
    if champion is None:
        return f"--require-significant: no current champion, nothing to beat; registering run {run_id}"
    if champion.run_id == run_id:
        return f"--require-significant: run {run_id} already is the champion (version {champion.version})"
    split, name = tested_metric(metric)
    settings = settings or Settings()
    with tempfile.TemporaryDirectory() as tmp:
        frames = {}
        for label, run in ((f"champion run {champion.run_id[:8]}", champion.run_id), (f"run {run_id[:8]}", run_id)):
            folder = Path(tmp) / run
            folder.mkdir()
            frames[label] = read_split(client, run, split, str(folder))
    try:
        data = align(frames)
    except DifferentTestSets as error:
        raise NotSignificant(f"--require-significant cannot compare the two runs: {error}") from None
    old, new = (entry_replicates(data.targets, [probs], data.labels, n_boot=settings.n_boot, seed=settings.seed,
                                 strata=data.strata, threshold=settings.threshold, macros=(name,))[name]
                for probs in data.probs.values())  # fmt: skip
    (d,) = paired_difference(old, new, seed_noise(settings.n_boot, settings.seed), settings.ci)
    better = (d.value > 0) == higher_is_better(name) and d.value != 0
    summary = (f"{split}/{name} {d.value:+.4f} [{d.low:+.4f}, {d.high:+.4f}], p = {d.p:.2g} (paired bootstrap, "
               f"{settings.n_boot} resamples of the {split} predictions, against champion version {champion.version}, "
               f"run {champion.run_id})")  # fmt: skip
    if better and d.p < settings.alpha:
        return f"--require-significant: run {run_id} beats the champion significantly: {summary}; registering"
    raise NotSignificant(f"not registered: run {run_id} does not beat the champion significantly (p < "
                         f"{settings.alpha}, better direction): {summary}. Without --require-significant it would "
                         "be registered")  # fmt: skip
