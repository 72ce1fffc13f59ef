"""The challenge's robustness set: a fixed perturbed copy of the evaluation images (docs/rules.md §4).

Every model must meet *the same* perturbed pixels, otherwise a robustness gap between two runs could come from
luckier draws rather than a better model. So the perturbation parameters are drawn from a fixed seed, per image
index only (never from image content or from how many images came before), and the perturbed array is
generated once per (dataset fingerprint, image size, seed) and cached on disk; later evaluations load it.

Perturbation, as specified by the challenge: affine about the image centre with scale chosen from {0.9, 1.1} and
a translation of -10% or +10% of the image size on each axis (discrete choices, each with probability 1/2), black
border; then, with probability 0.5, additive Gaussian noise with std uniform in [0.1, 0.2] on intensities in
[0, 1], clipped. No flip, no rotation. Plain OpenCV is used rather than albumentations so the exact matrix and
noise are visible here and cannot drift with a library's sampling conventions.

The test phase perturbs at the source resolution, before any model's resize, through
:mod:`evaluation.perturbed_split` (one copy for every input size); :func:`perturbed_set` is kept, unchanged, for
callers that hold same-size images of their own and want exactly those perturbed.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import tempfile
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import cv2
import numpy as np

PERTURB_SEED = 2026
SCALES = (0.9, 1.1)  # discrete affine scale choices
TRANSLATIONS = (-0.1, 0.1)  # discrete translation choices, fraction of width (x) / height (y)
NOISE_PROB = 0.5
NOISE_STD_RANGE = (0.1, 0.2)  # on intensities in [0, 1]
CACHE_FORMAT = 1  # bump when the generation changes, so old caches are not mistaken for new ones
DEFAULT_CACHE_DIR = Path(__file__).resolve().parents[1] / "data" / "cache" / "perturbed"  # git-ignored /data/


class PerturbCacheError(ValueError):
    """A cached perturbed set exists under the requested key but does not belong to the requested images."""


@dataclass(frozen=True)
class PerturbParams:
    """Parameters of one image's perturbation.

    Attributes:
        scale: affine scale about the image centre, 0.9 or 1.1.
        tx: horizontal translation as a fraction of the width, -0.1 or +0.1 (positive moves content right).
        ty: vertical translation as a fraction of the height, -0.1 or +0.1 (positive moves content down).
        noise: whether Gaussian noise is added.
        noise_std: std of that noise on [0, 1] intensities; 0.0 when ``noise`` is false.
        noise_seed: seed of the image's noise field, so one image can be reproduced on its own.
    """

    scale: float
    tx: float
    ty: float
    noise: bool
    noise_std: float
    noise_seed: int


def draw_params(n: int, seed: int = PERTURB_SEED) -> list[PerturbParams]:
    """Draw the perturbation parameters of images ``0 .. n-1``.

    Each index gets its own generator seeded with ``(seed, index)``, so an image's parameters depend on nothing
    else: growing or truncating the set leaves the shared prefix unchanged, and image content never enters.

    Args:
        n: number of images.
        seed: the set's seed; :data:`PERTURB_SEED` for the official robustness report.
    """
    if n < 0 or seed < 0:
        raise ValueError(f"n and seed must be non-negative, got n={n}, seed={seed}")
    params = []
    for index in range(n):
        rng = np.random.default_rng([seed, index])
        # Every value is always drawn, in a fixed order, so no choice shifts the stream of the next one.
        scale = SCALES[int(rng.integers(2))]
        tx = TRANSLATIONS[int(rng.integers(2))]
        ty = TRANSLATIONS[int(rng.integers(2))]
        noise = bool(rng.random() < NOISE_PROB)
        std = float(rng.uniform(*NOISE_STD_RANGE))
        noise_seed = int(rng.integers(2**32))
        params.append(PerturbParams(scale, tx, ty, noise, std if noise else 0.0, noise_seed))
    return params


def affine_matrix(params: PerturbParams, height: int, width: int) -> np.ndarray:
    """The ``(2, 3)`` forward matrix (source -> destination pixel) of a perturbation.

    ``dst = scale * (src - centre) + centre + (tx * width, ty * height)``, with the centre at ``((W-1)/2, (H-1)/2)``
    in OpenCV's pixel-centre coordinates, so scaling alone keeps the image centred.
    """
    cx, cy = (width - 1) / 2.0, (height - 1) / 2.0
    s = params.scale
    return np.array(
        [[s, 0.0, (1.0 - s) * cx + params.tx * width], [0.0, s, (1.0 - s) * cy + params.ty * height]],
        dtype=np.float64,
    )


def perturb_image(image: np.ndarray, params: PerturbParams) -> np.ndarray:
    """Perturb one ``(H, W)`` uint8 image; returns ``(H, W)`` uint8.

    Affine first (linear interpolation, black outside the source), then noise, so the black border gets noise
    too, as it would on a noisy detector.
    """
    if image.ndim != 2 or image.dtype != np.uint8:
        raise ValueError(f"expected an (H, W) uint8 image, got shape {image.shape} dtype {image.dtype}")
    height, width = image.shape
    warped = cv2.warpAffine(
        image,
        affine_matrix(params, height, width),
        (width, height),
        flags=cv2.INTER_LINEAR,
        borderMode=cv2.BORDER_CONSTANT,
        borderValue=0,
    )  # (H, W) uint8
    if not params.noise:
        return warped
    rng = np.random.default_rng(params.noise_seed)
    noisy = warped.astype(np.float64) / 255.0 + rng.normal(0.0, params.noise_std, size=warped.shape)  # (H, W)
    return np.rint(np.clip(noisy, 0.0, 1.0) * 255.0).astype(np.uint8)


def cache_paths(fingerprint: str, height: int, width: int, seed: int, cache_dir: str | Path) -> tuple[Path, Path]:
    """The ``.npy`` array and ``.json`` sidecar of one cache key."""
    safe = re.sub(r"[^A-Za-z0-9._-]+", "_", fingerprint) or "unnamed"
    stem = Path(cache_dir) / f"{safe}_{height}x{width}_seed{seed}"
    return stem.with_suffix(".npy"), stem.with_suffix(".json")


def _content_hash(images: np.ndarray) -> str:
    """SHA-256 of the source pixels: catches a changed decoder/resizer behind an unchanged manifest fingerprint."""
    digest = hashlib.sha256()
    for image in images:  # per image: no full-array copy even for a non-contiguous view
        digest.update(np.ascontiguousarray(image).data)
    return digest.hexdigest()[:16]


def _atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` via a temporary file in the same folder, then rename (atomic on POSIX)."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.chmod(tmp, 0o644)  # mkstemp's 0600 would hide the cache from other users of a shared data folder
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _check_cache(sidecar: dict, sidecar_path: Path, fingerprint: str, seed: int, ids: list[str], source: str, shape):
    """Raise :class:`PerturbCacheError` when a cache found under the key was made from other images."""
    problems = []
    if sidecar.get("format") != CACHE_FORMAT:
        problems.append(f"cache format {sidecar.get('format')} != current {CACHE_FORMAT}")
    if sidecar.get("fingerprint") != fingerprint or sidecar.get("seed") != seed:
        problems.append(
            f"key ({sidecar.get('fingerprint')!r}, seed {sidecar.get('seed')}) != ({fingerprint!r}, {seed})"
        )
    if list(sidecar.get("shape", [])) != list(shape):
        problems.append(f"shape {sidecar.get('shape')} != requested {list(shape)}")
    cached_ids = sidecar.get("image_ids", [])
    if cached_ids != ids:
        first = next(
            (i for i, (a, b) in enumerate(zip(cached_ids, ids, strict=False)) if a != b), min(len(cached_ids), len(ids))
        )
        problems.append(
            f"image ids differ ({len(cached_ids)} cached vs {len(ids)} requested; first difference at position {first})"
        )
    elif sidecar.get("source_sha256") != source:
        problems.append("same image ids but different source pixels (image decoding or resizing changed?)")
    if problems:
        raise PerturbCacheError(
            f"perturbed-set cache {sidecar_path} does not match the requested images: {'; '.join(problems)}. "
            "Use a fingerprint that identifies this evaluation set (e.g. '<manifest fingerprint>-test'), or delete "
            "the cache files to regenerate them (every model must then be re-evaluated on the new set)."
        )


def perturbed_set(
    images: np.ndarray,
    image_ids: Sequence,
    fingerprint: str,
    seed: int = PERTURB_SEED,
    cache_dir: str | Path = DEFAULT_CACHE_DIR,
) -> np.ndarray:
    """The perturbed copy of an evaluation set, generated once and then loaded from the cache.

    The cache key is (``fingerprint``, image size, ``seed``); the sidecar JSON records the ids, parameters and a
    hash of the source pixels, and a cache whose ids (in order) or pixels differ raises instead of being reused.
    Both files are written to temporary names and renamed, the sidecar last, so an interrupted run never leaves
    a cache that looks complete.

    Args:
        images: ``(N, H, W)`` uint8 evaluation images, e.g. ``ManifestDataset.images``.
        image_ids: ``(N,)`` ids of those images, in the same order (compared as strings).
        fingerprint: identifies the evaluation set; include the split, since val and test share the manifest's
            fingerprint (e.g. ``f"{manifest.fingerprint}-test"``).
        seed: :data:`PERTURB_SEED` for the official report.
        cache_dir: folder of the cache files; created if missing.

    Returns:
        ``(N, H, W)`` uint8, read-only memory map of the cached array, row ``i`` the perturbation of ``images[i]``.
    """
    images = np.asarray(images)
    if images.ndim != 3 or images.dtype != np.uint8:
        raise ValueError(f"expected (N, H, W) uint8 images, got shape {images.shape} dtype {images.dtype}")
    ids = [str(i) for i in image_ids]
    if len(ids) != len(images):
        raise ValueError(f"{len(ids)} image ids for {len(images)} images")
    n, height, width = images.shape
    array_path, sidecar_path = cache_paths(fingerprint, height, width, seed, cache_dir)
    source = _content_hash(images)

    if sidecar_path.is_file() and array_path.is_file():
        sidecar = json.loads(sidecar_path.read_text())
        _check_cache(sidecar, sidecar_path, fingerprint, seed, ids, source, images.shape)
        return np.load(array_path, mmap_mode="r")

    array_path.parent.mkdir(parents=True, exist_ok=True)
    params = draw_params(n, seed)
    fd, tmp = tempfile.mkstemp(dir=array_path.parent, prefix=f".{array_path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        os.chmod(tmp, 0o644)
        # Written straight into a memory-mapped .npy: no second full-size copy in RAM.
        out = np.lib.format.open_memmap(tmp, mode="w+", dtype=np.uint8, shape=images.shape)  # (N, H, W)
        for index, p in enumerate(params):
            out[index] = perturb_image(images[index], p)
        out.flush()
        del out
        os.replace(tmp, array_path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    sidecar = {
        "format": CACHE_FORMAT,
        "fingerprint": fingerprint,
        "seed": seed,
        "shape": list(images.shape),
        "source_sha256": source,
        "spec": {
            "scales": SCALES,
            "translations": TRANSLATIONS,
            "noise_prob": NOISE_PROB,
            "noise_std_range": NOISE_STD_RANGE,
        },
        "image_ids": ids,
        "params": [asdict(p) for p in params],
    }
    _atomic_write_bytes(sidecar_path, json.dumps(sidecar, indent=1).encode())
    return np.load(array_path, mmap_mode="r")


def load_sidecar(fingerprint: str, height: int, width: int, seed: int = PERTURB_SEED,
                 cache_dir: str | Path = DEFAULT_CACHE_DIR) -> dict:  # fmt: skip
    """The sidecar of a cached set (ids, per-image params), e.g. to log or to break results down by parameter."""
    return json.loads(cache_paths(fingerprint, height, width, seed, cache_dir)[1].read_text())
