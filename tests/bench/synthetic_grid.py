"""Render a labelled sample grid of the SYNTHETIC set (for the docs and for eyeballing the drawing rules).

Regenerates the figure docs/data.md embeds, from the repository root::

    python -m tests.bench.synthetic_grid --out docs/synthetic_grid.png

Tiles are picked from a label sample so that together they show as many different findings as possible (rarest
first), plus a few normals; each tile is annotated with its centre, view and clean findings.
"""

from __future__ import annotations

import argparse
import textwrap
from pathlib import Path

import numpy as np

from training.data.synthetic.generate import spec_for
from training.data.synthetic.labels import FINDINGS, INDEX, NORMAL, PREVALENCE, LabelConfig, sample_labels
from training.data.synthetic.render import render_image


def pick_tiles(sample, count: int, n_normal: int = 3, seed: int = 0) -> list[int]:
    """Indices of ``count`` images covering many findings (greedy, rarest uncovered finding first)."""
    rng = np.random.default_rng(seed)
    clean = sample.clean
    n_pos = clean.sum(axis=1) - clean[:, INDEX[NORMAL]]
    normals = np.flatnonzero(clean[:, INDEX[NORMAL]] == 1)
    chosen = [int(i) for i in rng.choice(normals, size=min(n_normal, len(normals)), replace=False)]
    covered = {NORMAL}
    by_rarity = sorted((f for f in FINDINGS if f != NORMAL), key=lambda f: PREVALENCE[f])
    while len(chosen) < count:
        todo = [f for f in by_rarity if f not in covered]
        if todo:
            target = todo[0]
            cands = np.flatnonzero((clean[:, INDEX[target]] == 1) & (n_pos <= 3))
            if len(cands) == 0:
                cands = np.flatnonzero(clean[:, INDEX[target]] == 1)
            gain = [len({FINDINGS[c] for c in np.flatnonzero(clean[i])} - covered) for i in cands]
            best = int(cands[int(np.argmax(gain))])
            covered.add(target)
        else:
            best = int(rng.choice(np.flatnonzero(n_pos >= 2)))
        if best not in chosen:
            chosen.append(best)
            covered |= {FINDINGS[c] for c in np.flatnonzero(clean[best])}
    return chosen


def render_grid(out: str | Path, rows: int = 4, cols: int = 6, image_size: int = 192, seed: int = 0) -> Path:
    """Draw ``rows x cols`` annotated synthetic films into a PNG at ``out``; returns the path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sample = sample_labels(LabelConfig(n_train=3000, n_val=500, n_test=1000), seed)
    tiles = pick_tiles(sample, rows * cols, seed=seed)
    fig, axes = plt.subplots(rows, cols, figsize=(cols * 2.3, rows * 2.95), dpi=110)
    for ax, index in zip(axes.ravel(), tiles, strict=True):
        image = render_image(spec_for(sample, index, seed), image_size)
        ax.imshow(image, cmap="gray", vmin=0, vmax=255)
        ax.set_xticks([])
        ax.set_yticks([])
        names = [FINDINGS[c] for c in np.flatnonzero(sample.clean[index])]
        caption = f"{sample.source[index]} {sample.view[index]}\n" + textwrap.fill(", ".join(names), 34)
        ax.set_xlabel(caption, fontsize=6.3, linespacing=1.1)
    fig.suptitle(
        "SYNTHETIC chest radiographs (procedurally drawn test data, not patients); captions = clean findings",
        fontsize=10,
        fontweight="bold",
    )
    fig.tight_layout(rect=(0, 0, 1, 0.97))
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out)
    plt.close(fig)
    from PIL import Image

    Image.open(out).convert("L").save(out, optimize=True)  # grayscale content: a third of the RGBA file size
    return out


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description="Render a labelled grid of SYNTHETIC chest radiographs.")
    parser.add_argument("--out", default="docs/synthetic_grid.png")
    parser.add_argument("--rows", type=int, default=4)
    parser.add_argument("--cols", type=int, default=6)
    parser.add_argument("--image-size", type=int, default=192)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    print(render_grid(args.out, args.rows, args.cols, args.image_size, args.seed))


if __name__ == "__main__":
    main()
