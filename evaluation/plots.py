"""Figures for a run: PR curves, reliability, head-to-tail bars with CIs, perturbation deltas."""

from __future__ import annotations

import warnings
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from sklearn.metrics import precision_recall_curve  # noqa: E402

from evaluation.conventions import of_evaluation  # noqa: E402
from evaluation.groups import GROUPS  # noqa: E402


def _pick_classes(evaluation, targets: np.ndarray, k: int = 3) -> list[int]:
    """The ``k`` most and ``k`` least prevalent (in training) classes that have a test positive."""
    usable = [c for c in np.argsort(-evaluation.train_prevalence) if (targets[:, c] == 1).any()]
    usable = [c for c in usable if evaluation.labels[c] not in ("Normal", "No Finding")]
    return usable[:k] + [c for c in usable[-k:] if c not in usable[:k]]


def pr_curves(evaluation, targets: np.ndarray, path: Path) -> Path:
    fig, ax = plt.subplots(figsize=(6, 5))
    probs = evaluation.sets["test"].probs
    for c in _pick_classes(evaluation, targets):
        keep = targets[:, c] >= 0
        precision, recall, _ = precision_recall_curve(targets[keep, c], probs[keep, c])
        prevalence = evaluation.train_prevalence[c]
        ap = evaluation.metrics.get(f"test/ap/{evaluation.labels[c]}", float("nan"))
        ax.step(recall, precision, where="post", label=f"{evaluation.labels[c]} (train {prevalence:.2%}, AP {ap:.2f})")
    ax.set(xlabel="recall", ylabel="precision", xlim=(0, 1), ylim=(0, 1.02), title="PR curves: head and tail classes")
    ax.legend(fontsize=7, loc="upper right")
    return _save(fig, path)


def reliability(evaluation, targets: np.ndarray, path: Path, n_bins: int = 15) -> Path:
    probs = evaluation.sets["test"].probs
    known = targets >= 0
    p, y = probs[known], targets[known]
    edges = np.linspace(0, 1, n_bins + 1)
    index = np.clip(np.digitize(p, edges[1:-1], right=True), 0, n_bins - 1)
    count = np.bincount(index, minlength=n_bins)
    mean_p = np.bincount(index, p, n_bins) / np.maximum(count, 1)
    mean_y = np.bincount(index, y, n_bins) / np.maximum(count, 1)
    fig, (ax, ax_hist) = plt.subplots(2, 1, figsize=(5, 6), height_ratios=(3, 1), sharex=True)
    ax.plot([0, 1], [0, 1], "k--", lw=1, label="perfect calibration")
    ax.plot(mean_p[count > 0], mean_y[count > 0], "o-", label="model (all classes pooled)")
    ece = evaluation.metrics.get("test/ECE_pooled", float("nan"))
    ax.set(ylabel="observed frequency", title=f"Reliability (pooled ECE {ece:.3f})")
    ax.legend(fontsize=8)
    ax_hist.bar(edges[:-1], count, width=1 / n_bins, align="edge", color="grey")
    ax_hist.set(xlabel="predicted probability", ylabel="pairs", yscale="log")
    return _save(fig, path)


def head_to_tail(evaluation, path: Path) -> Path:
    fig, ax = plt.subplots(figsize=(7, 4))
    names = [g for g in GROUPS if g in evaluation.groups]
    width = 0.8 / max(1, len(evaluation.sets))
    for i, (prefix, metric_set) in enumerate(evaluation.sets.items()):
        values = [metric_set.result.metrics.get(f"group/{g}/mAP", np.nan) for g in names]
        low = [metric_set.result.metrics.get(f"group/{g}/mAP_ci_low", np.nan) for g in names]
        high = [metric_set.result.metrics.get(f"group/{g}/mAP_ci_high", np.nan) for g in names]
        err = np.abs(np.array([np.subtract(values, low), np.subtract(high, values)]))
        ax.bar(np.arange(len(names)) + i * width, values, width, yerr=err, capsize=3, label=prefix)
    ax.set_xticks(np.arange(len(names)) + width * (len(evaluation.sets) - 1) / 2, names)
    ax.set(ylabel="mAP (95% bootstrap CI)", ylim=(0, 1), title="Head-to-tail groups (by training prevalence)")
    ax.legend(fontsize=7)
    return _save(fig, path)


