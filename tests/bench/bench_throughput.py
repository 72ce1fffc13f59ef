"""Training throughput: the full platform (Lightning + MLflow + data module) versus a bare PyTorch loop.

Both train the same backbone at the same batch size and image size on data already in memory, for the same
number of steps, alternating platform and bare rounds so machine noise hits both alike. Timing starts after
warm-up steps and covers whole steps, including everything the platform does between them (augmentation,
collation, hooks, metric logging, progress bar). Prints images/s for each and the platform/bare ratio.

Run: ``make bench`` (or ``python tests/bench/bench_throughput.py --steps 40 --rounds 2``).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import cv2
import lightning.pytorch as L
import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F
from hydra import compose, initialize_config_dir

from training.data.findings import CXRLT_FINDINGS
from training.models.backbone import create_backbone
from training.models.factory import model_from_config
from training.pipeline import build_datamodule
from training.tracking.session import open_session

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


class StepTimer(L.Callback):
    """Wall time from the start of step ``warmup`` to the end of the last step."""

    def __init__(self, warmup: int):
        self.warmup, self.start, self.end = warmup, None, None

    def on_train_batch_start(self, trainer, module, batch, batch_idx):
        if trainer.global_step == self.warmup and self.start is None:
            self.start = time.perf_counter()

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        self.end = time.perf_counter()


def write_images(root: Path, n: int, size: int) -> Path:
    rng = np.random.default_rng(0)
    (root / "images").mkdir(parents=True)
    rows = []
    for i in range(n):
        cv2.imwrite(str(root / "images" / f"{i}.png"), rng.integers(0, 255, (size, size), dtype=np.uint8))
        labels = (rng.random(len(CXRLT_FINDINGS)) < 0.1).astype(int)
        rows.append({"image_id": f"b{i}", "path": f"images/{i}.png", "split": "train" if i >= 64 else ("val", "test")[i % 2],
                     "patient_id": f"p{i}", **dict(zip(CXRLT_FINDINGS, labels, strict=True))})  # fmt: skip
    pd.DataFrame(rows).to_csv(root / "manifest.csv", index=False)
    return root / "manifest.csv"


def platform_round(cfg, steps: int, warmup: int) -> float:
    datamodule = build_datamodule(cfg)
    datamodule.prepare_data()
    datamodule.setup("fit")
    model = model_from_config(cfg)
    session = open_session(cfg, {"benchmark": "throughput"})
    timer = StepTimer(warmup)
    trainer_args = {**cfg.trainer, "max_steps": steps, "max_epochs": -1, "limit_val_batches": 0}
    trainer = L.Trainer(**trainer_args, logger=session.logger, callbacks=[timer], enable_checkpointing=False)
    trainer.fit(model, datamodule=datamodule)
    session.close("FINISHED")
    return (steps - warmup) * cfg.data.batch_size / (timer.end - timer.start)


def bare_round(cfg, steps: int, warmup: int) -> float:
    torch.manual_seed(0)
    backbone = create_backbone(cfg.model.backbone, **cfg.model.timm_kwargs)
    model = torch.nn.Sequential(backbone, torch.nn.Linear(backbone.num_features, len(cfg.task.labels)))
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.model.lr, weight_decay=cfg.model.weight_decay)
    batch, size = cfg.data.batch_size, cfg.data.image_size
    images = torch.randn(steps, batch, 1, size, size)
    targets = (torch.rand(steps, batch, len(cfg.task.labels)) < 0.1).float()
    model.train()
    for step in range(steps):
        if step == warmup:
            start = time.perf_counter()
        loss = F.binary_cross_entropy_with_logits(model(images[step]), targets[step])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.trainer.gradient_clip_val)
        optimizer.step()
    return (steps - warmup) * batch / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. model=resnet18 data.batch_size=64")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        with initialize_config_dir(str(CONFIGS), version_base="1.3"):
            cfg = compose("train", overrides=["data=manifest", f"data.source.manifest={tmp}/manifest.csv",
                f"tracking.uri=sqlite:///{tmp}/mlflow.db", f"tracking.artifact_root={tmp}/artifacts",
                f"tracking.checkpoint_root={tmp}/checkpoints", "trainer.enable_progress_bar=true", *args.overrides])  # fmt: skip
        write_images(tmp, 64 + args.steps * cfg.data.batch_size, cfg.data.image_size)
        platform, bare = [], []
        for _ in range(args.rounds):
            bare.append(bare_round(cfg, args.steps, args.warmup))
            platform.append(platform_round(cfg, args.steps, args.warmup))
        p, b = statistics.median(platform), statistics.median(bare)
        print(f"\nthroughput  model={cfg.model.backbone} batch={cfg.data.batch_size} size={cfg.data.image_size} "
              f"steps={args.steps} (timed {args.steps - args.warmup}) rounds={args.rounds} threads={torch.get_num_threads()}")  # fmt: skip
        print(f"  bare PyTorch loop : {b:8.1f} img/s  rounds {[round(x, 1) for x in bare]}")
        print(f"  platform          : {p:8.1f} img/s  rounds {[round(x, 1) for x in platform]}")
        print(f"  platform/bare ratio: {p / b:.3f}  (target >= 0.90)")


if __name__ == "__main__":
    main()
