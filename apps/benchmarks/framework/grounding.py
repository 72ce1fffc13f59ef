"""Grounding metrics: does a model's heatmap for a finding point at the finding's boxes?

Pointing game (TorchRay's convention, ``torchray.benchmark.pointing_game``) and signed contrast-to-noise ratio
(BioViL's CNR, signed as in AFLoc's code) per (image, finding) with a reference box; the rules (tolerance in
the boxes' own frame, tied maxima, flat maps) are in docs/benchmarks.md, "NIH grounding". Both metrics are
invariant to a positive affine rescaling, so Grad-CAM, similarity and probability maps need no normalising.

:func:`score_heatmaps` runs batch by batch (full-size maps of hundreds of films would not fit in memory), and
keeps its scores on disk keyed by everything they depend on (:func:`heatmap_key`): Grad-CAM is the slow part.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
from scipy import ndimage

from apps.benchmarks.framework.embeddings import read_images, targets_key
from apps.benchmarks.framework.encoders import Encoder
from apps.benchmarks.framework.heatmaps import centre_prior, heatmap_note, heatmaps, random_heatmaps
from apps.benchmarks.framework.protocol import Box
from evaluation.bootstrap import percentile_ci, resample_indices

Example = tuple[np.ndarray, np.ndarray, tuple[Box, ...], str]
"""An overlay example: the film as the model saw it, the heatmap, the finding's boxes, a title."""

POINTING_TOLERANCE = 15.0
"""TorchRay's pointing-game tolerance, in pixels of the frame the boxes were drawn in."""

FLAT_MAPS = {
    "miss": "a flat map points nowhere and scores 0",
    "share": "a flat map scores the share of pixels that would be hits (a point drawn at random)",
}
"""The pointing game's rule for a flat map (the platform's; TorchRay has none) -> how the report states it."""


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


def hit_region(boxes: Sequence[Box], size: int, tolerance: float = POINTING_TOLERANCE) -> np.ndarray:
    """``(size, size)`` bool mask of the heatmap pixels a peak would hit: the pixels of ``boxes`` (:func:`box_mask`)
    and every pixel whose centre lies less than ``tolerance`` pixels of the box's own frame from one of them.

    Each box is grown in its own frame, so boxes drawn on frames of different sizes each keep the margin their
    frame means.
    """
    if tolerance < 0:
        raise ValueError(f"the pointing-game tolerance is a distance in pixels: it cannot be {tolerance}")
    region = np.zeros((size, size), dtype=bool)
    for box in boxes:
        inside = box_mask([box], size)
        if tolerance > 0 and inside.any():
            spacing = (box.frame_height / size, box.frame_width / size)  # rows, columns
            region |= ndimage.distance_transform_edt(~inside, sampling=spacing) < tolerance
        else:
            region |= inside
    return region


def pointing_game(heatmap: np.ndarray, region: np.ndarray, flat_maps: str = "share") -> float:
    """1 when the heatmap's first maximum (row-major order, as ``torch.argmax``) lies in ``region``, else 0; a flat
    map scores by ``flat_maps`` (:data:`FLAT_MAPS`). NaN for an empty region or a heatmap without a finite value.

    ``region`` is what counts as a hit: :func:`hit_region` for TorchRay's tolerance, :func:`box_mask` for none.
    Non-finite pixels never count as the maximum.
    """
    if flat_maps not in FLAT_MAPS:
        raise ValueError(f"flat_maps must be one of {', '.join(FLAT_MAPS)}, got {flat_maps!r}")
    values = np.asarray(heatmap, dtype=np.float64)
    finite = np.isfinite(values)
    if not region.any() or not finite.any():
        return float("nan")
    if values[finite].min() == values[finite].max():  # no pixel stands out
        return 0.0 if flat_maps == "miss" else float(region[finite].mean())
    peak = np.argmax(np.where(finite, values, -np.inf))  # the first maximum, row-major
    return float(region.flat[peak])


def cnr(heatmap: np.ndarray, mask: np.ndarray) -> float:
    """Signed contrast-to-noise ratio of the heatmap inside vs outside the mask (see module docstring)."""
    values = np.asarray(heatmap, dtype=np.float64)
    inside, outside = values[mask], values[~mask]
    if inside.size == 0 or outside.size == 0 or not np.isfinite(values).all():
        return float("nan")
    if values.max() == values.min():
        return 0.0  # a flat map has no contrast (and its variances are rounding noise, not signal)
    noise, contrast = np.sqrt(inside.var() + outside.var()), inside.mean() - outside.mean()
    if noise <= 1e-12 * np.abs(values).max():
        return float("nan")  # a noiseless step: the ratio is infinite
    return float(contrast / noise)


