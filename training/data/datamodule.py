"""The LightningDataModule: manifest in, validated splits and loaders out."""

from __future__ import annotations

import gc
import logging
from collections.abc import Callable, Sequence
from functools import partial

import lightning.pytorch as L
import numpy as np
import torch
from lightning.fabric.utilities.seed import pl_worker_init_function
from torch.utils.data import DataLoader, get_worker_info

from training.data.cache import CACHE_ROOT, PreprocessedCache, image_list_fingerprint
from training.data.dataset import ManifestDataset, collate_items, view_indices
from training.data.images import MAX_PIXELS
from training.data.manifest import Manifest, load_manifest
from training.data.normal_label import NORMAL, mask_unlabelled_normal, unlabelled_rows
from training.data.sources import image_roots, manifest_vocabulary
from training.data.targeted_augment import select_targeted_classes
from training.data.transforms import build_transform, stream_seed
from training.hardware import on_cuda, persistent_workers, pin_memory
from training.samplers.base import SamplingStrategy
from training.samplers.distributed import EvalShardSampler, TrainShardSampler

log = logging.getLogger(__name__)

# Last key of the seed of the training loader's own generator (shuffle order, loader-worker seeds), so that it is
# unrelated to the augmentation seed of the same ``(seed, rank, epoch)``.
LOADER_STREAM = 1


class ForkSharingLoader(DataLoader):
    """A ``DataLoader`` whose forked workers share the parent's Python objects instead of copying them.

    A full garbage collection in a worker writes to the header of every object it tracks, so each worker would
    copy, page by page, the parent's whole Python heap (the imported libraries, the manifest, the modules) within
    its first few hundred batches. :func:`gc.freeze` moves everything alive to a generation the collector never
    visits, for the moment the workers are forked; the parent unfreezes at once (the workers keep their own,
    frozen, view), so its own collection is unchanged.
    """

    def __iter__(self):
        if self.num_workers == 0:
            return super().__iter__()
        gc.freeze()
        try:
            return super().__iter__()
        finally:
            gc.unfreeze()


class TrainLoader(ForkSharingLoader):
    """A ``DataLoader`` that calls ``begin_pass(self)`` at the start of every pass, before its iterator exists.

    Before the iterator, because creating it already draws: the workers' base seed (from ``generator``), and the
    first batch, which Lightning prefetches at once. Lightning's own ``set_epoch`` is no substitute: in the first
    epoch of a fit it reaches the sampler only after that first iterator was made (the trainer builds the loader
    while configuring the optimisers, before it restores the loops from a checkpoint), so a resumed fit would draw
    its first epoch as epoch 0.
    """

    def __init__(self, *args, begin_pass: Callable[[DataLoader], None], **kwargs):
        super().__init__(*args, **kwargs)
        self.begin_pass = begin_pass

    def __iter__(self):
        self.begin_pass(self)
        return super().__iter__()


IN_PROCESS_PIXELS = 2**20
"""Largest batch (images x pixels) a loader reads in the training process instead of in its workers, when the batch
is one table lookup (:attr:`ManifestDataset.batch_pixels_in_memory`): up to this size, handing a batch over from a
worker (shared memory, a file descriptor per tensor, a queue) costs more than computing it here (docs/measurements.md,
``make bench-scale``)."""


def loader_workers(dataset, batch_size: int, requested: int, in_process_pixels: int = IN_PROCESS_PIXELS) -> int:
    """Worker processes for a loader over ``dataset``: ``requested``, or 0 when its batches are cheaper to compute
    in the training process than to receive from a worker (at most ``in_process_pixels``). The batches are the same
    either way: the order comes from the sampler and the loader's generator, and a pure per-pixel map draws
    nothing."""
    if requested == 0 or not getattr(dataset, "batch_pixels_in_memory", False):
        return requested
    return 0 if batch_size * dataset.image_size**2 <= in_process_pixels else requested


