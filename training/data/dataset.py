"""A map-style dataset over manifest rows."""

from __future__ import annotations

import mmap
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

import albumentations as A
import numpy as np
import torch
from albumentations.pytorch import ToTensorV2
from torch.utils.data import Dataset, default_collate

from training.data.cache import FORMAT_VERSION, image_list_fingerprint
from training.data.images import MAX_PIXELS, RESIZERS, ImageDecodeError, check_file, decode, read_grayscale, to_uint8
from training.data.row_tasks import row_problems
from training.data.targeted_augment import CLASS_TARGETS

# Projection spellings seen across sources (NIH "PA"/"AP", MIMIC "AP AXIAL", "XTABLE LATERAL", "LL", PadChest
# "AP_horizontal", lower case from hand-made manifests) folded onto one name, so a view-routed model configured
# with ``views: [PA, AP, LATERAL]`` routes every source alike.
VIEW_SYNONYMS = {"PA": "PA", "POSTEROANTERIOR": "PA", "AP": "AP", "ANTEROPOSTERIOR": "AP"}
LATERAL_WORDS = {"LATERAL", "LAT", "LL", "RL", "LLAT", "RLAT"}
NO_VIEW = {"", "NAN", "NONE", "NULL", "NA", "UNKNOWN"}


def canonical_view(value) -> str | None:
    """The projection a manifest's ``view`` value names: ``PA``, ``AP``, ``LATERAL``, another name upper-cased, or
    None when the value says nothing (empty, NaN).

    The first word decides PA/AP ("AP Supine", "PA LLD", "P-A" are frontal films); a lateral word
    anywhere makes it ``LATERAL`` ("XTABLE LATERAL", "Left lateral").
    """
    if value is None or (isinstance(value, float) and np.isnan(value)):
        return None
    words = "".join(c if c.isalnum() else " " for c in str(value).upper()).split()
    if not words or " ".join(words) in NO_VIEW:
        return None
    if len(words) > 1 and words[0] + words[1] in ("PA", "AP"):  # "P-A", "A/P"
        words = [words[0] + words[1], *words[2:]]
    if words[0] in VIEW_SYNONYMS:
        return VIEW_SYNONYMS[words[0]]
    if LATERAL_WORDS.intersection(words):
        return "LATERAL"
    return " ".join(words)


def string_array(values) -> np.ndarray:
    """``(N,)`` numpy array of variable-width strings (``StringDType``): one buffer, no Python object per row, and
    indexing it gives a plain ``str``."""
    if isinstance(values, np.ndarray) and isinstance(values.dtype, np.dtypes.StringDType):
        return values
    return np.array([str(value) for value in values], dtype=np.dtypes.StringDType())


def view_indices(values, views) -> np.ndarray:
    """``(N,)`` int64 position of each value's canonical view in ``views`` (also canonicalised); -1 when the value
    names no view or one outside the list, which the routed model treats as unknown rather than an error."""
    order = {canonical_view(name): i for i, name in enumerate(views)}
    return np.asarray([order.get(canonical_view(value), -1) for value in values], dtype=np.int64)


