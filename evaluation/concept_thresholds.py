"""Concept-detection thresholds chosen on validation to maximise ImageCLEF's mean per-image F1 (pure numpy).

A concept is predicted when its probability is at or above its threshold. The F1 ``2 |P & T| / (|P| + |T|)`` is
averaged over images with a non-empty true set; true concepts outside the model's columns still count in
``|T|`` (``missed``), as the official score counts them. :data:`MODES` are ``global`` (one exact sweep: the
mean F1 at every cut is a cumulative sum) and ``per_class`` (coordinate ascent from the global threshold that
moves a concept only when the mean F1 strictly rises, so it never ends below the global threshold on
validation; concepts with fewer than ``min_positives`` validation positives keep the global one, since
validation only says "never" of them). Rules: docs/concepts.md, "Thresholds for the per-image F1". Cut placement
follows :mod:`evaluation.thresholds`; between equally good cuts the higher threshold wins.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

FALLBACK = 0.5  # threshold when validation has no image with a true concept


@dataclass(frozen=True)
class ConceptThresholds:
    """Thresholds chosen on validation, with what they achieved there.

    ``thresholds`` is ``(C,)``, one per concept column (all equal for ``global``); ``val_f1`` and ``global_f1`` are
    the validation mean per-image F1 at ``thresholds`` and at ``global_threshold`` (the per-class search's start).
    """

    mode: str
    thresholds: np.ndarray
    global_threshold: float
    val_f1: float
    global_f1: float
    rounds: int = 0

    def to_dict(self, labels: Sequence[str]) -> dict:
        """JSON-ready: the mode, the validation F1s and ``{concept: threshold}``."""
        thresholds = {str(name): float(t) for name, t in zip(labels, self.thresholds, strict=True)}
        return {"mode": self.mode, "val_f1": self.val_f1, "global_threshold": self.global_threshold,
                "global_f1": self.global_f1, "rounds": self.rounds, "thresholds": thresholds}  # fmt: skip


def _inputs(truth, scores, missed) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    truth = np.asarray(truth) == 1  # (N, C); -1 (not labelled) counts as not true
    scores = np.asarray(scores, dtype=np.float64)
    if truth.shape != scores.shape or truth.ndim != 2:
        raise ValueError(f"truth {truth.shape} and scores {scores.shape} must be the same (N, C)")
    missed = np.zeros(len(truth)) if missed is None else np.asarray(missed, dtype=np.float64)
    if missed.shape != (len(truth),) or (missed < 0).any():
        raise ValueError(f"missed must be (N,) = ({len(truth)},) non-negative counts, got {missed.shape}")
    return truth, scores, missed


def image_f1(truth: np.ndarray, predicted: np.ndarray, missed: np.ndarray | None = None) -> np.ndarray:
    """``(N,)`` F1 between each image's predicted and true concept sets; NaN where the true set is empty.

    Args:
        truth: ``(N, C)`` 1 where the concept is true (anything else: not).
        predicted: ``(N, C)`` bool, the predicted concepts.
        missed: ``(N,)`` true concepts outside the C columns (counted in the true set, never predicted).
    """
    truth, predicted, missed = _inputs(truth, predicted, missed)
    predicted = predicted.astype(bool)
    true_size = truth.sum(axis=1) + missed  # (N,)
    tp = (truth & predicted).sum(axis=1)  # (N,)
    out = np.full(len(truth), np.nan)
    defined = true_size > 0
    out[defined] = 2 * tp[defined] / (predicted.sum(axis=1)[defined] + true_size[defined])
    return out


def mean_image_f1(truth: np.ndarray, predicted: np.ndarray, missed: np.ndarray | None = None) -> float:
    """ImageCLEF's score: the mean of :func:`image_f1` over images with a true concept (NaN when there is none)."""
    values = image_f1(truth, predicted, missed)
    return float(np.nanmean(values)) if np.isfinite(values).any() else float("nan")


def predict(scores: np.ndarray, thresholds: np.ndarray | float) -> np.ndarray:
    """``(N, C)`` bool: a concept is predicted when its score is at or above its threshold."""
    return np.asarray(scores, dtype=np.float64) >= np.asarray(thresholds, dtype=np.float64)


def predicted_concepts(scores: np.ndarray, thresholds: np.ndarray | float, labels: Sequence[str]) -> list[list[str]]:
    """Each image's predicted concepts (label order): the run file's rows."""
    chosen = predict(scores, thresholds)
    names = np.asarray(list(labels), dtype=object)
    return [list(names[row]) for row in chosen]


def _cut(sorted_scores: np.ndarray, k: int) -> float:
    """The threshold keeping exactly the first ``k + 1`` of the descending ``sorted_scores`` (``k = -1``: none)."""
    if k < 0:
        top = float(sorted_scores[0]) if len(sorted_scores) else 1.0
        above = 0.5 * (top + 1.0)
        return above if above > top else float(np.nextafter(top, np.inf))
    kept = float(sorted_scores[k])
    if k + 1 == len(sorted_scores):
        return kept
    below = float(sorted_scores[k + 1])
    middle = 0.5 * (kept + below)
    return middle if below < middle <= kept else kept


def _group_ends(sorted_scores: np.ndarray) -> np.ndarray:
    """Positions that end a run of equal scores in a descending array: the only places a threshold can cut."""
    return np.flatnonzero(np.append(sorted_scores[1:] != sorted_scores[:-1], True))


def best_global(truth: np.ndarray, scores: np.ndarray, missed: np.ndarray | None = None) -> tuple[float, float]:
    """``(threshold, mean F1)`` of the best single threshold over every distinct validation score (exact)."""
    truth, scores, missed = _inputs(truth, scores, missed)
    true_size = truth.sum(axis=1) + missed
    keep = true_size > 0
    truth, scores, true_size = truth[keep], scores[keep], true_size[keep]
    m = len(true_size)
    if m == 0:
        return FALLBACK, float("nan")
    n_classes = scores.shape[1]
    order = np.argsort(-scores.ravel(), kind="stable")  # (M*C,) (image, concept) pairs, highest score first
    s = scores.ravel()[order]
    y = truth.ravel()[order].astype(np.float64)
    image = order // n_classes
    # Within each image, how many of its pairs (and true ones) are predicted once the cut passes this pair.
    by_image = np.argsort(image, kind="stable")  # grouped by image, global order kept inside each image
    predicted, hits = np.empty(len(s)), np.empty(len(s))
    starts = np.searchsorted(image[by_image], np.arange(m))
    ones = np.ones(len(s))
    for out, values in ((predicted, ones), (hits, y)):
        total = np.cumsum(values[by_image])
        offset = np.repeat(np.append(0.0, total)[starts], np.diff(np.append(starts, len(s))))
        out[by_image] = total - offset
    size = true_size[image]
    delta = 2 * hits / (predicted + size) - 2 * (hits - y) / (predicted - 1 + size)  # F1 change of its image
    mean = np.cumsum(delta) / m  # mean F1 once the first k + 1 pairs are predicted
    ends = _group_ends(s)
    values = np.append(0.0, mean[ends])  # cut "never" first, then every tie-group end, highest threshold first
    best = int(np.argmax(values))
    return _cut(s, -1 if best == 0 else int(ends[best - 1])), float(values[best])


def coordinate_ascent(truth: np.ndarray, scores: np.ndarray, start: np.ndarray, missed: np.ndarray | None = None,
                      max_rounds: int = 10, min_positives: int = 1) -> tuple[np.ndarray, int]:  # fmt: skip
    """Per-concept thresholds improved one concept at a time from ``start`` (see the module docstring).

    Returns:
        ``(thresholds (C,), rounds run)``.
    """
    truth, scores, missed = _inputs(truth, scores, missed)
    true_size = truth.sum(axis=1) + missed
    keep = true_size > 0
    truth, scores, true_size = truth[keep], scores[keep], true_size[keep]
    thresholds = np.array(start, dtype=np.float64).copy()
    if len(true_size) == 0:
        return thresholds, 0
    chosen = scores >= thresholds  # (M, C)
    tp = (chosen & truth).sum(axis=1).astype(np.float64)  # (M,)
    size = chosen.sum(axis=1).astype(np.float64)  # (M,) predicted concepts per image
    fitted = np.flatnonzero(truth.sum(axis=0) >= min_positives)
    rounds = 0
    for rounds in range(1, max_rounds + 1):  # noqa: B007 (the count is returned)
        moved = False
        for c in fitted:
            y, on = truth[:, c].astype(np.float64), chosen[:, c]
            base_tp, base_size = tp - (y * on), size - on
            order = np.argsort(-scores[:, c], kind="stable")
            s = scores[order, c]
            gain = 2 * (base_tp + y)[order] / (base_size + 1 + true_size)[order] \
                - 2 * base_tp[order] / (base_size + true_size)[order]  # fmt: skip
            ends = _group_ends(s)
            values = np.append(0.0, np.cumsum(gain)[ends])  # "never", then each cut, highest threshold first
            current = int(on.sum())  # the current threshold keeps exactly the images scoring at or above it
            now = 0.0 if current == 0 else float(np.cumsum(gain)[current - 1])
            best = int(np.argmax(values))
            if values[best] > now + 1e-12:
                thresholds[c] = _cut(s, -1 if best == 0 else int(ends[best - 1]))
                new = scores[:, c] >= thresholds[c]
                tp += y * (new.astype(np.float64) - on)
                size += new.astype(np.float64) - on
                chosen[:, c] = new
                moved = True
        if not moved:
            break
    return thresholds, rounds


def _global_mode(truth, scores, missed, **_) -> ConceptThresholds:
    threshold, f1 = best_global(truth, scores, missed)
    thresholds = np.full(np.shape(scores)[1], threshold)
    return ConceptThresholds("global", thresholds, threshold, f1, f1)


def _per_class_mode(truth, scores, missed, max_rounds: int = 10, min_positives: int = 1) -> ConceptThresholds:
    threshold, f1 = best_global(truth, scores, missed)
    start = np.full(np.shape(scores)[1], threshold)
    thresholds, rounds = coordinate_ascent(truth, scores, start, missed, max_rounds, min_positives)
    achieved = mean_image_f1(truth, predict(scores, thresholds), missed)
    return ConceptThresholds("per_class", thresholds, threshold, achieved, f1, rounds)


#: Threshold modes by name (``configs/task/rocov2_concepts.yaml``'s ``thresholds``, ``make submit THRESHOLDS=``).
MODES: dict[str, Callable[..., ConceptThresholds]] = {"global": _global_mode, "per_class": _per_class_mode}


def choose_thresholds(truth: np.ndarray, scores: np.ndarray, mode: str = "per_class",
                      missed: np.ndarray | None = None, **options) -> ConceptThresholds:  # fmt: skip
    """Thresholds maximising the mean per-image F1 on validation.

    Args:
        truth: ``(N, C)`` validation truth (1 = the image carries the concept).
        missed: ``(N,)`` true concepts of each image outside the C columns.
        **options: ``max_rounds`` and ``min_positives`` of the per-class search.

    Raises:
        ValueError: an unknown mode (the known ones are named) or mismatched shapes.
    """
    if mode not in MODES:
        raise ValueError(f"threshold mode {mode!r} is not one of {sorted(MODES)}")
    return MODES[mode](truth, scores, missed, **options)
