"""The unseen-class report of a zero-shot run: scores of the classes training never saw, overall and per centre.

Two steps, like :func:`evaluation.evaluate.evaluate` and :func:`evaluation.evaluate.store`: :func:`compute_unseen`
is pure (predictions and metrics, nothing logged), :func:`store_unseen` writes it into a run. The unseen labels
come from the data module (``unseen_test_targets``: the full manifest the leak guard set aside, test split only).
Every macro metric carries its bootstrap CI (docs/rules.md §3). Two reference points ride along on the same
machinery: a seeded uniform-random score (``test_unseen_random/...``: AUROC 0.5, AP about the prevalence) and the
prevalence baseline mAP.

CXR-LT 2026 scores Task 2 on two fixed test sets, an internal one (PadChest-GR) and an external one (NIH), with
bootstrap resampling within each source. So every figure here resamples within source: per centre
(``test_unseen/source/<name>/...``), the internal test, the external test (every other centre), and the pooled
test (all images; each resample keeps every source's image count, ``evaluation.bootstrap``). Which centre is
internal is a definition, not a property of the data: the data config names it (``data.internal_source``:
``padchest`` for CXR-LT 2026), since "the centre with most training images" would change with a user's subset.
Without that key the internal/external reports are left out (logged); the mapping is recorded as run tags.
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

from evaluation.evaluate import MACROS
from evaluation.metrics import prevalence_baseline_map
from evaluation.prediction_columns import ID_COLUMN, TRUE_PREFIX
from evaluation.suite import compute_suite
from evaluation.tta import TTAPredictor

log = logging.getLogger(__name__)

RANDOM_SEED = 12345


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
        metrics: flat ``test_unseen/...`` (pooled, all classes), ``test_unseen/{pooled,internal,external}/...`` and
            ``test_unseen/source/<name>/...`` (macros), and the same under ``test_unseen_random/``.
        predictions: one row per test image: ids, source, the unseen probabilities and ``true/<class>``.
        unseen: the unseen class names.
        internal: the internal centre, or None without a source column.
        external: the other centres.
        sources: the test's centres; with more than one, every bootstrap resampled within them.
        transfer: how unseen scores were made (the adapter's transfer and whether it was chosen), or None.
    """

    metrics: dict[str, float]
    predictions: pd.DataFrame
    unseen: list[str]
    internal: str | None = None
    external: list[str] = field(default_factory=list)
    transfer: str | None = None
    sources: list[str] = field(default_factory=list)

    @property
    def tags(self) -> dict[str, str]:
        tags = {"cxrlt.zeroshot.transfer": self.transfer} if self.transfer else {}
        if len(self.sources) > 1:
            tags["cxrlt.unseen.bootstrap"] = f"resampled within source ({', '.join(self.sources)})"
        if self.internal is not None:
            tags["cxrlt.unseen.internal_source"] = self.internal
            tags["cxrlt.unseen.external_sources"] = ",".join(self.external)
        return tags

    def summary(self) -> str:
        return summary_table(self.metrics, self.unseen, self.internal, self.transfer)


def _macros(metrics: dict[str, float]) -> dict[str, float]:
    return {k: v for k, v in metrics.items() if k.split("_ci_")[0] in MACROS and np.isfinite(v)}


def unseen_scopes(sources: np.ndarray | None, internal: str | None) -> dict[str, np.ndarray]:
    """Scope name (``pooled``, ``internal``, ``external``, ``source/<name>``) -> row indices of the test set.

    With one source or none there is only the pooled test; the internal/external pair needs a configured internal
    source that is among the test rows (the others together are the external test).
    """
    if sources is None or len(set(sources)) < 2:
        return {}
    scopes = {"pooled": np.arange(len(sources))}
    if internal is not None and internal in set(sources):
        scopes["internal"] = np.flatnonzero(sources == internal)
        scopes["external"] = np.flatnonzero(sources != internal)
    for name in sorted(set(sources)):
        scopes[f"source/{name}"] = np.flatnonzero(sources == name)
    return scopes


def unseen_metrics(targets: np.ndarray, probs: np.ndarray, labels: list[str], sources: np.ndarray | None,
                   n_boot: int, seed: int, threshold: float, internal: str | None = None) -> dict[str, float]:  # fmt: skip
    """Flat ``test_unseen/...`` (the pooled test, per class too), ``test_unseen/<scope>/...`` macros for each scope
    of :func:`unseen_scopes`, and the same under ``test_unseen_random/``; every bootstrap resamples within source.
    """
    suite = dict(labels=labels, n_boot=n_boot, seed=seed, threshold=threshold)
    random = np.random.default_rng(RANDOM_SEED).random(probs.shape)
    scopes = unseen_scopes(sources, internal)
    out: dict[str, float] = {}
    for prefix, scores in (("test_unseen", probs), ("test_unseen_random", random)):
        result = compute_suite(targets, scores, **suite, strata=sources)
        keep = result.metrics if prefix == "test_unseen" else _macros(result.metrics)
        out.update({f"{prefix}/{k}": v for k, v in keep.items() if np.isfinite(v)})
        for scope, index in scopes.items():
            part = result if scope == "pooled" else compute_suite(targets[index], scores[index], **suite,
                                                                  strata=sources[index])  # fmt: skip
            out.update({f"{prefix}/{scope}/{k}": v for k, v in _macros(part.metrics).items()})
    out["test_unseen/prevalence_baseline_mAP"] = prevalence_baseline_map(targets)
    return out


