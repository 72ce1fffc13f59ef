"""The dataset holds its per-item state as numpy arrays and gives the items a plain reading of the manifest gives.

Why arrays: a forked loader worker that touches Python objects (a list of path strings, a DataFrame of objects)
writes their refcounts and so copies the pages holding them; over an epoch each worker would own a copy of the
whole table (tests/bench/bench_scale.py measures it at full size).
"""

import gc
import pickle

import numpy as np
import pandas as pd
import pytest
import torch
from omegaconf import OmegaConf
from torch.utils.data import default_collate

from training.data.datamodule import ForkSharingLoader
from training.data.dataset import ManifestDataset
from training.data.images import read_grayscale
from training.data.transforms import GRAY_MEAN, GRAY_STD, build_transform

SIZE = 24
LABELS = ["Nodule", "Mass", "Atelectasis"]


@pytest.fixture
def manifest(make_manifest):
    path = make_manifest(n=30, size=32)
    table = pd.read_csv(path, dtype=str, keep_default_na=False)
    return path.parent, table[table["split"] == "train"].reset_index(drop=True)


def reference(root, rows):
    """Each row's image and target straight from its file and the manifest: ``((N, 1, S, S), (N, C))``."""
    images = [(read_grayscale(root / p, SIZE, "stretch") / 255.0 - GRAY_MEAN) / GRAY_STD for p in rows["path"]]
    return torch.tensor(np.stack(images)[:, None], dtype=torch.float32), torch.tensor(
        rows[LABELS].astype(float).to_numpy(), dtype=torch.float32
    )


def dataset(root, rows, mode, steps=None, tmp_path=None):
    """The rows as a dataset read one of three ways: preloaded, lazily from the files, from a memory-mapped store."""
    targets = rows[LABELS].astype(float).to_numpy()
    args = (root, rows["path"], targets, rows["image_id"], SIZE, build_transform(steps))
    if mode != "cached":
        return ManifestDataset(*args, preload=mode == "preloaded")
    images = np.stack([read_grayscale(root / p, SIZE, "stretch") for p in rows["path"]])
    store = np.concatenate([np.zeros((3, SIZE, SIZE), np.uint8), images])  # other images before this split's
    np.save(tmp_path / "store.npy", store)
    return ManifestDataset(*args, store=np.load(tmp_path / "store.npy", mmap_mode="r"),
                           positions=np.arange(3, 3 + len(rows)))  # fmt: skip


@pytest.mark.parametrize("mode", ["preloaded", "lazy", "cached"])
def test_items_are_the_manifest_rows_one_by_one_and_batched(manifest, mode, tmp_path):
    root, rows = manifest
    data = dataset(root, rows, mode, tmp_path=tmp_path)
    images, targets = reference(root, rows)
    order = [4, 0, 7, 7, 2, 9]
    one_by_one = default_collate([data[i] for i in order])
    batched = default_collate(data.__getitems__(order))
    for batch in (one_by_one, batched):
        assert batch["index"].tolist() == order
        torch.testing.assert_close(batch["image"], images[order], atol=1e-5, rtol=0)
        assert torch.equal(batch["target"], targets[order])
    for key in one_by_one:  # the batched path is the same arithmetic, not an approximation of it
        assert torch.equal(one_by_one[key], batched[key]), key
    assert list(data.paths) == list(rows["path"]) and list(data.image_ids) == list(rows["image_id"])


def test_an_augmenting_pipeline_is_applied_item_by_item_in_the_same_order(manifest):
    root, rows = manifest
    steps = OmegaConf.create([{"_target_": "albumentations.Affine", "rotate": [-20, 20], "p": 1.0}])
    data = dataset(root, rows, "preloaded", steps=steps)
    data.transform.set_random_seed(5)
    one_by_one = default_collate([data[i] for i in range(6)])
    data.transform.set_random_seed(5)
    batched = default_collate(data.__getitems__(list(range(6))))
    assert torch.equal(one_by_one["image"], batched["image"])
    assert not torch.equal(batched["image"], reference(root, rows)[0][:6])  # it did augment


def test_per_item_state_is_numpy_arrays_not_python_objects(manifest, tmp_path):
    root, rows = manifest
    for mode in ("preloaded", "lazy", "cached"):
        data = dataset(root, rows, mode, tmp_path=tmp_path)
        per_item = {name: value for name, value in vars(data).items()
                    if not isinstance(value, str) and hasattr(value, "__len__") and len(value) == len(rows)}  # fmt: skip
        assert {"paths", "image_ids", "targets"} <= per_item.keys()
        for name, value in per_item.items():
            assert isinstance(value, np.ndarray | torch.Tensor), (mode, name, type(value))
            assert not (isinstance(value, np.ndarray) and value.dtype == object), (mode, name)
        assert isinstance(data.paths[0], str) and isinstance(data.image_ids[0], str)  # plain str, not np.str_


def test_a_pickled_dataset_carries_its_arrays_and_the_cache_by_name(manifest, tmp_path):
    root, rows = manifest
    rows = pd.concat([rows] * 400, ignore_index=True)  # 4,000 rows: per-item state dominates the pickle
    store = (np.arange(len(rows) * 64 * 64) % 251).astype(np.uint8).reshape(-1, 64, 64)  # far larger than the table
    np.save(tmp_path / "big.npy", store)
    data = ManifestDataset(root, rows["path"], rows[LABELS].astype(float).to_numpy(), rows["image_id"], 64,
                           build_transform(None), store=np.load(tmp_path / "big.npy", mmap_mode="r"),
                           positions=np.arange(len(rows)))  # fmt: skip
    blob = pickle.dumps(data)
    arrays = data.targets.numpy().nbytes + data.positions.nbytes
    text = sum(len(p) + len(i) for p, i in zip(rows["path"], rows["image_id"], strict=True))
    assert len(blob) < arrays + 2 * text + 64 * 1024 < store.nbytes / 10
    again = pickle.loads(blob)
    assert isinstance(again.store, np.memmap) and again.store.filename == data.store.filename
    for key, value in default_collate(again.__getitems__([0, 5, 3999])).items():
        assert torch.equal(value, default_collate(data.__getitems__([0, 5, 3999]))[key])
    view = ManifestDataset(root, rows["path"][1:], rows[LABELS].astype(float).to_numpy()[1:], rows["image_id"][1:],
                           64, build_transform(None), store=data.store[1:])  # fmt: skip
    assert np.array_equal(pickle.loads(pickle.dumps(view)).store, store[1:])  # a view into a map travels whole


def test_loader_workers_fork_with_the_heap_frozen_and_the_parent_unfrozen_after(manifest):
    root, rows = manifest
    data = dataset(root, rows, "preloaded")
    loader = ForkSharingLoader(data, batch_size=4, num_workers=1)
    frozen_at_fork = []
    original = gc.freeze

    def recording_freeze():
        original()
        frozen_at_fork.append(gc.get_freeze_count())

    gc.freeze = recording_freeze
    try:
        batches = list(loader)
    finally:
        gc.freeze = original
    assert frozen_at_fork and frozen_at_fork[0] > 0
    assert gc.get_freeze_count() == 0
    expected = default_collate([data[i] for i in range(len(data))])
    assert torch.equal(torch.cat([b["image"] for b in batches]), expected["image"])
