"""The unseen-class report: zero-shot scores of the unseen classes on the test split, overall and per centre.

Runs after the ordinary (seen-class) evaluation of a zero-shot task. The unseen labels are read here and only
here, from the full manifest the leak guard set aside, for the test split: training never had them. Every macro
metric carries its 1,000-resample bootstrap CI (``evaluation.suite.compute_suite``), per centre the bootstrap
runs within the centre. Two reference points ride along, from the same resamples' machinery: a seeded
uniform-random score (``test_unseen_random/...``: AUROC 0.5, AP about the prevalence) and the prevalence
baseline mAP.

The centre with the most training images is the **internal** test, every other centre **external**
(CXR-LT 2026: PadChest-GR internal, NIH external); the mapping is recorded as run tags.
"""

from __future__ import annotations

import logging
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd
from torch import nn

from evaluation.evaluate import MACROS
from evaluation.metrics import prevalence_baseline_map
from evaluation.suite import compute_suite
from evaluation.tta import TTAPredictor
from training.data.findings import KNOWN_FINDINGS
from training.data.manifest import load_manifest

log = logging.getLogger(__name__)

RANDOM_SEED = 12345


class UnseenScorer(nn.Module):
    """A view of a zero-shot model whose ``forward`` returns the unseen-class logits (for ``TTAPredictor``)."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, images):
        return self.model.unseen_logits(images)  # (B, U)


def unseen_test_targets(datamodule, unseen: list[str]) -> np.ndarray:
    """``(N, U)`` test targets of the unseen classes, aligned with the data module's test split (-1 = missing)."""
    source = datamodule.source
    manifest_path = getattr(source, "full_manifest", None) or source.prepare()
    full = load_manifest(manifest_path, unseen, KNOWN_FINDINGS, root=source.root, check_files=False,
                         extra_columns=tuple(getattr(source, "extra_columns", ())))  # fmt: skip
    rows = datamodule.split_frame("test")
    full_rows = full.split("test").iloc[: len(rows)]
    if list(full_rows["image_id"]) != list(rows["image_id"]):
        raise ValueError(f"{manifest_path}: test rows differ from the training manifest's; cannot align labels")
    return full.targets("test")[: len(rows)]


def _macros(metrics: dict[str, float]) -> dict[str, float]:
    return {k: v for k, v in metrics.items() if k.split("_ci_")[0] in MACROS and np.isfinite(v)}


def unseen_metrics(targets: np.ndarray, probs: np.ndarray, labels: list[str], sources: np.ndarray | None,
                   n_boot: int, seed: int, threshold: float) -> dict[str, float]:  # fmt: skip
    """Flat ``test_unseen/...``, ``test_unseen/source/<name>/...`` and ``test_unseen_random/...`` metrics."""
    suite = dict(labels=labels, n_boot=n_boot, seed=seed, threshold=threshold)
    random = np.random.default_rng(RANDOM_SEED).random(probs.shape)
    out: dict[str, float] = {}
    for prefix, scores in (("test_unseen", probs), ("test_unseen_random", random)):
        result = compute_suite(targets, scores, **suite)
        keep = result.metrics if prefix == "test_unseen" else _macros(result.metrics)
        out.update({f"{prefix}/{k}": v for k, v in keep.items() if np.isfinite(v)})
        if sources is not None and len(set(sources)) > 1:
            for name in sorted(set(sources)):
                index = np.flatnonzero(sources == name)
                part = compute_suite(targets[index], scores[index], **suite)
                out.update({f"{prefix}/source/{name}/{k}": v for k, v in _macros(part.metrics).items()})
    out["test_unseen/prevalence_baseline_mAP"] = prevalence_baseline_map(targets)
    return out


def internal_source(datamodule) -> str | None:
    """The centre contributing most training images (the internal test), or None without a source column."""
    train = datamodule.split_frame("train")
    return str(train["source"].value_counts().idxmax()) if "source" in train else None


