"""Data module: loaders give single-channel image tensors and task-ordered targets."""

from pathlib import Path

import numpy as np
import torch

from training.data.datamodule import CXRDataModule
from training.data.sources import ManifestSource
from training.data.transforms import GRAY_MEAN, GRAY_STD
from training.samplers.random import RandomSampling


def _module(path, labels, **kwargs):
    defaults = dict(image_size=24, batch_size=4, sampler=RandomSampling())
    return CXRDataModule(ManifestSource(str(path)), labels, **{**defaults, **kwargs})


def test_batches_have_the_documented_shapes(make_manifest, task1_labels):
    dm = _module(make_manifest(n=30), task1_labels)
    dm.prepare_data()
    dm.setup("fit")
    batch = next(iter(dm.train_dataloader()))
    assert batch["image"].shape == (4, 1, 24, 24)
    assert batch["image"].dtype == torch.float32
    assert batch["target"].shape == (4, 30)
    assert len(dm.train_dataloader()) == 10 // 4  # drop_last on train
    assert sum(len(b["target"]) for b in dm.val_dataloader()) == 10  # every val image, no drop


def test_eval_images_are_normalised_copies_of_the_file(make_manifest, task1_labels):
    path = make_manifest(n=9, size=24)
    dm = _module(path, task1_labels)
    dm.setup()
    item = dm.datasets["test"][0]
    import cv2

    raw = cv2.imread(str(path.parent / dm.split_frame("test")["path"][0]), cv2.IMREAD_GRAYSCALE)
    expected = (raw / 255.0 - GRAY_MEAN) / GRAY_STD
    np.testing.assert_allclose(item["image"][0].numpy(), expected, atol=1e-5)


def test_targets_follow_task_order_and_counts_match(make_manifest):
    labels = ["Nodule", "Mass", "Normal"]
    path = make_manifest(n=30)
    dm = _module(path, labels)
    dm.setup()
    import pandas as pd

    table = pd.read_csv(path)
    train = table[table["split"] == "train"]
    expected = train[labels].to_numpy(np.float32)
    unlabelled = ~(expected == 1).any(axis=1)  # no positive: Normal is "not labelled" in training (rules §12)
    assert unlabelled.any() and not unlabelled.all()
    expected[unlabelled, labels.index("Normal")] = -1.0
    np.testing.assert_array_equal(dm.datasets["train"].targets.numpy(), expected)
    np.testing.assert_array_equal(dm.class_counts, train[labels].sum().to_numpy())
    test = table[table["split"] == "test"]  # scored as given
    np.testing.assert_array_equal(dm.datasets["test"].targets.numpy(), test[labels].to_numpy(np.float32))


def test_preload_and_lazy_reading_agree(make_manifest, task1_labels):
    path = make_manifest(n=9)
    eager, lazy = _module(path, task1_labels), _module(path, task1_labels, preload=False)
    eager.setup()
    lazy.setup()
    assert lazy.datasets["val"].images is None
    for i in range(3):
        np.testing.assert_array_equal(eager.datasets["val"].image(i), lazy.datasets["val"].image(i))


def test_subset_cuts_each_split(make_manifest, task1_labels):
    dm = _module(make_manifest(n=30), task1_labels, subset={"train": 4, "test": 2})
    dm.setup()
    assert [len(dm.datasets[s]) for s in ("train", "val", "test")] == [4, 10, 2]
    assert dm.class_counts.sum() == (dm.datasets["train"].targets.numpy() == 1).sum()


def _augmenting(path, labels, seed, **kwargs):
    from omegaconf import OmegaConf

    steps = OmegaConf.load(Path(__file__).resolve().parents[2] / "configs" / "augment" / "default.yaml").train
    dm = _module(path, labels, train_augment=steps, seed=seed, batch_size=2, **kwargs)
    dm.setup()
    torch.manual_seed(0)  # what seed_everything does before fitting (the shuffle order, the workers' seeds)
    return dm


def _images(path, labels, seed):
    dm = _augmenting(path, labels, seed)
    dm.sampler = None  # a plain shuffle, seeded above, the same for every module
    return [b["image"] for b in dm.train_dataloader()]


def test_training_augmentation_follows_the_seed(make_manifest, task1_labels):
    path = make_manifest(n=30)
    first, again = _images(path, task1_labels, seed=3), _images(path, task1_labels, seed=3)
    other = _images(path, task1_labels, seed=4)
    assert all(torch.equal(a, b) for a, b in zip(first, again, strict=True))
    assert not all(torch.equal(a, b) for a, b in zip(first, other, strict=True))


class _Probe(torch.utils.data.Dataset):
    """Returns the augmentation pipeline's next random number instead of an image."""

    def __init__(self, dataset):
        self.transform, self.targets = dataset.transform, dataset.targets

    def __len__(self):
        return len(self.targets)

    def __getitem__(self, index):
        return {"draw": torch.tensor(self.transform.random_generator.random()), "index": index}


def _worker_draws(path, labels, seed):
    dm = _augmenting(path, labels, seed=seed, num_workers=2)
    dm.datasets["train"] = _Probe(dm.datasets["train"])
    dm.sampler = None
    return [b["draw"] for b in dm.train_dataloader()]


def test_loader_workers_augment_differently_from_each_other_and_reproducibly(make_manifest, task1_labels):
    path = make_manifest(n=30)
    draws = _worker_draws(path, task1_labels, seed=3)
    # batches alternate between the two workers: batch 0 is worker 0's first, batch 1 worker 1's first
    assert not torch.equal(draws[0], draws[1])
    assert all(torch.equal(a, b) for a, b in zip(draws, _worker_draws(path, task1_labels, seed=3), strict=True))


def _passes(dm, loader):
    torch.manual_seed(0)
    return [(b["image"], b["target"], b["index"]) for b in getattr(dm, loader)()]


def test_table_lookup_batches_are_read_in_the_training_process_and_equal_the_workers(make_manifest, task1_labels):
    """A small batch that is one table lookup skips the workers it would only be handed over by; the batches of
    every pass (training draw included) are those the workers give."""
    path = make_manifest(n=30)
    here = _module(path, task1_labels, num_workers=2)
    workers = _module(path, task1_labels, num_workers=2, in_process_pixels=0)
    for dm in (here, workers):
        dm.setup()
    assert here.train_dataloader().num_workers == 0 and here.val_dataloader().num_workers == 0
    assert workers.train_dataloader().num_workers == 2
    for loader in ("train_dataloader", "val_dataloader"):
        for (a, t, i), (b, u, j) in zip(_passes(here, loader), _passes(workers, loader), strict=True):
            assert torch.equal(a, b) and torch.equal(t, u) and torch.equal(i, j)


def test_augmenting_or_large_batches_keep_their_workers(make_manifest, task1_labels):
    path = make_manifest(n=30)
    augmenting = _augmenting(path, task1_labels, seed=0, num_workers=2)
    assert augmenting.train_dataloader().num_workers == 2  # random steps: not one table lookup
    assert augmenting.val_dataloader().num_workers == 0  # its evaluation loaders are
    large = _module(path, task1_labels, num_workers=2, in_process_pixels=4 * 24 * 24 - 1)  # one pixel too many
    large.setup()
    assert large.val_dataloader().num_workers == 2
    at_limit = _module(path, task1_labels, num_workers=2, in_process_pixels=4 * 24 * 24)
    at_limit.setup()
    assert at_limit.val_dataloader().num_workers == 0
