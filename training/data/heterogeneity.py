"""How the sources of a dataset differ: the per-source table the CXR-LT 2026 paper reports (docs/data.md,
"Source heterogeneity").

A model trained on several sites learns their differences as much as their findings, so the report puts them side
by side in ``make data-check`` and keeps them with every run, so a result can be read against its data.
Grayscale mean and SD come from a seeded sample per source (decoding a whole release would outlast the check),
decoded as training decodes but *before* its contrast stretch and divided by the bit depth's full range; the SD is
of the pooled pixels, so it holds both the contrast within films and the spread between them. A 12-bit image
stored in 16 bits therefore looks dark here: a real difference, which training's per-image stretch removes.
Unreadable files are counted and left out of the figures.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path

import numpy as np
import pandas as pd

from training.data.images import DECODERS, MAX_PIXELS, declared_size, decode
from training.data.manifest import parse_manifest_labels

DEFAULT_SAMPLE = 500  # decoded images per source: the pooled mean's error is then well under 0.01
DEFAULT_SEED = 0
VIEWS = ("PA", "AP", "lateral", "other", "unknown")
LATERAL = {"L", "LL", "RL", "LAT", "LATERAL"}
TOP_LABELS = 5  # labels named per source in the summary; the full table follows it
ALL_SOURCES = "all"


def view_group(value) -> str:
    """One of :data:`VIEWS` for a ``view`` cell: ``AP Supine``, ``ap`` and ``AP_horizontal`` are AP; ``L``, ``LL``
    and ``XTABLE LATERAL`` are lateral; an empty cell is unknown; any other position (``LAO``) is other."""
    tokens = re.sub(r"[^A-Z]+", " ", str(value).upper()).split()
    if not tokens or tokens[0] in ("NAN", "NONE", "UNKNOWN"):
        return "unknown"
    if LATERAL & set(tokens):
        return "lateral"
    if tokens[0] in ("PA", "POSTEROANTERIOR"):
        return "PA"
    if tokens[0] in ("AP", "ANTEROPOSTERIOR"):
        return "AP"
    return "other"


def header_size(path: Path) -> tuple[int, int]:
    """``(width, height)`` from the file's header, without decoding the pixels."""
    if path.suffix.lower() in DECODERS:  # DICOM
        import pydicom

        dataset = pydicom.dcmread(str(path), stop_before_pixels=True)
        return int(dataset.Columns), int(dataset.Rows)
    return declared_size(path)  # PIL's header parser, without PIL's own pixel limit (an error past 179 MP)


def unit_range(image: np.ndarray, path: Path) -> tuple[float, float]:
    """The value range that maps onto [0, 1]: the bit depth's full range (see the module docstring)."""
    if image.dtype.kind in "ui":
        info = np.iinfo(image.dtype)
        return float(info.min), float(info.max)
    if path.suffix.lower() in DECODERS:  # a DICOM without a window: the stored range after the modality LUT
        import pydicom

        from training.data.dicom import window_output_range

        return window_output_range(pydicom.dcmread(str(path), stop_before_pixels=True))
    return float(image.min()), float(image.max())  # a float image states no bit depth: its own extremes


def pixel_sums(path: Path, max_pixels: int | None = MAX_PIXELS) -> tuple[int, float, float]:
    """Pixel count, sum and sum of squares of one image on the [0, 1] scale (pooled later into mean and SD)."""
    image = decode(path, max_pixels)
    low, high = unit_range(image, path)
    values = np.clip((image.astype(np.float64) - low) / max(high - low, 1e-12), 0.0, 1.0)
    return values.size, float(values.sum()), float(np.square(values).sum())


@dataclass(frozen=True)
class SourceStats:
    """One source's row of the report (shares are fractions; the figures are NaN when no image could be read)."""

    source: str
    images: int
    sized: int  # images whose header was read (resolution)
    sampled: int  # images decoded for the intensities
    unreadable: int  # of the sized and sampled ones
    width: float
    height: float
    megapixels: float
    mean: float
    sd: float
    views: dict[str, float]
    labels: dict[str, float]