class ManifestDataset(Dataset):
    """Images and targets of one split, from one of three places.

    * a **preprocessed cache** (``store`` plus ``positions``): rows of a memory-mapped array; nothing is decoded;
    * **preloaded**: decoded once into one ``(N, H, W)`` uint8 array; at the platform's CPU sizes a split fits in
      tens of MB and decoding costs more than augmenting;
    * **lazily**: decoded on every access, each file checked first (a few KB), so a broken file stops the command
      before training, not in a loader worker hours into it.

    ``targets`` are ``(N, C)`` float32, -1 where a label is missing; ``views`` (-1 unknown) become each item's
    ``"view"``. ``max_pixels`` travels with the dataset into loader workers. Raises ``ImageDecodeError`` listing
    every file that cannot be read.
    """

    def __init__(self, root, paths, targets, image_ids, image_size, transform, preload=True, threads=4,
                 resize="stretch", store=None, positions=None, views=None, max_pixels=MAX_PIXELS):  # fmt: skip
        self.root = Path(root)
        # Per-item state is numpy arrays, never Python lists: a forked loader worker that touches a list's str
        # objects (their refcounts) copies the pages holding them, so over an epoch every worker would end up with
        # its own copy of the whole table; an array is one object whose buffer is only ever read.
        self.paths = string_array(paths)
        self.targets = torch.as_tensor(np.asarray(targets, dtype=np.float32))
        self.image_ids = string_array(image_ids)
        self.image_size = image_size
        self.resize = resize
        self.transform = transform
        self.store, self.positions = store, None if positions is None else np.asarray(positions, dtype=np.int64)
        self.views = None if views is None else torch.as_tensor(np.asarray(views, dtype=np.int64))
        self.max_pixels = max_pixels
        if store is None:
            self._read_all(preload, threads)

    def _read_all(self, preload: bool, threads: int) -> None:
        """Decode every file into one preallocated ``(N, H, W)`` array (preload), or check every file (lazy);
        raise listing every file that cannot be read, not the first of many runs."""
        n = len(self.paths)
        images = np.zeros((n, self.image_size, self.image_size), np.uint8) if preload else None

        def attempt(index: int) -> str | None:
            try:
                if images is None:
                    self._check(index)
                else:
                    images[index] = self._decode(index)
            except (OSError, ValueError) as error:
                return f"image {self.image_ids[index]!r}: {error}"
            return None

        failed = row_problems(attempt, n, threads)
        if failed:
            shown = failed[:10] + ([f"... and {len(failed) - 10} more"] if len(failed) > 10 else [])
            raise ImageDecodeError(f"{len(failed)} of {n} images cannot be read (`make data-check` "
                                   "lists them all):\n  " + "\n  ".join(shown))  # fmt: skip
        self.store = images

    def _check(self, index: int) -> None:
        check_file(self.root / self.paths[index], self.max_pixels)

    def _decode(self, index: int) -> np.ndarray:
        return read_grayscale(self.root / self.paths[index], self.image_size, self.resize, self.max_pixels)

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

    def source_image(self, index: int) -> np.ndarray:
        """The ``(H, W)`` uint8 image at ``index`` as decoded and intensity-normalised, before any resize: what the
        robustness set perturbs, so that models at different input sizes meet the same pixels (docs/rules.md §4)."""
        return to_uint8(decode(self.root / self.paths[index], self.max_pixels))

    @property
    def source_fingerprint(self) -> str:
        """What :meth:`source_image` depends on: the ordered ``(id, path)`` rows, their root and the decoder's
        version (:data:`training.data.cache.FORMAT_VERSION`); not the input size, resize mode or labels."""
        return f"{image_list_fingerprint(self.image_ids, self.paths, self.root)}-d{FORMAT_VERSION}"

    def model_input(self, image: np.ndarray) -> torch.Tensor:
        """``(1, size, size)`` float: any ``(H, W)`` uint8 image through this dataset's own resize and transform,
        as its stored images go (the perturbed set's images, perturbed at their source size, are fed this way)."""
        resized = RESIZERS[self.resize](np.ascontiguousarray(image), self.image_size)
        return self.transform(image=np.ascontiguousarray(resized))["image"]

    def __getitem__(self, index: int) -> dict:
        item = {
            # the target row rides along for label-aware steps (training/data/targeted_augment.py); others ignore it
            "image": self.transform(
                image=np.ascontiguousarray(self.image(index)), **{CLASS_TARGETS: self.targets[index].numpy()}
            )["image"],  # (1, H, W) float
            "target": self.targets[index],  # (C,)
            "index": index,
        }
        if self.views is not None:
            item["view"] = self.views[index]  # () int64, -1 = unknown
        return item

    def __getitems__(self, indices: list[int]) -> Sequence[dict]:
        """A batch's items at once (the loader's batched fetch): what ``[self[i] for i in indices]`` gives.

        When the pipeline is only the normalisation and the images are in memory, the whole batch goes through a
        256-entry table in one step and comes back already stacked (:class:`StackedItems`): at small image sizes the
        per-item pipeline and the unstack/restack for collation cost more than the model's step, so the loader set the
        pace. Any other pipeline goes item by item.
        """
        table = self._pixel_table()
        if table is None or self.store is None:
            return [self[index] for index in indices]
        rows = np.asarray(indices, dtype=np.int64)
        store = self.store.view(np.ndarray) if isinstance(self.store, np.memmap) else self.store
        batch = {
            # np.take: the table's values as fancy indexing gives them, a third faster on a 64-image batch
            "image": torch.from_numpy(np.take(table, store[rows if self.positions is None else self.positions[rows]])).unsqueeze(1),
            "target": torch.from_numpy(self.targets.numpy()[rows]),
            "index": torch.from_numpy(rows),
        }  # fmt: skip
        if self.views is not None:
            batch["view"] = torch.from_numpy(self.views.numpy()[rows])
        return StackedItems(batch)

    @property
    def batch_pixels_in_memory(self) -> bool:
        """Whether :meth:`__getitems__` serves a batch with one table lookup (images in memory, pipeline a pure
        per-pixel map): such a batch costs the training process less than receiving it from a loader worker."""
        return self.store is not None and self._pixel_table() is not None

    def _pixel_table(self) -> np.ndarray | None:
        """``(256,)`` float32: the pipeline's output for each uint8 value, when the pipeline is a pure per-pixel map
        (a standard :class:`~albumentations.Normalize` then :class:`~albumentations.pytorch.ToTensorV2`, nothing
        random); None otherwise. Computed through the pipeline itself, so it is the pipeline's own arithmetic."""
        if getattr(self, "_table_for", None) is not self.transform:
            self._table_for, self._table = self.transform, None
            if pixelwise(self.transform):
                values = np.arange(256, dtype=np.uint8).reshape(16, 16)
                self._table = np.ascontiguousarray(self.transform(image=values)["image"].numpy().reshape(256))
        return self._table

    def __getstate__(self) -> dict:
        """What a spawned loader worker receives: a memory-mapped cache travels as its file name, not its pixels."""
        state = self.__dict__.copy()
        store = state["store"]
        if isinstance(store, np.memmap) and isinstance(store.base, mmap.mmap) and store.flags.c_contiguous:
            # a whole mapping (not a view into one, whose offset attribute would still be its parent's)
            state["store"] = MappedArray(store.filename, store.dtype.str, store.shape, store.offset)
        return state

    def __setstate__(self, state: dict) -> None:
        if isinstance(state["store"], MappedArray):
            state["store"] = state["store"].open()
        self.__dict__.update(state)