def grounding_scores(heatmaps: np.ndarray, boxes: Sequence[Sequence[Box]], findings: Sequence[str],
                     tolerance: float = POINTING_TOLERANCE, flat_maps: str = "share") -> np.ndarray:  # fmt: skip
    """``(N, K, 2)``: per image and finding, (pointing game, CNR); NaN where the image has no box of the finding.

    ``heatmaps`` is ``(N, K, S, S)``, at the size the boxes are moved to; ``tolerance`` is in pixels of each box's
    frame (0: the peak must lie in a box).
    """
    return _scores(heatmaps, _references(boxes, findings, heatmaps.shape[-1], tolerance), flat_maps)


_Reference = tuple[int, int, np.ndarray, np.ndarray]
"""(image, finding index, box mask for CNR, hit region for the pointing game)."""


def _references(
    boxes: Sequence[Sequence[Box]], findings: Sequence[str], size: int, tolerance: float
) -> list[_Reference]:
    """The masks of every (image, finding) with a box, made once for the model and both floors."""
    out = []
    for i, film in enumerate(boxes):
        for j, finding in enumerate(findings):
            mine = [box for box in film if box.finding == finding]
            if mine:
                out.append((i, j, box_mask(mine, size), hit_region(mine, size, tolerance)))
    return out


def _scores(heatmaps: np.ndarray, references: Sequence[_Reference], flat_maps: str) -> np.ndarray:
    out = np.full((heatmaps.shape[0], heatmaps.shape[1], 2), np.nan)
    for i, j, mask, region in references:
        out[i, j] = pointing_game(heatmaps[i, j], region, flat_maps), cnr(heatmaps[i, j], mask)
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
        finite = np.isfinite(heatmap)
        if not finite.any():  # no map for this finding (no mapped output): nothing to draw or mark
            title = f"{title} (n/a: no heatmap)"
        else:
            ax.imshow(heatmap, cmap="jet", alpha=0.35)
        for box in its_boxes:
            moved = box.in_frame(size, size)
            ax.add_patch(Rectangle((moved.x, moved.y), moved.w, moved.h, fill=False, edgecolor="white", linewidth=1.5))
        if finite.any() and heatmap[finite].max() > heatmap[finite].min():  # a flat map has no peak to mark
            peak = np.unravel_index(np.argmax(np.where(finite, heatmap, -np.inf)), heatmap.shape)
            ax.plot(peak[1], peak[0], marker="x", color="red", markersize=8)
        elif finite.any():
            title = f"{title} (flat map)"
        ax.set_title(title, fontsize=8)
        ax.axis("off")
    fig.tight_layout()
    return fig


@dataclass
class GroundedScores:
    """A model's and the floors' grounding scores on some films.

    ``methods`` maps ``model`` (``None`` when the model makes no heatmaps), ``centre`` and ``random`` to ``(N, K,
    2)`` scores (pointing game, CNR; NaN where a film has no box of the finding); ``flat`` counts the model's flat
    maps that had a box.
    """

    methods: dict[str, np.ndarray | None]
    flat: int = 0
    examples: dict[str, list[Example]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


HEATMAP_CACHE_VERSION = 1
"""Part of every heatmap cache key: bump it when the scores' computation changes, so no stale entry is read."""


def heatmap_key(encoder: Encoder, paths: Sequence[str], boxes: Sequence[Sequence[Box]], findings: Sequence[str],
                seed: int, batch_size: int, examples: int, tolerance: float, flat_maps: str) -> str:  # fmt: skip
    """The cache entry name of :func:`score_heatmaps`' result: the model (its identity covers the weights and the
    outputs each finding maps to), the targets' prompts, the input size and resize, the films and their boxes, and
    every argument that changes a score (the random floor's seeds follow the batches)."""
    parts = [HEATMAP_CACHE_VERSION, encoder.identity, targets_key(encoder.targets), encoder.image_size,
             encoder.resize, list(paths), [[dataclasses.asdict(b) for b in film] for film in boxes], list(findings),
             seed, batch_size, examples, tolerance, flat_maps]  # fmt: skip
    return "heatmaps-" + hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:24]


