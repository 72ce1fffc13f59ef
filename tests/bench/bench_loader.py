"""Loader throughput: the preprocessing cache versus decoding full-size 16-bit originals on every read.

Builds full-size 16-bit PNGs in a temp folder by upsampling real NIH radiographs from ../shared/data (to about
2,500 x 2,500, the size of a PadChest image, with a little sensor noise so the PNGs compress like real ones),
then pulls the training split through the data module with the default augmentations, twice: decoding the
originals (no cache, no preload: what a training without ``make prepare`` does), and reading the memory-mapped
cache ``make prepare`` writes. Rounds alternate so machine noise hits both alike. Prints images/s and the ratio.

Run: ``make bench`` (or ``python tests/bench/bench_loader.py --images 24 --size 256``).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import cv2
import numpy as np
import pandas as pd
from omegaconf import OmegaConf

from training.data.cache import PreprocessedCache, image_list_fingerprint
from training.data.datamodule import CXRDataModule
from training.data.findings import NIH14_LABELS
from training.data.sources import ManifestSource

ROOT = Path(__file__).resolve().parents[2]
NIH = ROOT.parent / "shared" / "data" / "nih1000"


def full_size_set(out: Path, n: int, side: int) -> Path:
    """``n`` real radiographs upsampled to ``side`` px at 16 bit, and a manifest over them (all in train)."""
    labels = pd.read_csv(NIH / "labels.csv", dtype=str).head(n)
    rng = np.random.default_rng(0)
    rows = []
    for i, row in labels.iterrows():
        small = cv2.imread(str(NIH / row["image"]), cv2.IMREAD_GRAYSCALE).astype(np.float32)
        big = cv2.resize(small, (side, side), interpolation=cv2.INTER_CUBIC) * 64 + rng.normal(0, 40, (side, side))
        path = out / f"{i}.png"
        cv2.imwrite(str(path), np.clip(big, 0, 65535).astype(np.uint16))
        rows.append({"image_id": f"i{i}", "path": path.name, "split": "train", "patient_id": row["patient_id"],
                     **{name: row[name] for name in NIH14_LABELS}})  # fmt: skip
    table = pd.DataFrame(rows)
    for split in ("val", "test"):  # the module wants three splits; they are not timed
        table = pd.concat([table, table.head(1).assign(image_id=f"{split}0", split=split, patient_id=f"x{split}")])
    manifest = out / "manifest.csv"
    table.to_csv(manifest, index=False)
    return manifest


def images_per_second(module: CXRDataModule) -> float:
    loader = module.train_dataloader()
    start = time.perf_counter()
    count = sum(len(batch["image"]) for batch in loader)
    return count / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=24)
    parser.add_argument("--side", type=int, default=2500, help="side of the full-size originals")
    parser.add_argument("--size", type=int, default=256, help="training image size")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    if not NIH.is_dir():
        raise SystemExit(f"needs the real images in {NIH}")
    augment = OmegaConf.load(ROOT / "configs" / "augment" / "default.yaml").train
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        manifest = full_size_set(tmp, args.images, args.side)
        megabytes = sum(p.stat().st_size for p in tmp.glob("*.png")) / args.images / 2**20
        table = pd.read_csv(manifest, dtype=str)
        cache = PreprocessedCache(
            image_list_fingerprint(table["image_id"], table["path"], tmp), args.size, "pad", root=tmp / "cache"
        )
        built = cache.build([tmp / p for p in table["path"]], list(table["image_id"]), progress=False)

        def module(cached: bool) -> CXRDataModule:
            dm = CXRDataModule(ManifestSource(str(manifest)), NIH14_LABELS, args.size, batch_size=8, preload=False,
                               train_augment=augment, resize="pad", cache=cached, cache_root=str(tmp / "cache"))  # fmt: skip
            dm.setup()
            return dm

        modules = {"decode originals": module(False), "prepared cache": module(True)}
        rates = {name: [] for name in modules}
        for _ in range(args.rounds):
            for name, dm in modules.items():
                rates[name].append(images_per_second(dm))
    decode, cached = (statistics.median(rates[k]) for k in ("decode originals", "prepared cache"))
    print(f"loader throughput, {args.images} images of {args.side}x{args.side} 16-bit PNG ({megabytes:.1f} MB each), "
          f"to {args.size} px with the default augmentations, batch 8, in-process loading:")  # fmt: skip
    print(f"  decode originals : {decode:8.1f} images/s")
    print(f"  prepared cache   : {cached:8.1f} images/s")
    print(f"  ratio cache/decode: {cached / decode:.1f}x   (building the cache took {built.seconds:.1f} s once)")


if __name__ == "__main__":
    main()
