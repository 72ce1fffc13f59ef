"""One perturbed copy of an evaluation split for every model: perturbed at the source resolution, stored once.

Perturbing after each model's own resize would hand a 224-px and a 384-px model different pixels (border,
interpolation and noise drawn at two sizes). The challenge's robustness set is one fixed copy of the images
(docs/rules.md §4), so each image is perturbed as decoded, capped at ``max_side``, and every model then resizes
the stored copy as it does its plain test images. Translation is a fraction of each image's size, so geometry
does not depend on resolution. The cache key names the images, side, seed and pipeline version, never a
model's input size, so models of any size share one copy; it is built under a temporary name and renamed, so an
interrupted build leaves nothing that looks complete. See docs/evaluation.md, "The perturbed set at the source
resolution".
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from pathlib import Path

import cv2
import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from evaluation import perturb
from evaluation.perturb import DEFAULT_CACHE_DIR, PERTURB_SEED, PerturbCacheError, draw_params, perturb_image
from evaluation.tta import TTAPredictor

log = logging.getLogger(__name__)

CANONICAL_MAX_SIDE = 1024  # px, longer side; see the module docstring for why
SOURCE_FORMAT = 1  # bump when the generation at source resolution changes, so an old copy is never reused
META, PIXELS, SHAPES = "meta.json", "pixels.u8", "shapes.npy"


def canonical(image: np.ndarray, max_side: int | None) -> np.ndarray:
    """``image`` with its longer side brought down to ``max_side`` (area interpolation, aspect kept); unchanged
    when it is no larger or ``max_side`` is None. Never upsamples: a larger copy would hold no more information."""
    height, width = image.shape
    if max_side is None or max(height, width) <= max_side:
        return image
    scale = max_side / max(height, width)
    size = (max(1, round(width * scale)), max(1, round(height * scale)))
    return cv2.resize(image, size, interpolation=cv2.INTER_AREA)


class RaggedImages:
    """``N`` uint8 images of any shapes, read from one flat memory-mapped file; ``images[i]`` is ``(H_i, W_i)``."""

    def __init__(self, pixels: np.ndarray, shapes: np.ndarray):
        self.pixels, self.shapes = pixels, np.asarray(shapes, dtype=np.int64)  # (P,), (N, 2)
        self.offsets = np.concatenate([[0], np.cumsum(self.shapes[:, 0] * self.shapes[:, 1])])  # (N + 1,)

    @classmethod
    def load(cls, folder: Path) -> RaggedImages:
        shapes = np.load(folder / SHAPES)
        pixels = np.memmap(folder / PIXELS, dtype=np.uint8, mode="r") if shapes.size else np.zeros(0, np.uint8)
        return cls(pixels, shapes)

    def __len__(self) -> int:
        return len(self.shapes)

    def __getitem__(self, index: int) -> np.ndarray:
        height, width = self.shapes[index]
        return self.pixels[self.offsets[index] : self.offsets[index + 1]].reshape(height, width)


def cache_folder(split: str, fingerprint: str, max_side: int | None, seed: int, cache_dir: str | Path) -> Path:
    """The folder of one perturbed copy: (split's images, canonical side, seed, format); no model size in it."""
    side = "source" if max_side is None else f"max{int(max_side)}px"
    name = re.sub(r"[^A-Za-z0-9._-]+", "_", f"{split}-{fingerprint}-{side}-seed{seed}-v{SOURCE_FORMAT}")
    return Path(cache_dir) / name


def _file_stats(dataset) -> list[list[int]]:
    """``[size, mtime_ns]`` of every source file: cheap to compare, and a regenerated file changes them."""
    stats = [os.stat(Path(dataset.root) / path) for path in dataset.paths]
    return [[s.st_size, s.st_mtime_ns] for s in stats]


def _check(meta: dict, folder: Path, ids: list[str], stats: list[list[int]], seed: int, max_side) -> None:
    """Raise :class:`PerturbCacheError` when the copy found under the key was not made from these files."""
    problems = []
    if meta.get("format") != SOURCE_FORMAT or meta.get("seed") != seed or meta.get("max_side") != max_side:
        problems.append(f"format/seed/side {meta.get('format')}/{meta.get('seed')}/{meta.get('max_side')} != "
                        f"{SOURCE_FORMAT}/{seed}/{max_side}")  # fmt: skip
    if meta.get("image_ids") != ids:
        problems.append(f"image ids differ ({len(meta.get('image_ids', []))} cached vs {len(ids)} requested)")
    else:
        changed = next((i for i, (a, b) in enumerate(zip(meta.get("file_stats", []), stats, strict=False)) if a != b),
                       None)  # fmt: skip
        if changed is not None:
            problems.append(f"source file of image {ids[changed]!r} changed since the copy was made (size or time)")
    if problems:
        raise PerturbCacheError(
            f"perturbed-set cache {folder} does not match the requested images: {'; '.join(problems)}. Delete the "
            "folder to regenerate it (every model must then be re-evaluated on the new set)."
        )


def perturbed_sources(dataset, split: str = "test", seed: int = PERTURB_SEED,
                      max_side: int | None = CANONICAL_MAX_SIDE, cache_dir: str | Path = DEFAULT_CACHE_DIR,
                      workers: int = 0) -> RaggedImages:  # fmt: skip
    """The perturbed copy of ``dataset``'s images at the canonical size, built on first use and then loaded.

    Args:
        dataset: a :class:`training.data.dataset.ManifestDataset`.
        seed: :data:`evaluation.perturb.PERTURB_SEED` for the official report.
        max_side: canonical longer side (None: the exact source resolution).
        workers: decoding threads; 0 means up to four, one per CPU.

    Returns:
        Row ``i`` the perturbation of image ``i`` at its canonical size, memory-mapped read-only.
    """
    ids = [str(i) for i in dataset.image_ids]
    folder = cache_folder(split, dataset.source_fingerprint, max_side, seed, cache_dir)
    stats = _file_stats(dataset)
    if (folder / META).is_file():
        _check(json.loads((folder / META).read_text()), folder, ids, stats, seed, max_side)
        return RaggedImages.load(folder)
    _build(dataset, folder, ids, stats, seed, max_side, workers or min(4, os.cpu_count() or 1))
    return RaggedImages.load(folder)


def _build(dataset, folder: Path, ids: list[str], stats, seed: int, max_side, workers: int) -> None:
    """Decode, bring to the canonical size, perturb and append every image; the folder appears only when done."""
    start = time.perf_counter()
    folder.parent.mkdir(parents=True, exist_ok=True)
    params = draw_params(len(ids), seed)
    tmp = Path(tempfile.mkdtemp(dir=folder.parent, prefix=f".{folder.name}.", suffix=".tmp"))
    try:
        shapes = np.zeros((len(ids), 2), dtype=np.int64)

        def one(index: int) -> np.ndarray:
            return perturb_image(canonical(dataset.source_image(index), max_side), params[index])

        with open(tmp / PIXELS, "wb") as handle, ThreadPoolExecutor(workers) as pool:
            for begin in range(0, len(ids), 64):  # threads decode a chunk; rows are written in order
                for index, image in zip(range(begin, min(begin + 64, len(ids))),
                                        pool.map(one, range(begin, min(begin + 64, len(ids)))), strict=True):  # fmt: skip
                    shapes[index] = image.shape
                    handle.write(np.ascontiguousarray(image).data)
        np.save(tmp / SHAPES, shapes)
        meta = {
            "format": SOURCE_FORMAT, "seed": seed, "max_side": max_side, "fingerprint": dataset.source_fingerprint,
            "spec": {"scales": perturb.SCALES, "translations": perturb.TRANSLATIONS, "noise_prob": perturb.NOISE_PROB,
                     "noise_std_range": perturb.NOISE_STD_RANGE},
            "bytes": int((shapes[:, 0] * shapes[:, 1]).sum()), "seconds": round(time.perf_counter() - start, 1),
            "image_ids": ids, "file_stats": stats, "params": [asdict(p) for p in params],
        }  # fmt: skip
        (tmp / META).write_text(json.dumps(meta, indent=1))  # last: a folder with meta.json is complete
        os.chmod(tmp, 0o755)  # mkdtemp's 0700 would hide the copy from other users of a shared data folder
        try:
            os.rename(tmp, folder)
        except OSError:  # another process finished the same copy first: the same pixels, keep theirs
            if not (folder / META).is_file():
                raise
            shutil.rmtree(tmp, ignore_errors=True)
        log.info("perturbed %d images at %s in %.1fs into %s (%.1f MB)", len(ids),
                 "source size" if max_side is None else f"<= {max_side} px", meta["seconds"], folder,
                 meta["bytes"] / 1e6)  # fmt: skip
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


class PerturbedSplit(Dataset):
    """A split's perturbed copy as the model sees it: each stored image through the split's own resize and
    transform (:meth:`ManifestDataset.model_input`), items shaped like the split's (``image``, ``target``,
    ``index``, ``view`` when the split routes by view)."""

    def __init__(self, images: RaggedImages, dataset):
        if len(images) != len(dataset):
            raise ValueError(f"{len(images)} perturbed images for a split of {len(dataset)}")
        self.images, self.dataset = images, dataset

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, index: int) -> dict:
        item = {"image": self.dataset.model_input(self.images[index]), "target": self.dataset.targets[index],
                "index": index}  # fmt: skip
        views = getattr(self.dataset, "views", None)
        if views is not None:
            item["view"] = views[index]
        return item