def configured_internal_source(cfg) -> str | None:
    """The data config's ``internal_source`` (the centre that is the internal test by definition), or None."""
    data = cfg.get("data") if hasattr(cfg, "get") else None
    value = data.get("internal_source") if data is not None and hasattr(data, "get") else None
    return str(value) if value not in (None, "") else None


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
    probs = TTAPredictor(["identity"], batch_size=datamodule.batch_size).predict(
        UnseenScorer(model), datamodule.eval_dataloader("test")
    )  # (N, U)
    rows = datamodule.split_frame("test")
    sources = rows["source"].astype(str).to_numpy() if "source" in rows else None
    ev = cfg.evaluation
    internal = configured_internal_source(cfg) if sources is not None else None
    if sources is not None and len(set(sources)) > 1 and internal not in set(sources):
        log.warning("unseen-class report: no internal/external split (data.internal_source=%r is not among the test "
                    "sources %s); pooled and per-source figures only", internal, sorted(set(sources)))  # fmt: skip
        internal = None
    metrics = unseen_metrics(targets, probs, unseen, sources, ev.n_boot, ev.seed, ev.threshold, internal)
    external = sorted(set(sources) - {internal}) if internal is not None else []
    transfer = getattr(model, "transfer", None)  # the semantic adapter's transfer, chosen on validation or fixed
    if transfer:
        how = "chosen on proxy-OOD validation" if getattr(model, "auto_transfer", False) else "as configured"
        transfer = f"{transfer}, {how}"
    frame = pd.concat(
        [rows[[ID_COLUMN] + [c for c in ("source",) if c in rows]].reset_index(drop=True),
         pd.DataFrame(probs, columns=unseen), pd.DataFrame(targets.astype(int), columns=[TRUE_PREFIX + n for n in unseen])],
        axis=1,
    )  # fmt: skip
    centres = sorted(set(sources)) if sources is not None else []
    return UnseenReport(metrics, frame, unseen, internal, external, transfer or None, centres)


def store_unseen(report: UnseenReport, log_metrics: Callable[[dict], None],
                 log_artifact: Callable[[Path, str], None], set_tags: Callable[[dict], None]) -> None:  # fmt: skip
    """Log the report's metrics and tags, and ``predictions/test_unseen.csv`` + ``evaluation/unseen_report.md``."""
    log_metrics(report.metrics)
    set_tags(report.tags)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "test_unseen.csv"
        report.predictions.to_csv(path, index=False)
        log_artifact(path, "predictions")
        summary = Path(tmp) / "unseen_report.md"
        summary.write_text(report.summary())
        log_artifact(summary, "evaluation")
    log.info("\n%s", report.summary())


def summary_table(
    metrics: dict[str, float], unseen: list[str], internal: str | None, transfer: str | None = None
) -> str:
    """Markdown: mAP and mAUROC with CIs on the pooled, internal and external tests and per centre, against the
    random-score baseline."""

    def cell(prefix: str, macro: str) -> str:
        value = metrics.get(f"{prefix}/{macro}")
        if value is None:
            return "n/a"
        low, high = metrics.get(f"{prefix}/{macro}_ci_low"), metrics.get(f"{prefix}/{macro}_ci_high")
        return f"{value:.3f} [{low:.3f}, {high:.3f}]" if low is not None else f"{value:.3f}"

    def role(name: str) -> str:
        return name if internal is None else f"{name} ({'internal' if name == internal else 'external'})"

    present = {k.split("/")[1] for k in metrics if k.startswith("test_unseen/")}
    scopes = [("pooled (resampled within source)" if "pooled" in present else "overall", "")]
    scopes += [(f"internal ({internal})", "/internal")] if "internal" in present else []
    scopes += [("external", "/external")] if "external" in present else []
    scopes += sorted({(role(k.split("/")[2]), f"/source/{k.split('/')[2]}") for k in metrics
                      if k.startswith("test_unseen/source/")})  # fmt: skip
    chosen = f" (transfer: {transfer})" if transfer else ""
    lines = [f"Unseen classes (zero-shot): {', '.join(unseen)}{chosen}", "",
             "| test set | mAP | mAUROC | random mAP | random mAUROC |", "|---|---|---|---|---|"]  # fmt: skip
    for label, suffix in scopes:
        lines.append(f"| {label} | {cell('test_unseen' + suffix, 'mAP')} | {cell('test_unseen' + suffix, 'mAUROC')} | "
                     f"{cell('test_unseen_random' + suffix, 'mAP')} | {cell('test_unseen_random' + suffix, 'mAUROC')} |")  # fmt: skip
    per_class = [f"{n}: AP {metrics.get(f'test_unseen/ap/{n}', float('nan')):.3f}, "
                 f"AUROC {metrics.get(f'test_unseen/auroc/{n}', float('nan')):.3f}" for n in unseen]  # fmt: skip
    return "\n".join(lines + ["", "Per class: " + "; ".join(per_class), ""])
