"""A map-style dataset over manifest rows."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset

from training.data.images import ImageDecodeError, read_grayscale


class ManifestDataset(Dataset):
    """Images and targets of one split, from one of three places.

    * a **preprocessed cache** (``store`` plus ``positions``): rows of a memory-mapped array written by
      ``make prepare``; nothing is decoded;
    * **preloaded**: every image decoded once, in threads, into one ``(N, H, W)`` uint8 array; at the platform's
      CPU sizes a split fits in tens of MB and decoding costs more than augmenting;
    * **lazily**: decoded from the original file on every access (large sets without a cache).

    Args:
        root: folder the paths are relative to.
        paths: relative image paths, ``(N,)``.
        targets: ``(N, C)`` float32, -1 where a label is missing.
        image_ids: ``(N,)`` ids carried through to predictions.
        image_size: square side the images are resized to.
        transform: albumentations pipeline ending in a tensor.
        preload: decode everything up front (ignored when ``store`` is given).
        resize: resize mode (see :mod:`training.data.images`).
        store: ``(M, H, W)`` uint8 array holding this split's images among others (the cache), or None.
        positions: ``(N,)`` row of each image in ``store``.
    """

    def __init__(self, root, paths, targets, image_ids, image_size, transform, preload=True, threads=4,
                 resize="stretch", store=None, positions=None):  # fmt: skip
        self.root = Path(root)
        self.paths = list(paths)
        self.targets = torch.as_tensor(np.asarray(targets, dtype=np.float32))
        self.image_ids = list(image_ids)
        self.image_size = image_size
        self.resize = resize
        self.transform = transform
        self.store, self.positions = store, None if positions is None else np.asarray(positions)
        if store is None and preload:
            with ThreadPoolExecutor(threads) as pool:
                decoded = list(pool.map(self._try_decode, range(len(self.paths))))
            failed = [f"image {self.image_ids[i]!r}: {item}" for i, item in enumerate(decoded) if isinstance(item, str)]
            if failed:  # every broken file at once, not the first of many runs
                shown = failed[:10] + ([f"... and {len(failed) - 10} more"] if len(failed) > 10 else [])
                raise ImageDecodeError(f"{len(failed)} of {len(self.paths)} images cannot be read (`make data-check` "
                                       "lists them all):\n  " + "\n  ".join(shown))  # fmt: skip
            self.store = np.stack(decoded) if decoded else np.zeros((0, image_size, image_size), np.uint8)

    def _try_decode(self, index: int) -> np.ndarray | str:
        try:
            return self._decode(index)
        except (OSError, ValueError) as error:
            return str(error)

    def _decode(self, index: int) -> np.ndarray:
        return read_grayscale(self.root / self.paths[index], self.image_size, self.resize)

    @property
    def images(self) -> np.ndarray | None:
        """The split's ``(N, H, W)`` uint8 images in memory, or None when they are decoded on access."""
        if self.store is None:
            return None
        return self.store if self.positions is None else np.asarray(self.store[self.positions])

    def __len__(self) -> int:
        return len(self.paths)

    def image(self, index: int) -> np.ndarray:
        """The decoded ``(H, W)`` uint8 image at ``index``."""
        if self.store is None:
            return self._decode(index)
        return self.store[index if self.positions is None else self.positions[index]]

    def __getitem__(self, index: int) -> dict:
        return {
            "image": self.transform(image=np.ascontiguousarray(self.image(index)))["image"],  # (1, H, W) float
            "target": self.targets[index],  # (C,)
            "index": index,
        }