def report_unseen(model, datamodule, cfg, session) -> dict[str, float]:
    """Score, log and store the unseen-class report of a zero-shot run; a no-op for other models.

    Returns the logged metrics (empty when the model has no unseen classes or the manifest has no labels for
    them, which is logged).
    """
    unseen = list(getattr(model, "unseen", None) or [])
    if not unseen or not hasattr(model, "unseen_logits"):
        return {}
    try:
        targets = unseen_test_targets(datamodule, unseen)
    except ValueError as error:  # ManifestError too: e.g. a test manifest without the unseen columns
        log.warning("no unseen-class report: %s", error)
        return {}
    probs = TTAPredictor(["identity"], batch_size=datamodule.batch_size).predict(
        UnseenScorer(model), datamodule.eval_dataloader("test")
    )  # (N, U)
    rows = datamodule.split_frame("test")
    sources = rows["source"].astype(str).to_numpy() if "source" in rows else None
    ev = cfg.evaluation
    metrics = unseen_metrics(targets, probs, unseen, sources, ev.n_boot, ev.seed, ev.threshold)
    session.log_metrics(metrics)
    internal = internal_source(datamodule)
    transfer = getattr(model, "transfer", None)  # the semantic adapter's transfer, chosen on validation or fixed
    if transfer:
        how = "chosen on proxy-OOD validation" if getattr(model, "auto_transfer", False) else "as configured"
        transfer = f"{transfer}, {how}"
        session.client.set_tag(session.run_id, "cxrlt.zeroshot.transfer", transfer)
    if internal is not None and sources is not None:
        external = sorted(set(sources) - {internal})
        session.client.set_tag(session.run_id, "cxrlt.unseen.internal_source", internal)
        session.client.set_tag(session.run_id, "cxrlt.unseen.external_sources", ",".join(external))
    frame = pd.concat(
        [rows[["image_id"] + [c for c in ("source",) if c in rows]].reset_index(drop=True),
         pd.DataFrame(probs, columns=unseen), pd.DataFrame(targets.astype(int), columns=[f"true/{n}" for n in unseen])],
        axis=1,
    )  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "test_unseen.csv"
        frame.to_csv(path, index=False)
        session.log_artifact(path, "predictions")
        summary = Path(tmp) / "unseen_report.md"
        summary.write_text(summary_table(metrics, unseen, internal, transfer))
        session.log_artifact(summary, "evaluation")
    log.info("\n%s", summary_table(metrics, unseen, internal, transfer))
    return metrics


def summary_table(
    metrics: dict[str, float], unseen: list[str], internal: str | None, transfer: str | None = None
) -> str:
    """Markdown: mAP and mAUROC with CIs overall and per centre, against the random-score baseline."""

    def cell(prefix: str, macro: str) -> str:
        value = metrics.get(f"{prefix}/{macro}")
        if value is None:
            return "n/a"
        low, high = metrics.get(f"{prefix}/{macro}_ci_low"), metrics.get(f"{prefix}/{macro}_ci_high")
        return f"{value:.3f} [{low:.3f}, {high:.3f}]" if low is not None else f"{value:.3f}"

    scopes = [("overall", "")] + sorted(
        {(k.split("/")[2], f"/source/{k.split('/')[2]}") for k in metrics if k.startswith("test_unseen/source/")}
    )
    chosen = f" (transfer: {transfer})" if transfer else ""
    lines = [f"Unseen classes (zero-shot): {', '.join(unseen)}{chosen}", "",
             "| test set | mAP | mAUROC | random mAP | random mAUROC |", "|---|---|---|---|---|"]  # fmt: skip
    for name, suffix in scopes:
        label = name if name == "overall" else f"{name} ({'internal' if name == internal else 'external'})"
        lines.append(f"| {label} | {cell('test_unseen' + suffix, 'mAP')} | {cell('test_unseen' + suffix, 'mAUROC')} | "
                     f"{cell('test_unseen_random' + suffix, 'mAP')} | {cell('test_unseen_random' + suffix, 'mAUROC')} |")  # fmt: skip
    per_class = [f"{n}: AP {metrics.get(f'test_unseen/ap/{n}', float('nan')):.3f}, "
                 f"AUROC {metrics.get(f'test_unseen/auroc/{n}', float('nan')):.3f}" for n in unseen]  # fmt: skip
    return "\n".join(lines + ["", "Per class: " + "; ".join(per_class), ""])
