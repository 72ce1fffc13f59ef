"""Grounding metrics: does a model's heatmap for a finding point at the finding's boxes?

Two numbers per (image, finding) with at least one reference box, both computed on the heatmap at the size the
boxes were moved to (the image as the model saw it):

- **Pointing game** (PG): 1 when the heatmap's maximum lies inside a box of that finding, else 0. When the maximum
  is reached at several pixels (a flat or saturated map) the hit is the *share* of those pixels inside a box, so a
  constant heatmap scores the box's area fraction rather than whatever pixel ``argmax`` happens to return first.
- **Contrast-to-noise ratio** (CNR, as in BioViL's grounding evaluation): ``|mean_in - mean_out| /
  sqrt(var_in + var_out)`` of the heatmap inside vs outside the union of the finding's boxes. A flat map (a
  Grad-CAM whose ReLU removed everything) has no contrast: CNR 0, and its pointing game is the box's area share.
  NaN when either side is empty, or for a noiseless step (constant inside, another constant outside), whose ratio
  is infinite.

Heatmaps are compared as they are: both metrics are invariant to a positive affine rescaling of the map, so
Grad-CAM, similarity and probability maps can be compared without normalising them first.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from evaluation.benchmarks.protocol import Box


def box_mask(boxes: Sequence[Box], size: int) -> np.ndarray:
    """``(size, size)`` bool mask of the union of ``boxes`` moved to a ``size`` x ``size`` frame.

    A pixel belongs to a box when its centre does (pixel ``j`` covers ``[j, j+1)``, centre ``j + 0.5``), so a box
    covering half a pixel column counts it only if it covers that column's centre.
    """
    mask = np.zeros((size, size), dtype=bool)
    centres = np.arange(size) + 0.5
    for box in boxes:
        moved = box.in_frame(size, size)
        cols = (centres >= moved.x) & (centres < moved.x + moved.w)
        rows = (centres >= moved.y) & (centres < moved.y + moved.h)
        mask |= rows[:, None] & cols[None, :]
    return mask


def pointing_game(heatmap: np.ndarray, mask: np.ndarray) -> float:
    """Share of the heatmap's maximal pixels inside the mask (1 or 0 for a single maximum); NaN for an empty mask
    or a heatmap without a finite value."""
    values = np.asarray(heatmap, dtype=np.float64)
    if not mask.any() or not np.isfinite(values).any():
        return float("nan")
    peak = values == np.nanmax(values)
    return float(mask[peak].mean())


def cnr(heatmap: np.ndarray, mask: np.ndarray) -> float:
    """Contrast-to-noise ratio of the heatmap inside vs outside the mask (see module docstring)."""
    values = np.asarray(heatmap, dtype=np.float64)
    inside, outside = values[mask], values[~mask]
    if inside.size == 0 or outside.size == 0 or not np.isfinite(values).all():
        return float("nan")
    if values.max() == values.min():
        return 0.0  # a flat map has no contrast (and its variances are rounding noise, not signal)
    noise, contrast = np.sqrt(inside.var() + outside.var()), abs(inside.mean() - outside.mean())
    if noise <= 1e-12 * np.abs(values).max():
        return float("nan")  # a noiseless step: the ratio is infinite
    return float(contrast / noise)


def grounding_scores(heatmaps: np.ndarray, boxes: Sequence[Sequence[Box]], findings: Sequence[str]) -> np.ndarray:
    """``(N, K, 2)``: per image and finding, (pointing game, CNR); NaN where the image has no box of the finding.

    Args:
        heatmaps: ``(N, K, S, S)`` one map per image and finding, at the size the boxes are moved to.
        boxes: per image, its reference boxes (any frame; each carries its own).
        findings: the ``K`` findings, in the heatmaps' order.
    """
    n, k, size = heatmaps.shape[0], len(findings), heatmaps.shape[-1]
    out = np.full((n, k, 2), np.nan)
    for i in range(n):
        for j, finding in enumerate(findings):
            mine = [box for box in boxes[i] if box.finding == finding]
            if mine:
                mask = box_mask(mine, size)
                out[i, j] = pointing_game(heatmaps[i, j], mask), cnr(heatmaps[i, j], mask)
    return out


def overlay_figure(images: Sequence[np.ndarray], maps: Sequence[np.ndarray], boxes: Sequence[Sequence[Box]],
                   titles: Sequence[str]):  # fmt: skip
    """A row of examples: each film in grey, its heatmap over it, the reference boxes as outlines."""
    from matplotlib.figure import Figure
    from matplotlib.patches import Rectangle

    fig = Figure(figsize=(2.6 * max(len(images), 1), 2.9))
    for column, (image, heatmap, its_boxes, title) in enumerate(zip(images, maps, boxes, titles, strict=True)):
        ax = fig.add_subplot(1, max(len(images), 1), column + 1)
        size = image.shape[0]
        ax.imshow(image, cmap="gray", vmin=0, vmax=255)
        ax.imshow(heatmap, cmap="jet", alpha=0.35)
        for box in its_boxes:
            moved = box.in_frame(size, size)
            ax.add_patch(Rectangle((moved.x, moved.y), moved.w, moved.h, fill=False, edgecolor="white", linewidth=1.5))
        if np.nanmax(heatmap) > np.nanmin(heatmap):  # a flat map has no peak to mark
            peak = np.unravel_index(np.nanargmax(heatmap), heatmap.shape)
            ax.plot(peak[1], peak[0], marker="x", color="red", markersize=8)
        else:
            title = f"{title} (flat map)"
        ax.set_title(title, fontsize=8)
        ax.axis("off")
    fig.tight_layout()
    return fig
