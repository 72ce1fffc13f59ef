"""The preprocessing cache: every image decoded, normalised and resized once, kept as one memory-mapped array.

Decoding a 7-megapixel 16-bit PNG costs far more than a forward pass at 512 px, so decoding every epoch leaves
the GPU idle; a memory map makes even a dataset larger than RAM one page-cache read per image. ``done.npy``
marks written rows, so a killed build resumes; ``errors.csv`` lists unreadable files.

The key is :func:`image_list_fingerprint` (image root and ordered (id, path) rows): another image, path or order
never reads a stale cache, while relabelling, re-splitting or dropping label columns (the Task 2 leak guard) keeps
it. Bump :data:`FORMAT_VERSION` whenever decoding or normalisation in :mod:`training.data.images` changes.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
from numpy.lib.format import open_memmap
from tqdm.auto import tqdm

from training.data.images import MAX_PIXELS, read_grayscale
from training.data.manifest import csv_line

log = logging.getLogger(__name__)

FORMAT_VERSION = 1
CACHE_ROOT = Path("data/cache/prepared")


def image_list_fingerprint(image_ids, paths, root: str | Path) -> str:
    """Short hash of the image root and the ordered ``(id, path)`` rows: what the cached pixels depend on."""
    digest = hashlib.sha256(str(Path(root).resolve()).encode())
    for image_id, path in zip(image_ids, paths, strict=True):
        digest.update(f"\n{image_id}\t{path}".encode())
    return digest.hexdigest()[:12]


@dataclass
class BuildReport:
    """What one :meth:`PreprocessedCache.build` call did."""

    total: int
    decoded: int
    skipped: int  # already in the cache from an earlier (possibly interrupted) build
    errors: list[dict] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def complete(self) -> bool:
        return not self.errors


class PreprocessedCache:
    """One cache directory (see the module docstring)."""

    def __init__(self, fingerprint: str, size: int, resize: str, root: str | Path = CACHE_ROOT):
        self.size, self.resize = int(size), resize
        self.dir = Path(root) / f"{fingerprint}-{self.size}px-{resize}-v{FORMAT_VERSION}"

    @property
    def meta(self) -> dict:
        path = self.dir / "meta.json"
        return json.loads(path.read_text()) if path.is_file() else {}

    def is_complete(self, n_rows: int | None = None) -> bool:
        """Every row written (and, when given, the row count matches the manifest)."""
        meta = self.meta
        return bool(meta.get("complete")) and (n_rows is None or meta.get("rows") == n_rows)

    def load(self) -> np.ndarray:
        """The ``(N, size, size)`` uint8 array, memory-mapped read-only."""
        return np.load(self.dir / "images.npy", mmap_mode="r")

    def build(
        self,
        paths: list[Path],
        image_ids: list[str],
        workers: int = 0,
        chunk: int = 256,
        progress: bool = True,
        max_pixels: int | None = MAX_PIXELS,
    ) -> BuildReport:
        """Decode every row not yet cached; resumable, parallel, with a progress bar.

        Threads, not processes: OpenCV and zlib release the GIL, and threads avoid the fork-after-OpenCV hangs of
        process pools. The array is flushed *before* the row flags are saved (atomically), so a kill at any moment
        leaves only rows that really are on disk marked done. ``workers`` 0 means one per CPU.
        """
        start = time.perf_counter()
        n = len(paths)
        self.dir.mkdir(parents=True, exist_ok=True)
        images_path, done_path = self.dir / "images.npy", self.dir / "done.npy"
        shape = (n, self.size, self.size)
        if images_path.is_file() and done_path.is_file() and np.load(images_path, mmap_mode="r").shape == shape:
            images, done = open_memmap(images_path, mode="r+"), np.load(done_path)
        else:
            images, done = open_memmap(images_path, mode="w+", dtype=np.uint8, shape=shape), np.zeros(n, dtype=bool)
        todo = np.flatnonzero(~done)
        report = BuildReport(total=n, decoded=0, skipped=n - len(todo))
        workers = workers or os.cpu_count() or 1

        def decode(row: int):
            try:
                return row, read_grayscale(paths[row], self.size, self.resize, max_pixels), None
            except (OSError, ValueError) as error:  # FileNotFoundError, ImageDecodeError, cv2 errors
                return row, None, str(error)

        with ThreadPoolExecutor(workers) as pool, tqdm(
            total=n, initial=report.skipped, disable=not progress, unit="img", desc=f"prepare {self.size}px"
        ) as bar:  # fmt: skip
            for begin in range(0, len(todo), chunk):
                for row, image, error in pool.map(decode, todo[begin : begin + chunk]):
                    if error is None:
                        images[row], done[row] = image, True
                        report.decoded += 1
                    else:
                        report.errors.append({"line": csv_line(row), "image_id": image_ids[row], "path": str(paths[row]),
                                              "error": error})  # fmt: skip
                    bar.update(1)
                images.flush()
                _save_atomic(done_path, done)
        report.seconds = time.perf_counter() - start
        pd.DataFrame(report.errors, columns=["line", "image_id", "path", "error"]).to_csv(
            self.dir / "errors.csv", index=False
        )
        meta = {"rows": n, "size": self.size, "resize": self.resize, "format": FORMAT_VERSION,
                "complete": bool(done.all()), "errors": len(report.errors), "seconds": round(report.seconds, 1)}  # fmt: skip
        (self.dir / "meta.json").write_text(json.dumps(meta, indent=2))
        return report


def _save_atomic(path: Path, array: np.ndarray) -> None:
    tmp = path.with_name(path.stem + ".tmp.npy")
    np.save(tmp, array)
    os.replace(tmp, path)