def perturbed_split(datamodule, cfg, split: str = "test") -> PerturbedSplit:
    """The perturbed copy of ``datamodule``'s ``split`` for this model's input pipeline.

    Args:
        datamodule: a set-up ``CXRDataModule``.
        cfg: the ``evaluation.perturbation`` node (``seed``, ``cache_dir``, optional ``max_side``).
        split: which split's images.
    """
    dataset = datamodule.datasets[split]
    max_side = cfg.get("max_side", CANONICAL_MAX_SIDE)
    if max_side is not None and dataset.image_size > max_side:
        log.warning("model input %d px is larger than the perturbed set's canonical side %d px: its perturbed "
                    "images are upsampled (evaluation.perturbation.max_side)", dataset.image_size, max_side)  # fmt: skip
    images = perturbed_sources(dataset, split, seed=cfg.seed, max_side=max_side, cache_dir=cfg.cache_dir)
    return PerturbedSplit(images, dataset)


def predict_perturbed(model: torch.nn.Module, datamodule, cfg, split: str = "test") -> np.ndarray:
    """``(N, C)`` probabilities of ``model`` on the perturbed copy of ``split``, rows in manifest order."""
    loader = DataLoader(perturbed_split(datamodule, cfg, split), batch_size=datamodule.batch_size, shuffle=False)
    return TTAPredictor(["identity"]).predict(model, loader)
