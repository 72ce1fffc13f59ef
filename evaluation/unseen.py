"""The unseen-class report of a zero-shot run: scores of the classes training never saw, overall and per centre.

:func:`compute_unseen` is pure, :func:`store_unseen` logs it; the unseen labels come from the full manifest the
leak guard set aside. A seeded uniform-random score and the prevalence baseline ride along as references.
Every figure resamples within its centres, the pooled test too (two fixed test sets, not one sample; the other
reading is an alternative, :mod:`evaluation.conventions`). Which centre is internal is a definition, named by
``data.internal_source``, since "the centre with most training images" would change with a user's subset;
without it the internal/external reports are left out. The sets are those of
``evaluation.metric_registry.UNSEEN_SETS`` (docs/rules.md §4, §10).
"""

from __future__ import annotations

import logging
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
from torch import nn

from evaluation.conventions import UNSEEN_POOLED, Conventions, alternative_metrics, unseen_pooled_alternative
from evaluation.evaluate import MACROS
from evaluation.heldout import UNSEEN_ARTIFACT, HeldoutDraw, draw_unseen, write_record
from evaluation.metric_registry import UNSEEN_SCOPES, UNSEEN_SETS
from evaluation.metrics import prevalence_baseline_map
from evaluation.perturbed_split import predict_perturbed
from evaluation.prediction_columns import ID_COLUMN, TRUE_PREFIX
from evaluation.scopes import unseen_scopes
from evaluation.suite import compute_suite
from evaluation.tta import TTAPredictor

log = logging.getLogger(__name__)

RANDOM_SEED = 12345
TEST, TTA, PERTURBED, HELDOUT = (s.prefix for s in UNSEEN_SETS)


class UnseenScorer(nn.Module):
    """A view of a zero-shot model whose ``forward`` returns the unseen-class logits (for ``TTAPredictor``)."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, images):
        return self.model.unseen_logits(images)  # (B, U)


@dataclass
class UnseenReport:
    """What :func:`compute_unseen` found; :func:`store_unseen` logs it.

    Attributes:
        metrics: flat ``test_unseen/...`` (pooled, all classes), ``test_unseen/{pooled,internal,external}/...``,
            ``test_unseen/source/<name>/...``, the same under ``test_unseen_random/``, and the other sets of
            ``UNSEEN_SETS``.
        internal: the internal centre, or None without a source column.
        sources: the test's centres; with more than one, every bootstrap resampled within them.
        frames: predictions of the other sets by prefix (``test_unseen_tta``, ..., ``heldout_unseen``).
    """

    metrics: dict[str, float]
    predictions: pd.DataFrame
    unseen: list[str]
    internal: str | None = None
    external: list[str] = field(default_factory=list)
    transfer: str | None = None
    sources: list[str] = field(default_factory=list)
    frames: dict[str, pd.DataFrame] = field(default_factory=dict)
    heldout: HeldoutDraw | None = None
    pooled_bootstrap: str = "within_source"

    @property
    def tags(self) -> dict[str, str]:
        tags = {"cxrlt.zeroshot.transfer": self.transfer} if self.transfer else {}
        if len(self.sources) > 1:
            tags["cxrlt.unseen.bootstrap"] = f"resampled within source ({', '.join(self.sources)})" + (
                "" if self.pooled_bootstrap == "within_source" else f"; pooled {UNSEEN_POOLED[self.pooled_bootstrap]}"
            )
        if self.internal is not None:
            tags["cxrlt.unseen.internal_source"] = self.internal
            tags["cxrlt.unseen.external_sources"] = ",".join(self.external)
        if self.heldout is not None:
            tags["cxrlt.heldout_unseen.split"] = self.heldout.split
        return tags

    def summary(self) -> str:
        return summary_table(self.metrics, self.unseen, self.internal, self.transfer, self.heldout,
                             pooled=UNSEEN_POOLED[self.pooled_bootstrap])  # fmt: skip


def _macros(metrics: dict[str, float]) -> dict[str, float]:
    return {k: v for k, v in metrics.items() if k.split("_ci_")[0] in MACROS and np.isfinite(v)}


def scoped_metrics(prefix: str, targets: np.ndarray, scores: np.ndarray, sources: np.ndarray | None,
                   internal: str | None, suite: dict, per_class: bool = False,
                   within_source: bool = True) -> dict[str, float]:  # fmt: skip
    """``<prefix>/<macro>`` on all images (resampled within source unless ``within_source`` is false: the
    ``unseen_pooled_bootstrap`` convention), ``<prefix>/<scope>/<macro>`` for each scope of :func:`unseen_scopes`
    (each resampled within its own centres), and per class when ``per_class``."""
    result = compute_suite(targets, scores, **suite, strata=sources if within_source else None)
    keep = result.metrics if per_class else _macros(result.metrics)
    out = {f"{prefix}/{k}": v for k, v in keep.items() if np.isfinite(v)}
    for scope, index in unseen_scopes(sources, internal).items():
        part = result if scope == "pooled" else compute_suite(targets[index], scores[index], **suite,
                                                              strata=sources[index])  # fmt: skip
        out.update({f"{prefix}/{scope}/{k}": v for k, v in _macros(part.metrics).items()})
    return out


def unseen_metrics(targets: np.ndarray, probs: np.ndarray, labels: list[str], sources: np.ndarray | None,
                   n_boot: int, seed: int, threshold: float, internal: str | None = None,
                   conventions: Conventions | None = None) -> dict[str, float]:  # fmt: skip
    """Flat ``test_unseen/...`` (the pooled test, per class too), ``test_unseen/<scope>/...`` macros for each scope
    of :func:`unseen_scopes`, and the same under ``test_unseen_random/``; every bootstrap resamples within source
    (the pooled test as ``conventions`` say). With ``conventions``, which then carry the threshold, the pooled
    test's alternative readings too (``test_unseen/alternative/...``).
    """
    given = conventions is not None
    conventions = conventions or Conventions(threshold=threshold)
    suite = dict(labels=labels, n_boot=n_boot, seed=seed, **conventions.suite_kwargs())
    within = conventions.unseen_within_source
    random = np.random.default_rng(RANDOM_SEED).random(probs.shape)
    out = scoped_metrics(TEST, targets, probs, sources, internal, suite, per_class=True, within_source=within)
    out.update(scoped_metrics(f"{TEST}_random", targets, random, sources, internal, suite, within_source=within))
    if given:
        pooled = sources if within else None
        other = alternative_metrics(targets, probs, labels, conventions, n_boot, seed, strata=pooled)
        other.update(unseen_pooled_alternative(targets, probs, labels, sources, conventions, n_boot, seed))
        out.update({f"{TEST}/{key}": value for key, value in other.items()})
    out[f"{TEST}/prevalence_baseline_mAP"] = prevalence_baseline_map(targets)
    return out


def perturbation_deltas(metrics: dict[str, float]) -> dict[str, float]:
    """``test_unseen_perturbed[/<scope>]/delta/<macro>``: perturbed minus plain, for every scope both have."""
    out = {}
    for scope in ("", *(f"/{s}" for s in UNSEEN_SCOPES)):
        for macro in MACROS:
            plain, perturbed = metrics.get(f"{TEST}{scope}/{macro}"), metrics.get(f"{PERTURBED}{scope}/{macro}")
            if plain is not None and perturbed is not None:
                out[f"{PERTURBED}{scope}/delta/{macro}"] = perturbed - plain
    return out


def configured_internal_source(cfg) -> str | None:
    """The data config's ``internal_source`` (the centre that is the internal test by definition), or None."""
    data = cfg.get("data") if hasattr(cfg, "get") else None
    value = data.get("internal_source") if data is not None and hasattr(data, "get") else None
    return str(value) if value not in (None, "") else None