def score_heatmaps(encoder: Encoder, root: Path, paths: Sequence[str], boxes: Sequence[Sequence[Box]],
                   findings: Sequence[str], seed: int, batch_size: int = 32, examples: int = 3,
                   tolerance: float = POINTING_TOLERANCE, cache_dir: str | Path | None = None,
                   flat_maps: str = "share") -> GroundedScores:  # fmt: skip
    """Grounding scores of the model's heatmaps and of both floors, at the model's input size.

    Args:
        seed: the random floor's seed (batch starting at film ``s`` uses ``seed + s``, so batching is invisible).
        examples: overlay examples kept per finding (the first films with a finite map of it and a box).
        cache_dir: where the result is kept (:func:`heatmap_key`); ``None``: computed, never stored.
    """
    if flat_maps not in FLAT_MAPS:
        raise ValueError(f"flat_maps must be one of {', '.join(FLAT_MAPS)}, got {flat_maps!r}")
    path = None
    if cache_dir is not None:
        path = (
            Path(cache_dir)
            / f"{heatmap_key(encoder, paths, boxes, findings, seed, batch_size, examples, tolerance, flat_maps)}.npz"
        )
        if path.is_file():
            return _with_notes(_read_scores(path, findings), encoder, boxes, findings, seed, tolerance, flat_maps)
    grounded = _compute_scores(encoder, root, paths, boxes, findings, seed, batch_size, examples, tolerance,
                               flat_maps)  # fmt: skip
    if path is not None:
        _write_scores(path, grounded, findings)
    return _with_notes(grounded, encoder, boxes, findings, seed, tolerance, flat_maps)


def _compute_scores(encoder: Encoder, root: Path, paths: Sequence[str], boxes: Sequence[Sequence[Box]],
                    findings: Sequence[str], seed: int, batch_size: int, examples: int,
                    tolerance: float, flat_maps: str) -> GroundedScores:  # fmt: skip
    size, k = encoder.image_size, len(findings)
    model = np.full((len(paths), k, 2), np.nan)
    centre, noise = np.full_like(model, np.nan), np.full_like(model, np.nan)
    prior = centre_prior(size)
    able, flat, shown = True, 0, {f: [] for f in findings}
    for start in range(0, len(paths), batch_size):
        rows = slice(start, start + batch_size)
        images = read_images(Path(root), list(paths[rows]), size, encoder.resize)
        its_boxes = list(boxes[rows])
        references = _references(its_boxes, findings, size, tolerance)
        maps = heatmaps(encoder, images, findings) if able else None
        able = maps is not None
        if able:
            model[rows] = _scores(maps, references, flat_maps)
            for i, film in enumerate(its_boxes):
                for j, finding in enumerate(findings):
                    mine = tuple(b for b in film if b.finding == finding)
                    flat += bool(mine) and np.ptp(maps[i, j]) == 0
                    if mine and len(shown[finding]) < examples and np.isfinite(maps[i, j]).any():
                        shown[finding].append((images[i], maps[i, j], mine, Path(paths[start + i]).stem))
        centre[rows] = _scores(np.broadcast_to(prior, (len(images), k, size, size)), references, flat_maps)
        noise[rows] = _scores(random_heatmaps(len(images), k, size, seed + start), references, flat_maps)
    return GroundedScores({"model": model if able else None, "centre": centre, "random": noise}, flat, shown)


def _write_scores(path: Path, grounded: GroundedScores, findings: Sequence[str]) -> None:
    """The scores and the overlay examples as one ``.npz``, written atomically (as the embedding cache is)."""
    shown = [(findings.index(f), *example) for f, items in grounded.examples.items() for example in items]
    size = shown[0][1].shape if shown else (0, 0)
    model = grounded.methods["model"]
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.stem}.tmp{os.getpid()}.npz")
    np.savez(
        tmp, has_model=model is not None, model=np.zeros(0) if model is None else model,
        centre=grounded.methods["centre"], random=grounded.methods["random"], flat=grounded.flat,
        example_finding=np.array([s[0] for s in shown], dtype=int),
        example_image=np.array([s[1] for s in shown], dtype=np.uint8).reshape(len(shown), *size),
        example_map=np.array([s[2] for s in shown], dtype=np.float32).reshape(len(shown), *size),
        example_boxes=np.array([json.dumps([dataclasses.asdict(b) for b in s[3]]) for s in shown], dtype=str),
        example_stem=np.array([s[4] for s in shown], dtype=str),
    )  # fmt: skip
    os.replace(tmp, path)