def per_class_ap(evaluation, path: Path) -> Path:
    """AP of every class with its bootstrap interval, head to tail, coloured by head-to-tail group: where the
    tail sits, and which differences the test set can actually resolve."""
    result = evaluation.sets["test"].result
    ap = result.per_class["ap"]  # (C,)
    order = [c for c in np.argsort(-evaluation.train_prevalence, kind="stable") if np.isfinite(ap[c])]
    low = high = ap[order]
    if result.n_boot:
        replicates = result.replicates["ap"][:, order]  # (B, C'), NaN where a resample lacks the class
        with np.errstate(all="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # a class absent from every resample: no interval
            low, high = np.nanpercentile(replicates, [2.5, 97.5], axis=0)
    group_of = {c: g for g, members in evaluation.groups.items() for c in members}
    colours = {g: plt.get_cmap("tab10")(i) for i, g in enumerate(GROUPS)}
    fig, ax = plt.subplots(figsize=(9, 4.5))
    err = np.nan_to_num(np.abs(np.array([ap[order] - low, high - ap[order]])))
    ax.bar(range(len(order)), ap[order], yerr=err, capsize=2, color=[colours[group_of.get(c, "medium")] for c in order])
    ax.set_xticks(range(len(order)), [evaluation.labels[c] for c in order], rotation=75, fontsize=6)
    handles = [plt.Rectangle((0, 0), 1, 1, color=colours[g]) for g in GROUPS if g in evaluation.groups]
    ax.legend(handles, [g for g in GROUPS if g in evaluation.groups], fontsize=7, title="group", title_fontsize=7)
    ax.set(ylabel="AP (95% bootstrap CI)", ylim=(0, 1), title="Per-class AP on the test set, head -> tail")
    return _save(fig, path)


def perturbation_deltas(evaluation, path: Path) -> Path | None:
    if "test_perturbed" not in evaluation.sets:
        return None
    plain = evaluation.sets["test"].result.per_class["ap"]
    perturbed = evaluation.sets["test_perturbed"].result.per_class["ap"]
    order = np.argsort(-evaluation.train_prevalence)
    keep = [c for c in order if np.isfinite(plain[c]) and np.isfinite(perturbed[c])]
    delta = perturbed[keep] - plain[keep]
    fig, ax = plt.subplots(figsize=(9, 4))
    ax.bar(range(len(keep)), delta, color=np.where(delta < 0, "tab:red", "tab:green"))
    ax.axhline(0, color="k", lw=0.8)
    ax.set_xticks(range(len(keep)), [evaluation.labels[c] for c in keep], rotation=75, fontsize=6)
    shift = evaluation.metrics.get("test_perturbed/delta/mAP", float("nan"))
    ax.set(ylabel="AP perturbed - original", title=f"Perturbation robustness (mAP change {shift:+.3f}); head -> tail")
    return _save(fig, path)


def write_plots(evaluation, folder: Path) -> list[Path]:
    """Write every figure into ``folder``; returns their paths."""
    targets = evaluation.predictions["test"][[f"true/{n}" for n in evaluation.labels]].to_numpy()
    paths = [
        pr_curves(evaluation, targets, folder / "pr_curves.png"),
        reliability(evaluation, targets, folder / "reliability.png", of_evaluation(evaluation).ece_bins),
        head_to_tail(evaluation, folder / "head_to_tail.png"),
        per_class_ap(evaluation, folder / "per_class_ap.png"),
        perturbation_deltas(evaluation, folder / "perturbation_deltas.png"),
    ]
    return [p for p in paths if p is not None]


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