def _frame(rows: pd.DataFrame, probs: np.ndarray, targets: np.ndarray, unseen: list[str]) -> pd.DataFrame:
    """Ids (and source), the unseen probabilities and ``true/<class>``: ``predictions/<set>.csv``."""
    return pd.concat(
        [rows[[ID_COLUMN] + [c for c in ("source",) if c in rows]].reset_index(drop=True),
         pd.DataFrame(probs, columns=unseen), pd.DataFrame(targets.astype(int), columns=[TRUE_PREFIX + n for n in unseen])],
        axis=1,
    )  # fmt: skip


def _sources(rows: pd.DataFrame) -> np.ndarray | None:
    return rows["source"].astype(str).to_numpy() if "source" in rows else None


def _test_copies(scorer: UnseenScorer, datamodule, cfg) -> dict[str, np.ndarray]:
    """``{prefix: (N, U) probabilities}`` of the TTA and perturbed test copies the run's config switches on."""
    copies = {}
    if cfg.tta.enabled:
        copies[TTA] = TTAPredictor.from_config(cfg.tta).predict(scorer, datamodule.eval_dataloader("test"))
    if cfg.evaluation.perturbation.enabled:  # the same cached perturbed images as test_perturbed/
        copies[PERTURBED] = predict_perturbed(scorer, datamodule, cfg.evaluation.perturbation, "test")
    return copies