def _read_scores(path: Path, findings: Sequence[str]) -> GroundedScores:
    with np.load(path, allow_pickle=False) as stored:
        model = stored["model"] if bool(stored["has_model"]) else None
        shown: dict[str, list[Example]] = {f: [] for f in findings}
        columns = ("example_finding", "example_image", "example_map", "example_stem", "example_boxes")
        for j, image, heatmap, stem, mine in zip(*(stored[c] for c in columns), strict=True):
            its_boxes = tuple(Box(**box) for box in json.loads(str(mine)))
            shown[findings[int(j)]].append((image, heatmap, its_boxes, str(stem)))
        methods = {"model": model, "centre": stored["centre"], "random": stored["random"]}
        return GroundedScores(methods, int(stored["flat"]), shown)


def _with_notes(grounded: GroundedScores, encoder: Encoder, boxes: Sequence[Sequence[Box]], findings: Sequence[str],
                seed: int, tolerance: float, flat_maps: str) -> GroundedScores:  # fmt: skip
    """The report lines of a result, whether computed now or read back."""
    size, model = encoder.image_size, grounded.methods["model"]
    notes = [f"heatmaps at {size} px (the model's input size); floors: a centred Gaussian (sigma = size/4) and "
             f"uniform noise seeded with {seed} + batch start",
             f"pointing game: TorchRay's, the first maximum is a hit within {tolerance:g} px of a box in the boxes' "
             f"frame ({tolerance * size / _frame(boxes):.2f} px at {size} px); {FLAT_MAPS[flat_maps]} (the "
             f"platform's rule, flat_maps: {flat_maps}); CNR signed (below 0: the map is dimmer on the box than "
             f"around it)"]  # fmt: skip
    if model is not None:
        notes.append(f"model heatmaps: {heatmap_note(encoder)}")
        pairs = int(sum(any(b.finding == f for b in film) for film in boxes for f in findings))
        if grounded.flat:
            scored = "0" if flat_maps == "miss" else "the share of pixels that would be hits"
            notes.append(f"{grounded.flat} of {pairs} model heatmaps are flat (no pixel stands out): each scores "
                         f"{scored} in the pointing game and 0 CNR")  # fmt: skip
        boxed = {b.finding for film in boxes for b in film}
        unscored = [f for j, f in enumerate(findings) if f in boxed and not np.isfinite(model[:, j]).any()]
        if unscored:
            notes.append(f"model: n/a for {', '.join(unscored)} (no heatmap: no output of the model answers it)")
    else:
        notes.append(f"model: no heatmaps for {encoder.description} (n/a)")
    return dataclasses.replace(grounded, notes=notes)


def _frame(boxes: Sequence[Sequence[Box]]) -> int:
    """The widest frame the boxes were drawn in, for the note that converts the tolerance to heatmap pixels."""
    return max((max(b.frame_width, b.frame_height) for film in boxes for b in film), default=1)


def grounding_table(methods: dict[str, np.ndarray | None], groups: dict[str, np.ndarray], n_boot: int, seed: int,
                    ci: float = 0.95) -> pd.DataFrame:  # fmt: skip
    """Mean pointing game and CNR of each method on each group of films, with percentile intervals over resampled
    films (the same resamples for every method and group: paired).

    ``groups`` maps a name to an ``(N,)`` bool mask of its films; ``None`` method rows stay NaN.
    """
    n = len(next(iter(groups.values())))
    resamples = resample_indices(n, n_boot, seed) if n_boot > 0 else np.empty((0, n), int)
    rows = []
    for method, values in methods.items():
        for m, metric in enumerate(("pg", "cnr")):
            per_film = np.full(n, np.nan) if values is None else np.nanmax(values[:, :, m], axis=1, initial=-np.inf)
            per_film = np.where(np.isfinite(per_film), per_film, np.nan)  # the film's one scored finding
            for group, mask in groups.items():
                picked = np.where(mask, per_film, np.nan)
                point = float(np.nanmean(picked)) if np.isfinite(picked).any() else float("nan")
                replicates = np.array([np.nanmean(picked[idx]) if np.isfinite(picked[idx]).any() else np.nan
                                       for idx in resamples])  # fmt: skip
                low, high = percentile_ci(replicates, ci) if n_boot > 0 else (np.nan, np.nan)
                rows.append({"method": method, "metric": metric, "group": group, "value": point, "ci_low": low,
                             "ci_high": high})  # fmt: skip
    return pd.DataFrame(rows, columns=["method", "metric", "group", "value", "ci_low", "ci_high"])
