"""``make data-check DATA=<name> DATA_ROOT=<path>``: build the manifest and report on it; exit 1 on errors.

``ARGS="+task=<name>"`` also requires that task's label columns, as training on that task would.
``ARGS="heterogeneity.sample=2000"`` decodes more images per source for the heterogeneity report (docs/data.md).
"""

from __future__ import annotations

import sys

import hydra
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from training.config_files import CONFIGS
from training.data.audit import check_dataset
from training.data.images import MAX_PIXELS
from training.data.sources import image_roots, manifest_vocabulary, task_labels
from training.errors import hydra_user_errors, run_hydra_entry


@hydra.main(config_path=str(CONFIGS), config_name="data_tools", version_base="1.3")
@hydra_user_errors()
def main(cfg: DictConfig) -> None:
    source = instantiate(cfg.data.source)
    manifest = source.prepare()
    extra = list(cfg.data.get("extra_columns") or []) + list(getattr(source, "extra_columns", ()))
    task = cfg.get("task")
    labels = [*task_labels(task, source), *(task.get("unseen") or [])] if task is not None else None
    report = check_dataset(manifest, source.root, extra, decode=cfg.decode, workers=cfg.workers or 4, labels=labels,
                           vocabulary=manifest_vocabulary(source),
                           patient_ids=getattr(source, "patient_ids", True),
                           heterogeneity=OmegaConf.to_container(cfg.heterogeneity),
                           max_pixels=cfg.data.get("max_pixels", MAX_PIXELS),
                           image_roots=image_roots(source, cfg.data.get("allow_outside_root", False)),
                           files_note=getattr(source, "table_only_note", None))  # fmt: skip
    report.sections = {**getattr(source, "check_sections", {}), **report.sections}  # the adapter's own findings
    print(f"manifest: {manifest}\nimages:   {source.root}\n\n{report.render()}")
    sys.exit(1 if report.errors else 0)


if __name__ == "__main__":
    run_hydra_entry(main, "data_tools")