def _heldout(scorer: UnseenScorer, datamodule, cfg, unseen: list[str], internal: str | None, suite: dict):
    """``(metrics, frame, draw)`` of ``heldout_unseen``, or None when the subset is off, the data module cannot give
    the split as released, or the draw has no labelled unseen class (each logged)."""
    if not hasattr(datamodule, "unseen_split"):
        return None
    try:
        drawn = draw_unseen(scorer, datamodule, cfg, unseen)
    except ValueError as error:  # ManifestError too: a split without the unseen columns
        log.warning("no held-out unseen-class figures: %s", error)
        return None
    if drawn is None:
        return None
    sources = _sources(drawn.rows)
    inside = internal if sources is not None and internal in set(sources) else None
    within = Conventions.from_config(cfg.evaluation).unseen_within_source
    metrics = scoped_metrics(HELDOUT, drawn.targets, drawn.probs, sources, inside, suite, within_source=within)
    if f"{HELDOUT}/mAP" not in metrics:
        log.warning("no held-out unseen-class figures: the %s draw has no positive of any unseen class",
                    drawn.draw.describe(with_caveat=False))  # fmt: skip
        return None
    metrics[f"{HELDOUT}/prevalence_baseline_mAP"] = prevalence_baseline_map(drawn.targets)
    metrics[f"{HELDOUT}/n_images"] = float(len(drawn.rows))
    metrics[f"{HELDOUT}/trained_on"] = float(drawn.draw.trained_on)
    return metrics, _frame(drawn.rows, drawn.probs, drawn.targets, unseen), drawn.draw


def compute_unseen(model, datamodule, cfg) -> UnseenReport | None:
    """The unseen-class report of a zero-shot model; None for other models, or when the manifest has no labels
    for the unseen classes (which is logged)."""
    unseen = list(getattr(model, "unseen", None) or [])
    if not unseen or not hasattr(model, "unseen_logits"):
        return None
    try:
        targets = datamodule.unseen_test_targets(unseen)
    except ValueError as error:  # ManifestError too: e.g. a test manifest without the unseen columns
        log.warning("no unseen-class report: %s", error)
        return None
    scorer = UnseenScorer(model)
    probs = TTAPredictor(["identity"], batch_size=datamodule.batch_size).predict(
        scorer, datamodule.eval_dataloader("test")
    )  # (N, U)
    rows = datamodule.split_frame("test")
    sources = _sources(rows)
    ev = cfg.evaluation
    internal = configured_internal_source(cfg) if sources is not None else None
    if sources is not None and len(set(sources)) > 1 and internal not in set(sources):
        log.warning("unseen-class report: no internal/external split (data.internal_source=%r is not among the test "
                    "sources %s); pooled and per-source figures only", internal, sorted(set(sources)))  # fmt: skip
        internal = None
    conventions = Conventions.from_config(ev)
    metrics = unseen_metrics(targets, probs, unseen, sources, ev.n_boot, ev.seed, ev.threshold, internal, conventions)
    suite = dict(labels=unseen, n_boot=ev.n_boot, seed=ev.seed, **conventions.suite_kwargs())
    frames = {}
    for prefix, copy in _test_copies(scorer, datamodule, cfg).items():
        metrics.update(scoped_metrics(prefix, targets, copy, sources, internal, suite,
                                      within_source=conventions.unseen_within_source))  # fmt: skip
        frames[prefix] = _frame(rows, copy, targets, unseen)
    metrics.update(perturbation_deltas(metrics))
    heldout = _heldout(scorer, datamodule, cfg, unseen, configured_internal_source(cfg), suite)
    draw = None
    if heldout is not None:
        held_metrics, frames[HELDOUT], draw = heldout
        metrics.update(held_metrics)
    external = sorted(set(sources) - {internal}) if internal is not None else []
    transfer = getattr(model, "transfer", None)  # the semantic adapter's transfer, chosen on validation or fixed
    if transfer:
        how = "chosen on proxy-OOD validation" if getattr(model, "auto_transfer", False) else "as configured"
        transfer = f"{transfer}, {how}"
    centres = sorted(set(sources)) if sources is not None else []
    return UnseenReport(metrics, _frame(rows, probs, targets, unseen), unseen, internal, external, transfer or None,
                        centres, frames, draw, conventions.unseen_pooled_bootstrap)  # fmt: skip


def store_unseen(report: UnseenReport, log_metrics: Callable[[dict], None],
                 log_artifact: Callable[[Path, str], None], set_tags: Callable[[dict], None]) -> None:  # fmt: skip
    """Log the report's metrics and tags, ``predictions/test_unseen.csv`` (and one CSV per other set),
    ``evaluation/unseen_report.md`` and the held-out draw's ``evaluation/heldout_unseen.json``."""
    log_metrics(report.metrics)
    set_tags(report.tags)
    with tempfile.TemporaryDirectory() as tmp:
        for prefix, frame in {TEST: report.predictions, **report.frames}.items():
            path = Path(tmp) / f"{prefix}.csv"
            frame.to_csv(path, index=False)
            log_artifact(path, "predictions")
        summary = Path(tmp) / "unseen_report.md"
        summary.write_text(report.summary())
        log_artifact(summary, "evaluation")
        if report.heldout is not None:
            log_artifact(write_record(report.heldout, Path(tmp) / UNSEEN_ARTIFACT), str(Path(UNSEEN_ARTIFACT).parent))
    log.info("\n%s", report.summary())


