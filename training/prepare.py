"""``make prepare DATA=<name> DATA_ROOT=<path> SIZE=<px>``: decode every image once into the preprocessing cache.

The manifest is validated first, by the validation training runs (file existence aside: an unreadable image is
what this command lists), so no cache is built for a manifest training would refuse.
"""

from __future__ import annotations

import sys

import hydra
from hydra.utils import instantiate
from omegaconf import DictConfig

from training.config_files import CONFIGS
from training.data.cache import CACHE_ROOT, PreprocessedCache, image_list_fingerprint
from training.data.images import MAX_PIXELS
from training.data.manifest import ManifestError, check_manifest
from training.data.sources import image_roots, manifest_vocabulary
from training.errors import hydra_user_errors, run_hydra_entry


@hydra.main(config_path=str(CONFIGS), config_name="data_tools", version_base="1.3")
@hydra_user_errors()
def main(cfg: DictConfig) -> None:
    source = instantiate(cfg.data.source)
    manifest = source.prepare()
    extra = list(cfg.data.get("extra_columns") or []) + list(getattr(source, "extra_columns", ()))
    found = check_manifest(
        manifest,
        None,
        manifest_vocabulary(source),
        root=source.root,
        extra_columns=extra,
        check_files=False,
        image_roots=image_roots(source, cfg.data.get("allow_outside_root", False)),
    )
    if found.problems:
        raise ManifestError(f"{manifest}: {len(found.problems)} problem(s), no cache was built:\n  "
                            + "\n  ".join(found.problems))  # fmt: skip
    table = found.table
    cache = PreprocessedCache(image_list_fingerprint(table["image_id"], table["path"], source.root), cfg.data.image_size, cfg.data.get("resize", "stretch"),
                              root=cfg.data.get("cache_root") or CACHE_ROOT)  # fmt: skip
    report = cache.build([source.root / p for p in table["path"]], list(table["image_id"]), workers=cfg.workers,
                         max_pixels=cfg.data.get("max_pixels", MAX_PIXELS))  # fmt: skip
    print(f"{cache.dir}: {report.decoded} decoded, {report.skipped} already cached, {len(report.errors)} unreadable "
          f"({report.seconds:.1f} s)")  # fmt: skip
    for error in report.errors:
        print(f"  line {error['line']}, image {error['image_id']!r}: {error['error']}")
    if report.errors:
        print("training will decode the originals until every file reads; fix them and rerun (done rows are kept)")
    sys.exit(1 if report.errors else 0)


if __name__ == "__main__":
    run_hydra_entry(main, "data_tools")
