"""A map-style dataset over manifest rows."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset

from training.data.images import read_grayscale


class ManifestDataset(Dataset):
    """Images and targets of one split.

    With ``preload`` every image is decoded once, in threads, into one ``(N, H, W)`` uint8 array: at the
    platform's CPU sizes a whole split fits in tens of MB, and decoding a PNG costs more than augmenting it, so
    epochs after the first would otherwise redo the same work.

    Args:
        root: folder the paths are relative to.
        paths: relative image paths, ``(N,)``.
        targets: ``(N, C)`` float32, -1 where a label is missing.
        image_ids: ``(N,)`` ids carried through to predictions.
        image_size: square side the images are resized to.
        transform: albumentations pipeline ending in a tensor.
        preload: decode everything up front.
    """

    def __init__(self, root, paths, targets, image_ids, image_size, transform, preload=True, threads=4):
        self.root = Path(root)
        self.paths = list(paths)
        self.targets = torch.as_tensor(np.asarray(targets, dtype=np.float32))
        self.image_ids = list(image_ids)
        self.image_size = image_size
        self.transform = transform
        self.images: np.ndarray | None = None
        if preload:
            with ThreadPoolExecutor(threads) as pool:
                decoded = pool.map(lambda rel: read_grayscale(self.root / rel, image_size), self.paths)
                self.images = np.stack(list(decoded)) if self.paths else np.zeros((0, image_size, image_size), np.uint8)

    def __len__(self) -> int:
        return len(self.paths)

    def image(self, index: int) -> np.ndarray:
        """The decoded ``(H, W)`` uint8 image at ``index``."""
        if self.images is not None:
            return self.images[index]
        return read_grayscale(self.root / self.paths[index], self.image_size)

    def __getitem__(self, index: int) -> dict:
        return {
            "image": self.transform(image=self.image(index))["image"],  # (1, H, W) float
            "target": self.targets[index],  # (C,)
            "index": index,
        }