class StackedItems(Sequence):
    """A batch's items held as the stacked batch: item ``k`` is row ``k`` of every tensor (``"index"`` as an int, as
    :meth:`ManifestDataset.__getitem__` gives it), so ``default_collate`` of it is ``batch``, value for value."""

    def __init__(self, batch: dict[str, torch.Tensor]):
        self.batch = batch

    def __len__(self) -> int:
        return len(self.batch["index"])

    def __getitem__(self, k: int) -> dict:
        if not -len(self) <= k < len(self):
            raise IndexError(k)
        return {key: int(value[k]) if key == "index" else value[k] for key, value in self.batch.items()}


def collate_items(items: Sequence[dict]) -> dict:
    """The loaders' collate function: a :class:`StackedItems` batch as it is, anything else by ``default_collate``."""
    return items.batch if isinstance(items, StackedItems) else default_collate(items)


class MappedArray(NamedTuple):
    """A read-only memory map, as its file and layout (a pickled ``np.memmap`` would carry its whole buffer)."""

    filename: str
    dtype: str
    shape: tuple
    offset: int

    def open(self) -> np.memmap:
        return np.memmap(self.filename, dtype=self.dtype, mode="r", shape=self.shape, offset=self.offset)


def pixelwise(transform) -> bool:
    """Whether an albumentations pipeline maps each uint8 pixel value to one output value, the same for every
    pixel and every call: exactly a standard ``Normalize`` followed by ``ToTensorV2``."""
    steps = list(getattr(transform, "transforms", ()))
    return (
        type(transform) is A.Compose
        and transform.p == 1
        and [type(step) for step in steps] == [A.Normalize, ToTensorV2]
        and steps[0].normalization == "standard"
        and steps[0].p == 1
        and steps[1].p == 1
    )
