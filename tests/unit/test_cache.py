"""The preprocessing cache: same pixels as decoding, resumable, errors named, and read by the data module."""

from __future__ import annotations

import logging

import cv2
import numpy as np
import pandas as pd
import pytest

from training.data.audit import check_dataset
from training.data.cache import PreprocessedCache, image_list_fingerprint
from training.data.datamodule import CXRDataModule
from training.data.findings import CXRLT_FINDINGS
from training.data.images import read_grayscale
from training.data.sources import ManifestSource


def sixteen_bit_set(tmp_path, n=12):
    rng = np.random.default_rng(0)
    paths = []
    for i in range(n):
        path = tmp_path / f"{i}.png"
        cv2.imwrite(str(path), rng.integers(1000, 3000 + 100 * i, (30, 50), dtype=np.uint16))
        paths.append(path)
    return paths


def test_cache_holds_exactly_what_decoding_gives(tmp_path):
    paths = sixteen_bit_set(tmp_path)
    cache = PreprocessedCache("fp", 24, "pad", root=tmp_path / "cache")
    report = cache.build(paths, [p.stem for p in paths], workers=2, chunk=5, progress=False)
    assert (report.decoded, report.skipped, report.errors) == (12, 0, [])
    assert cache.is_complete(12) and not cache.is_complete(13)
    stored = cache.load()
    assert isinstance(stored, np.memmap) and stored.shape == (12, 24, 24)
    for i, path in enumerate(paths):
        assert np.array_equal(stored[i], read_grayscale(path, 24, "pad"))


def test_interrupted_build_resumes_without_redoing_rows(tmp_path):
    paths = sixteen_bit_set(tmp_path)
    cache = PreprocessedCache("fp", 16, "stretch", root=tmp_path / "cache")
    cache.build(paths, [p.stem for p in paths], chunk=4, progress=False)
    done = np.load(cache.dir / "done.npy")
    done[5:] = False  # as if killed after the first chunks had been flushed
    np.save(cache.dir / "done.npy", done)
    report = cache.build(paths, [p.stem for p in paths], chunk=4, progress=False)
    assert (report.skipped, report.decoded) == (5, 7)
    assert np.array_equal(cache.load()[11], read_grayscale(paths[11], 16, "stretch"))


def test_unreadable_files_are_reported_by_line_and_leave_the_cache_incomplete(tmp_path):
    paths = sixteen_bit_set(tmp_path, n=4)
    paths[2].write_bytes(paths[2].read_bytes()[:100])  # truncated
    paths.append(tmp_path / "missing.png")
    cache = PreprocessedCache("fp", 16, "pad", root=tmp_path / "cache")
    report = cache.build(paths, ["a", "b", "c", "d", "e"], progress=False)
    assert [(e["line"], e["image_id"]) for e in report.errors] == [(4, "c"), (6, "e")]
    assert "truncated PNG" in report.errors[0]["error"] and "not found" in report.errors[1]["error"]
    assert not cache.is_complete()
    assert pd.read_csv(cache.dir / "errors.csv")["image_id"].tolist() == ["c", "e"]


def test_data_module_reads_the_cache_and_says_so(make_manifest, tmp_path, caplog):
    manifest = make_manifest(n=30, size=40)
    table = pd.read_csv(manifest)
    key = image_list_fingerprint(table["image_id"], table["path"], manifest.parent)
    cache = PreprocessedCache(key, 32, "pad", root=tmp_path / "cache")
    cache.build([manifest.parent / p for p in table["path"]], list(table["image_id"]), progress=False)

    def module(use_cache):
        dm = CXRDataModule(ManifestSource(str(manifest)), CXRLT_FINDINGS, image_size=32, batch_size=4, resize="pad",
                           cache=use_cache, cache_root=str(tmp_path / "cache"))  # fmt: skip
        dm.setup()
        return dm

    with caplog.at_level(logging.INFO):
        cached = module(True)
    assert "reading the preprocessed cache" in caplog.text
    decoded = module(False)
    assert isinstance(cached.store, np.memmap) and decoded.store is None
    for split in ("train", "val", "test"):
        np.testing.assert_array_equal(cached.datasets[split].images, decoded.datasets[split].images)
        first = cached.datasets[split].image_ids[0]
        assert first == table[table["split"] == split]["image_id"].iloc[0]


def test_cache_survives_relabelling_but_not_a_changed_image_list(make_manifest, tmp_path):
    manifest = make_manifest(n=9)
    table = pd.read_csv(manifest)
    key = image_list_fingerprint(table["image_id"], table["path"], manifest.parent)
    PreprocessedCache(key, 32, "pad", root=tmp_path / "c").build(
        [manifest.parent / p for p in table["path"]], list(table["image_id"]), progress=False
    )

    def cached_after(edit):
        edit(table)
        table.to_csv(manifest, index=False)
        dm = CXRDataModule(
            ManifestSource(str(manifest)), CXRLT_FINDINGS, 32, 4, resize="pad", cache_root=str(tmp_path / "c")
        )
        dm.setup()
        return dm.store is not None

    assert cached_after(lambda t: t.__setitem__("Mass", 1 - t["Mass"]))  # same pixels: the cache still serves
    assert not cached_after(lambda t: t.__setitem__("path", t["path"].iloc[::-1].to_numpy()))  # other order


def test_data_check_names_overlaps_and_broken_files(make_manifest):
    manifest = make_manifest(n=9)
    table = pd.read_csv(manifest)
    table.loc[1, "patient_id"] = table.loc[0, "patient_id"]  # p0 now in train and val
    table.to_csv(manifest, index=False)
    (manifest.parent / table.loc[2, "path"]).write_bytes(b"\x89PNG\r\n\x1a\n" + b"\x00" * 50)
    (manifest.parent / table.loc[3, "path"]).unlink()
    report = check_dataset(manifest, manifest.parent, decode=False)
    text = report.render()
    assert "patient 'p0' in ['train', 'val']" in text
    assert any("line 4" in e and "truncated PNG" in e for e in report.errors)
    assert any("line 5" in e and "not found" in e for e in report.errors)
    assert any("several splits" in e for e in report.errors)
    positives = report.sections["positives per class"]
    assert "group" in positives and f"{int(table['Mass'].sum())}" in positives


@pytest.mark.parametrize("decode", [False, True])
def test_data_check_passes_a_clean_set(make_manifest, decode):
    manifest = make_manifest(n=9)
    report = check_dataset(manifest, manifest.parent, decode=decode)
    assert report.errors == [] and "9 of 9 readable" in report.sections["files"]


def test_preloading_lists_every_unreadable_image(make_manifest):
    from training.data.images import ImageDecodeError

    manifest = make_manifest(n=9)
    table = pd.read_csv(manifest)
    for row in (0, 3):  # both in train
        (manifest.parent / table.loc[row, "path"]).write_bytes(b"broken")
    dm = CXRDataModule(ManifestSource(str(manifest)), CXRLT_FINDINGS, 32, 4, cache=False)
    with pytest.raises(ImageDecodeError, match=r"2 of 3 images cannot be read") as error:
        dm.setup()
    assert "'img0'" in str(error.value) and "'img3'" in str(error.value)