class CXRDataModule(L.LightningDataModule):
    """Loads one manifest and serves its train/val/test splits.

    Args:
        source: object with ``prepare() -> manifest path`` and ``root`` (see :mod:`training.data.sources`).
        labels: the task's label columns, in output order.
        image_size: square side images are resized to.
        batch_size: per-device batch size.
        num_workers: loader worker processes; 0 keeps augmentation in the training process, which is fastest
            on two cores when images are preloaded. A loader whose batches are one table lookup of at most
            ``in_process_pixels`` pixels reads them in the training process whatever this says (``loader_workers``).
        preload: decode each split once into memory.
        train_augment: albumentations steps for training (eval uses none).
        sampler: training sampling strategy.
        subset: optional ``{split: max images}`` to cut splits down (smoke runs); the first rows are kept so
            the cut is deterministic.
        extra_columns: non-label manifest columns to accept.
        seed: seed for samplers and training augmentation.
        resize: how non-square images become square (``pad``, ``crop``, ``stretch``; see
            :mod:`training.data.images`).
        cache: read the preprocessing cache of ``make prepare`` when one exists for this manifest and size.
        cache_root: where caches live.
        views: projection names a view-routed model routes between (``model.views``); each item then carries
            ``"view"``, the index of its manifest ``view`` in this list (-1 unknown or no ``view`` column). None:
            items carry no view.
        loader_settings: ``pin_memory`` and ``persistent_workers`` of the loaders, each ``auto``, ``true`` or
            ``false`` (:mod:`training.hardware`); ``configs/gpu`` sets them through its callback before the loaders
            are built. ``auto`` pins batches only when the Trainer runs on CUDA.
        max_pixels: largest canvas an image file may declare (``data.max_pixels``); larger files are refused
            before they are decoded, here and in loader workers.
        allow_outside_root: read manifest paths that leave the data root (``data.allow_outside_root``); refused
            by default (:func:`training.data.manifest.check_manifest`).
        in_process_pixels: largest table-lookup batch (images x pixels) read in the training process rather than
            in ``num_workers`` workers (default ``IN_PROCESS_PIXELS``; 0 always uses the workers).
    """

    def __init__(
        self,
        source,
        labels: Sequence[str],
        image_size: int,
        batch_size: int,
        num_workers: int = 0,
        preload: bool = True,
        train_augment: Sequence | None = None,
        sampler: SamplingStrategy | None = None,
        subset: dict | None = None,
        extra_columns: Sequence[str] = (),
        seed: int = 0,
        resize: str = "stretch",
        cache: bool = True,
        cache_root: str = str(CACHE_ROOT),
        views: Sequence[str] | None = None,
        loader_settings: dict | None = None,
        max_pixels: int | None = MAX_PIXELS,
        allow_outside_root: bool = False,
        in_process_pixels: int = IN_PROCESS_PIXELS,
    ):
        super().__init__()
        self.source = source
        self.labels = tuple(labels)
        self.image_size = image_size
        self.batch_size = batch_size
        self.num_workers = num_workers
        self.preload = preload
        self.train_augment = train_augment
        self.sampler = sampler
        self.subset = dict(subset or {})
        self.extra_columns = tuple(extra_columns)
        self.seed = seed
        self.resize, self.cache, self.cache_root = resize, cache, cache_root
        self.views = None if views is None else tuple(views)
        self.loader_settings = {"pin_memory": "auto", "persistent_workers": "auto", **(loader_settings or {})}
        self.max_pixels, self.allow_outside_root = max_pixels, allow_outside_root
        self.in_process_pixels = in_process_pixels
        self.store: np.ndarray | None = None
        self.manifest: Manifest | None = None
        self.datasets: dict[str, ManifestDataset] = {}
        self.train_epoch = 0  # the epoch of the next training pass; the one piece of state a resume needs

    def state_dict(self) -> dict[str, int]:
        """What a resumed fit needs to draw and augment its next epoch as an uninterrupted one would.

        Only the epoch number: every random choice of a training pass is a pure function of ``(seed, rank, epoch,
        loader worker)`` (see :meth:`_begin_train_pass`), so no generator state has to be saved. Saving streams
        instead would not work with loader workers, whose generators live in other processes.
        """
        return {"train_epoch": self.train_epoch}

    def load_state_dict(self, state_dict: dict[str, int]) -> None:
        self.train_epoch = int(state_dict["train_epoch"])

    def prepare_data(self) -> None:
        """Build the manifest (and its images) once, on the main process."""
        self.manifest_path = self.source.prepare()

    def setup(self, stage: str | None = None) -> None:
        """Validate the manifest and build the three datasets; a second call is free."""
        if self.manifest is not None:
            return
        manifest_path = getattr(self, "manifest_path", None) or self.source.prepare()
        self.manifest = load_manifest(
            manifest_path, self.labels, manifest_vocabulary(self.source), root=self.source.root,
            extra_columns=self.extra_columns + tuple(getattr(self.source, "extra_columns", ())),
            image_roots=image_roots(self.source, self.allow_outside_root),
        )  # fmt: skip
        self.store = self._cached_images()
        for split in ("train", "val", "test"):
            self.datasets[split] = self._dataset(split)
            log.info("%s split: %d images", split, len(self.datasets[split]))

    def _cached_images(self) -> np.ndarray | None:
        """The memory-mapped cache for this manifest and size, or None (said either way: it changes speed 10x)."""
        if not self.cache:
            return None
        table = self.manifest.table
        key = image_list_fingerprint(table["image_id"], table["path"], self.manifest.root)
        cache = PreprocessedCache(key, self.image_size, self.resize, self.cache_root)
        if cache.is_complete(len(self.manifest.table)):
            log.info("reading the preprocessed cache %s", cache.dir)
            return cache.load()
        log.info("no complete preprocessed cache at %s: decoding the original images (`make prepare` builds it)",
                 cache.dir)  # fmt: skip
        return None

    def _dataset(self, split: str) -> ManifestDataset:
        rows = self.manifest.split(split)
        targets = self.manifest.targets(split)
        positions = self.manifest.positions(split)
        limit = self.subset.get(split)
        if limit is not None:
            rows, targets, positions = rows.iloc[:limit], targets[:limit], positions[:limit]
        if len(rows) == 0:
            raise ValueError(f"{self.manifest.source_file}: split {split!r} is empty")
        if split == "train" and NORMAL in self.labels:  # an all-zero row is no Normal label (docs/rules.md §12)
            log.info("train split: %d rows without any positive label; their Normal target is not labelled",
                     unlabelled_rows(targets))  # fmt: skip
            targets = mask_unlabelled_normal(targets, self.labels)
        steps = self.train_augment if split == "train" else None
        views = None
        if self.views is not None:
            views = view_indices(rows["view"], self.views) if "view" in rows else np.full(len(rows), -1, np.int64)
        transform = build_transform(steps)
        if split == "train":  # a step that targets the rare classes picks them from this split's counts
            select_targeted_classes(transform, targets)
        return ManifestDataset(
            self.manifest.root, rows["path"], targets, rows["image_id"], self.image_size, transform,
            preload=self.preload, resize=self.resize, store=self.store,
            positions=positions if self.store is not None else None, views=views, max_pixels=self.max_pixels,
        )  # fmt: skip

    @property
    def class_counts(self) -> np.ndarray:
        """Positives per label on the training split actually used, ``(C,)``."""
        return (self.datasets["train"].targets.numpy() == 1).sum(axis=0)

    @property
    def n_train(self) -> int:
        return len(self.datasets["train"])

    def split_frame(self, split: str):
        """Manifest rows of a split, cut like its dataset, for writing predictions."""
        return self.manifest.split(split).iloc[: len(self.datasets[split])]

    def released_targets(self, split: str) -> np.ndarray:
        """``(N, C)`` targets of a split as the manifest holds them, cut like its dataset (-1 = not labelled).

        The dataset's own targets are what training learns from, which on the train split differ from the release:
        ``Normal`` of a row without any positive label is masked (docs/rules.md §12). Anything that scores rows of
        the train split against the truth (the held-out subset) must read the release's labels, as the organisers'
        scorer would, or those rows count as unlabelled.
        """
        return self.manifest.targets(split)[: len(self.datasets[split])]

    def unseen_test_targets(self, unseen: Sequence[str]) -> np.ndarray:
        """``(N, U)`` test targets of a zero-shot task's unseen classes, aligned with the test split (-1 = missing).

        Read here and only here, from the full manifest the leak guard set aside: training never saw them.

        Raises:
            ValueError: the manifest has no such columns or its test rows differ from the training manifest's.
        """
        manifest_path = getattr(self.source, "full_manifest", None) or self.source.prepare()
        full = load_manifest(manifest_path, list(unseen), manifest_vocabulary(self.source), root=self.source.root,
                             check_files=False,
                             extra_columns=tuple(getattr(self.source, "extra_columns", ())))  # fmt: skip
        rows = self.split_frame("test")
        full_rows = full.split("test").iloc[: len(rows)]
        if list(full_rows["image_id"]) != list(rows["image_id"]):
            raise ValueError(f"{manifest_path}: test rows differ from the training manifest's; cannot align labels")
        return full.targets("test")[: len(rows)]

    def unseen_split(self, unseen: Sequence[str], split: str):
        """``(rows, targets, dataset)`` of one split of the full manifest with the unseen classes as targets.

        For Task 2's held-out draw (200 of the development set, scored on the unseen classes): the split as the
        release holds it, not as training saw it (a zero-shot task's training rule may set images aside), cut like
        its dataset (``data.subset``) and loaded without augmentation. Nothing of it reaches training.
        """
        manifest_path = getattr(self.source, "full_manifest", None) or self.source.prepare()
        full = load_manifest(manifest_path, list(unseen), manifest_vocabulary(self.source), root=self.source.root,
                             check_files=False, image_roots=image_roots(self.source, self.allow_outside_root),
                             extra_columns=tuple(getattr(self.source, "extra_columns", ())))  # fmt: skip
        rows, targets, positions = full.split(split), full.targets(split), full.positions(split)
        limit = self.subset.get(split)
        if limit is not None:
            rows, targets, positions = rows.iloc[:limit], targets[:limit], positions[:limit]
        table = full.table
        cache = PreprocessedCache(image_list_fingerprint(table["image_id"], table["path"], full.root),
                                  self.image_size, self.resize, self.cache_root)  # fmt: skip
        store = cache.load() if self.cache and cache.is_complete(len(table)) else None
        dataset = ManifestDataset(full.root, rows["path"], targets, rows["image_id"], self.image_size,
                                  build_transform(None), preload=False, resize=self.resize, store=store,
                                  positions=positions if store is not None else None, max_pixels=self.max_pixels)  # fmt: skip
        return rows.reset_index(drop=True), targets, dataset

    def _processes(self) -> tuple[int, int]:
        """``(world size, rank)`` of the Trainer using this module; ``(1, 0)`` outside one (evaluation, tests)."""
        trainer = self.trainer
        return (trainer.world_size, trainer.global_rank) if trainer is not None else (1, 0)

    def train_dataloader(self) -> DataLoader:
        """The strategy's sampler; under DDP each rank gets a disjoint, equal share of the same epoch draw.

        Each pass is one epoch, and everything random in it (the draw or shuffle order, the augmentation in this
        process, the loader workers' seeds) is derived from ``(seed, rank, epoch)`` when the pass begins, so a
        seeded run augments the same way twice and a resumed run the way an uninterrupted one does.

        The workers are started anew for every pass (not ``persistent_workers``): a persistent worker would carry
        one augmentation stream across epochs, in a process a checkpoint cannot reach, so a resumed run could not
        continue it. Forking a worker per epoch costs a fraction of a second; the images are shared with it, not
        copied (preloaded or memory-mapped).
        """
        dataset = self.datasets["train"]
        sampler = self.sampler.build(dataset.targets.numpy(), self.seed) if self.sampler else None
        world, rank = self._processes()
        if world > 1:
            length = len(sampler) if sampler is not None else len(dataset)
            sampler = TrainShardSampler(sampler, length, world, rank, seed=self.seed)
        return self._loader(dataset, shuffle=sampler is None, sampler=sampler, drop_last=True, persistent=False,
                            worker_init_fn=partial(seed_augmentation_worker, rank=rank),
                            loader=partial(TrainLoader, begin_pass=partial(self._begin_train_pass, rank=rank)))  # fmt: skip

    def _begin_train_pass(self, loader: DataLoader, rank: int) -> None:
        """Derive the pass's randomness from ``(seed, rank, epoch)`` and count the epoch.

        The sampler gets the epoch (class-aware and repeat-factor draws, DDP shares); the loader's own generator
        the shuffle order of plain random sampling and the workers' base seed, which
        :func:`seed_augmentation_worker` turns into each worker's augmentation seed; the pipeline in this process
        (``num_workers=0``) its augmentation seed. Nothing is drawn from the global generators, which the model
        uses (dropout) and whose state the module checkpoints.
        """
        epoch = self.train_epoch
        self.train_epoch += 1
        if hasattr(loader.sampler, "set_epoch"):
            loader.sampler.set_epoch(epoch)
        loader.generator.manual_seed(stream_seed(self.seed, rank, epoch, LOADER_STREAM))
        loader.dataset.transform.set_random_seed(stream_seed(self.seed, rank, epoch))

    def val_dataloader(self) -> DataLoader:
        return self._trainer_eval_loader("val")

    def test_dataloader(self) -> DataLoader:
        return self._trainer_eval_loader("test")

    def _trainer_eval_loader(self, split: str) -> DataLoader:
        """A split for the Trainer's loops; under DDP each rank reads its unpadded share, so synced metrics see
        every image exactly once. (The final evaluation reads whole splits on rank 0 through :meth:`eval_dataloader`.)
        """
        world, rank = self._processes()
        if world > 1:
            return self._loader(self.datasets[split], sampler=EvalShardSampler(len(self.datasets[split]), world, rank))
        return self.eval_dataloader(split)

    def eval_dataloader(self, split: str) -> DataLoader:
        """Un-augmented, un-shuffled loader over a split, in manifest order."""
        return self._loader(self.datasets[split])

    def _loader(self, dataset, shuffle=False, sampler=None, drop_last=False, worker_init_fn=None, persistent=True,
                loader=ForkSharingLoader) -> DataLoader:  # fmt: skip
        """A loader with its own generator: each new iterator draws a seed from it. From the global generator, that
        draw would tie the model's random stream (dropout) to how many loaders were started, which differs between
        a resumed run and an uninterrupted one."""
        workers = loader_workers(dataset, self.batch_size, self.num_workers, self.in_process_pixels)
        return loader(
            dataset,
            batch_size=self.batch_size,
            shuffle=shuffle,
            sampler=sampler,
            drop_last=drop_last and len(dataset) > self.batch_size,
            num_workers=workers,
            persistent_workers=persistent and persistent_workers(self.loader_settings["persistent_workers"], workers),
            pin_memory=pin_memory(self.loader_settings["pin_memory"], on_cuda(self.trainer)),
            worker_init_fn=worker_init_fn,
            generator=torch.Generator().manual_seed(self.seed),
            collate_fn=collate_items,
        )


def seed_augmentation_worker(worker_id: int, rank: int) -> None:
    """Loader-worker start: Lightning's per-worker seeding, plus the augmentation pipeline's own random state.

    Every worker receives a copy of the same albumentations pipeline, random state included, so without this all
    workers would draw the same augmentations in lockstep. PyTorch gives worker ``w`` the seed ``base + w``, with
    ``base`` drawn from the training loader's generator, which :meth:`CXRDataModule._begin_train_pass` seeds from
    ``(seed, rank, epoch)``: the worker streams differ from each other and are a function of the epoch.
    """
    pl_worker_init_function(worker_id, rank)
    info = get_worker_info()
    info.dataset.transform.set_random_seed(stream_seed(info.seed, rank))