@dataclass(frozen=True)
class Heterogeneity:
    """The report: one :class:`SourceStats` per source, with how it was measured."""

    sources: list[SourceStats]
    sample: int | None
    seed: int
    resolution_from: str

    def summary(self) -> pd.DataFrame:
        """One row per source: counts, resolution, intensities, view shares (%), the most frequent labels."""
        rows = []
        for s in self.sources:
            top = sorted(s.labels.items(), key=lambda item: -item[1])[:TOP_LABELS]
            rows.append({
                "images": s.images, "measured": s.sampled, "unreadable": s.unreadable,
                "width x height": f"{s.width:.1f} x {s.height:.1f}", "MP": float(f"{s.megapixels:.3g}"),
                "mean": round(s.mean, 3), "SD": round(s.sd, 3),
                **{f"{v} %": round(100 * s.views[v], 1) for v in VIEWS},
                "top labels (% of images)": ", ".join(f"{n} {100 * x:.1f}" for n, x in top if x > 0) or "-",
            })  # fmt: skip
        return pd.DataFrame(rows, index=pd.Index([s.source for s in self.sources], name="source"))

    def label_table(self) -> pd.DataFrame:
        """Every label's positives as a percentage of each source's images (labels x sources)."""
        return pd.DataFrame({s.source: {n: round(100 * x, 2) for n, x in s.labels.items()} for s in self.sources})

    def how(self) -> str:
        """One line on how the figures were measured: the sample is part of the result."""
        sample = (f"a seeded sample (seed {self.seed}) of at most {self.sample} image(s) per source"
                  if self.sample else "every image")  # fmt: skip
        sized = "every image's header" if self.resolution_from == "all" else "the same sample's headers"
        return (f"mean and SD: pooled pixels on [0, 1] by bit depth, of {sample} ('measured'); "
                f"resolution: {sized}; labels and views: every row")  # fmt: skip

    def render(self) -> str:
        """Plain text for ``make data-check`` and the run's ``data/heterogeneity.md``: the figures with one column
        per source (as the paper's table), each source's top labels, how it was measured, the full label table."""
        summary = self.summary()
        top = summary.pop("top labels (% of images)")
        parts = [summary.T.to_string(), "top labels (% of images):\n" + "\n".join(f"  {k}: {v}" for k, v in top.items()),
                 self.how()]  # fmt: skip
        labels = self.label_table()
        if not labels.empty:
            parts.append("label composition, % of each source's images:\n" + labels.to_string())
        return "\n\n".join(parts)

    def markdown(self) -> str:
        """The run artifact ``data/heterogeneity.md``: :meth:`render` as a preformatted block (wide tables)."""
        return f"# Source heterogeneity\n\n```text\n{self.render()}\n```\n"

    def to_json(self) -> str:
        """Every figure, unrounded (NaN as null), for machines."""
        data = {"sample": self.sample, "seed": self.seed, "resolution_from": self.resolution_from,
                "sources": [asdict(s) for s in self.sources]}  # fmt: skip
        return json.dumps(_nan_to_none(data), indent=2)


def _nan_to_none(value):
    if isinstance(value, dict):
        return {k: _nan_to_none(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_nan_to_none(v) for v in value]
    return None if isinstance(value, float) and math.isnan(value) else value


def _try(function, path: Path):
    try:
        return function(path)
    except (OSError, ValueError, AttributeError):  # missing, undecodable, a DICOM without Rows/Columns
        return None


def measure(table: pd.DataFrame, root: str | Path, labels: Sequence[str] = (), sample: int | None = DEFAULT_SAMPLE,
            seed: int = DEFAULT_SEED, resolution_from: str = "all", workers: int = 4,
            max_pixels: int | None = MAX_PIXELS) -> Heterogeneity:  # fmt: skip
    """The report for a manifest table (see the module docstring).

    Args:
        table: ``path`` required; ``source``, ``view`` and the ``labels`` columns used when present.
        sample: images decoded per source; None or 0: all of them.
        resolution_from: ``"all"`` (every image's header) or ``"sample"`` (the decoded sample's).
        max_pixels: largest canvas decoded (``data.max_pixels``); a file declaring more counts as unreadable.
    """
    if resolution_from not in ("all", "sample"):
        raise ValueError(f"heterogeneity resolution_from={resolution_from!r}: expected 'all' or 'sample'")
    root = Path(root)
    sources = table["source"].astype(str) if "source" in table.columns else pd.Series(ALL_SOURCES, table.index)
    sources = sources.replace("", "(none)")
    present = [c for c in labels if c in table.columns]
    positives = pd.DataFrame(
        {c: parse_manifest_labels(table[c].astype(str))[0] == 1 for c in present}, index=table.index
    )
    views = table["view"].map(view_group) if "view" in table.columns else pd.Series("unknown", table.index)

    picked = {}
    for name, rows in table.groupby(sources, sort=True):
        n = len(rows) if not sample else min(int(sample), len(rows))
        picked[name] = rows.index if n == len(rows) else rows.sample(n=n, random_state=seed).index.sort_values()
    sized = {name: (table.index[sources == name] if resolution_from == "all" else picked[name]) for name in picked}

    def paths(index) -> list[Path]:
        return [root / p for p in table.loc[index, "path"]]

    with ThreadPoolExecutor(max(1, workers)) as pool:
        sizes = {n: list(pool.map(lambda p: _try(header_size, p), paths(i))) for n, i in sized.items()}
        sums = {n: list(pool.map(lambda p: _try(partial(pixel_sums, max_pixels=max_pixels), p), paths(i)))
                for n, i in picked.items()}  # fmt: skip

    stats = []
    for name in picked:
        mine = sources == name
        read = np.array([s for s in sizes[name] if s is not None], dtype=np.float64).reshape(-1, 2)
        decoded = np.array([s for s in sums[name] if s is not None], dtype=np.float64).reshape(-1, 3)
        count, total, squares = decoded.sum(axis=0)
        mean = total / count if count else math.nan
        bad = {i for i, s in zip(sized[name], sizes[name], strict=True) if s is None}
        bad |= {i for i, s in zip(picked[name], sums[name], strict=True) if s is None}
        shares = views[mine].value_counts(normalize=True)
        stats.append(SourceStats(
            source=str(name), images=int(mine.sum()), sized=len(read), sampled=len(decoded), unreadable=len(bad),
            width=float(read[:, 0].mean()) if len(read) else math.nan,
            height=float(read[:, 1].mean()) if len(read) else math.nan,
            megapixels=float((read[:, 0] * read[:, 1]).mean() / 1e6) if len(read) else math.nan,
            mean=mean, sd=math.sqrt(max(squares / count - mean**2, 0.0)) if count else math.nan,
            views={v: float(shares.get(v, 0.0)) for v in VIEWS},
            labels={c: float(positives.loc[mine, c].mean()) for c in present},
        ))  # fmt: skip
    return Heterogeneity(stats, int(sample) if sample else None, seed, resolution_from)