def _cell(metrics: dict[str, float], key: str) -> str:
    value = metrics.get(key)
    if value is None:
        return "n/a"
    low, high = metrics.get(f"{key}_ci_low"), metrics.get(f"{key}_ci_high")
    return f"{value:.3f} [{low:.3f}, {high:.3f}]" if low is not None else f"{value:.3f}"


def _scope_rows(metrics: dict[str, float], prefix: str, internal: str | None,
                pooled: str = UNSEEN_POOLED["within_source"]) -> list[tuple[str, str]]:  # fmt: skip
    """``(row label, key suffix)`` of the scopes ``prefix`` logged: pooled (labelled with how it was resampled),
    internal, external, then per centre."""

    def role(name: str) -> str:
        return name if internal is None else f"{name} ({'internal' if name == internal else 'external'})"

    present = {k.split("/")[1] for k in metrics if k.startswith(f"{prefix}/")}
    scopes = [(f"pooled ({pooled})" if "pooled" in present else "overall", "")]
    scopes += [(f"internal ({internal})", "/internal")] if "internal" in present else []
    scopes += [("external", "/external")] if "external" in present else []
    scopes += sorted({(role(k.split("/")[2]), f"/source/{k.split('/')[2]}") for k in metrics
                      if k.startswith(f"{prefix}/source/")})  # fmt: skip
    return scopes


def analyses_table(metrics: dict[str, float], internal: str | None, macro: str = "mAP",
                   pooled: str = UNSEEN_POOLED["within_source"]) -> list[str]:  # fmt: skip
    """Markdown: ``macro`` with CIs of every Task 2 analysis (test, TTA, perturbed, its delta, held-out) on the
    pooled, internal and external tests; a set the run did not compute is left out, a scope it lacks is ``n/a``."""
    sets = [s for s in UNSEEN_SETS if f"{s.prefix}/{macro}" in metrics]
    if len(sets) < 2:
        return []
    header = [s.title for s in sets] + (["perturbed - test"] if any(s.prefix == PERTURBED for s in sets) else [])
    how = "" if pooled == UNSEEN_POOLED["within_source"] else f", the pooled test {pooled}"
    lines = [f"Task 2 analyses ({macro}, 95% CI, bootstrap within source{how}):", "",
             "| scope | " + " | ".join(header) + " |", "|---" * (len(header) + 1) + "|"]  # fmt: skip
    for label, suffix in _scope_rows(metrics, TEST, internal, pooled)[:3]:
        cells = [_cell(metrics, f"{s.prefix}{suffix}/{macro}") for s in sets]
        if len(header) > len(sets):
            delta = metrics.get(f"{PERTURBED}{suffix}/delta/{macro}")
            cells.append("n/a" if delta is None else f"{delta:+.3f}")
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return lines


def summary_table(metrics: dict[str, float], unseen: list[str], internal: str | None, transfer: str | None = None,
                  heldout: HeldoutDraw | None = None, pooled: str = UNSEEN_POOLED["within_source"]) -> str:  # fmt: skip
    """Markdown: mAP and mAUROC with CIs on the pooled, internal and external tests and per centre, against the
    random-score baseline; then the Task 2 analyses (:func:`analyses_table`) and what the held-out draw is."""
    chosen = f" (transfer: {transfer})" if transfer else ""
    lines = [f"Unseen classes (zero-shot): {', '.join(unseen)}{chosen}", "",
             "| test set | mAP | mAUROC | random mAP | random mAUROC |", "|---|---|---|---|---|"]  # fmt: skip
    for label, suffix in _scope_rows(metrics, TEST, internal, pooled):
        cells = [
            _cell(metrics, f"{prefix}{suffix}/{m}") for prefix in (TEST, f"{TEST}_random") for m in ("mAP", "mAUROC")
        ]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    per_class = [f"{n}: AP {metrics.get(f'{TEST}/ap/{n}', float('nan')):.3f}, "
                 f"AUROC {metrics.get(f'{TEST}/auroc/{n}', float('nan')):.3f}" for n in unseen]  # fmt: skip
    lines += ["", "Per class: " + "; ".join(per_class), ""]
    analyses = analyses_table(metrics, internal, pooled=pooled)
    if analyses:
        lines += [*analyses, ""]
    if heldout is not None and f"{HELDOUT}/mAP" in metrics:
        lines += [f"Held-out subset: {heldout.describe()}; drawn from the split as released (images a training rule "
                  f"set aside included), ids in `{UNSEEN_ARTIFACT}`.", ""]  # fmt: skip
    return "\n".join(lines)
