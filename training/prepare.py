"""``make prepare DATA=<name> DATA_ROOT=<path> SIZE=<px>``: decode every image once into the preprocessing cache."""

from __future__ import annotations

import sys

import hydra
import pandas as pd
from hydra.utils import instantiate
from omegaconf import DictConfig

from training.data.cache import CACHE_ROOT, PreprocessedCache, image_list_fingerprint


@hydra.main(config_path="../configs", config_name="data_tools", version_base="1.3")
def main(cfg: DictConfig) -> None:
    source = instantiate(cfg.data.source)
    manifest = source.prepare()
    table = pd.read_csv(manifest, dtype=str, keep_default_na=False)
    cache = PreprocessedCache(image_list_fingerprint(table["image_id"], table["path"], source.root), cfg.data.image_size, cfg.data.get("resize", "stretch"),
                              root=cfg.data.get("cache_root") or CACHE_ROOT)  # fmt: skip
    report = cache.build([source.root / p for p in table["path"]], list(table["image_id"]), workers=cfg.workers)
    print(f"{cache.dir}: {report.decoded} decoded, {report.skipped} already cached, {len(report.errors)} unreadable "
          f"({report.seconds:.1f} s)")  # fmt: skip
    for error in report.errors:
        print(f"  line {error['line']}, image {error['image_id']!r}: {error['error']}")
    if report.errors:
        print("training will decode the originals until every file reads; fix them and rerun (done rows are kept)")
    sys.exit(1 if report.errors else 0)


if __name__ == "__main__":
    main()
