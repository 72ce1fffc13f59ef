"""GPU training throughput of the Table 2 row A network at 512 px: bf16 mixed precision versus float32, side by side.

The network is the one ``experiment=cxrlt2026_task1_a`` trains (ConvNeXt-V2-Base, one input channel, the task's
30 findings, the distribution-balanced loss variant; random weights), built through the platform's own model factory, in
channels-last layout as ``configs/gpu`` puts it on a GPU. Batches come from a real ``DataLoader`` with worker
processes and pinned memory over uint8 images held in memory, read through the same ``ManifestDataset`` path and
training transform as the memory-mapped preprocessing cache of ``make prepare ... SIZE=512``, so the loader does
the work it does in a real run (augmentation, normalisation, collation) without needing the data set.

Each step is timed whole: waiting for the next batch, the copy to the GPU, forward, backward, gradient clipping and
the optimiser step, ending with ``torch.cuda.synchronize()`` so the GPU's queued work is counted in its step. The
modes alternate over ``--rounds`` so machine noise hits both alike. Printed per mode: images/s, peak GPU memory
(``torch.cuda.max_memory_allocated``) and the data-wait share, the time blocked on ``next(loader)`` over the total
step time (near 0: the GPU is the bottleneck; large: more loader workers or the cache would help).

Without a CUDA device it prints why it skipped and exits 0, so ``make bench`` runs everywhere.

Run: ``make bench`` (or ``python tests/bench/bench_gpu.py --steps 30 --rounds 1 --workers 8``).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch
from hydra import compose, initialize_config_dir
from torch.utils.data import DataLoader

from training.data.dataset import ManifestDataset
from training.data.transforms import build_transform
from training.hardware import apply_speedups
from training.models.factory import model_from_config

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
PRESET = "cxrlt2026_task1_a"
#: The preset's settings, for a checkout without its file.
FALLBACK = ["model=convnextv2_base", "loss=db_en_margin", "data.image_size=512", "data.batch_size=32"]
MODES = {"fp32": None, "bf16-mixed": torch.bfloat16}


def skip_reason() -> str | None:
    """Why this machine cannot run the benchmark, or None."""
    if not torch.cuda.is_available():
        built = f"built with CUDA {torch.version.cuda}" if torch.version.cuda else "a CPU-only build"
        return f"no CUDA device (torch.cuda.is_available() is False; torch {torch.__version__}, {built})"
    if not torch.cuda.is_bf16_supported(including_emulation=False):
        name = torch.cuda.get_device_name()
        return f"{name} has no native bfloat16 (compute capability < 8.0), so bf16-mixed is not the platform default"
    return None


def preset_config(overrides: list[str]):
    """The row-A preset as ``make train`` composes it (or its settings when the preset file is absent)."""
    preset = [f"experiment={PRESET}"] if (CONFIGS / "experiment" / f"{PRESET}.yaml").exists() else FALLBACK
    with initialize_config_dir(str(CONFIGS), version_base="1.3"):
        return compose("train", overrides=[*preset, "model.pretrained=false", *overrides])


def loader(cfg, images: int, workers: int) -> DataLoader:
    """Shuffled batches over random uint8 images in memory, through the training transform and pinned."""
    size, labels = cfg.data.image_size, list(cfg.task.labels)
    rng = np.random.default_rng(0)
    store = rng.integers(0, 256, (images, size, size), dtype=np.uint8)
    targets = (rng.random((images, len(labels))) < 0.05).astype(np.float32)
    dataset = ManifestDataset(
        "/nonexistent", [f"{i}.png" for i in range(images)], targets, [f"b{i}" for i in range(images)], size,
        build_transform(cfg.augment.train), store=store, positions=np.arange(images),
    )  # fmt: skip
    return DataLoader(dataset, batch_size=cfg.data.batch_size, shuffle=True, drop_last=True, num_workers=workers,
                      pin_memory=True, persistent_workers=workers > 0, generator=torch.Generator().manual_seed(0))  # fmt: skip


def batches(data: DataLoader):
    while True:
        yield from data


def run_mode(cfg, data: DataLoader, dtype, steps: int, warmup: int, compile: bool) -> dict[str, float]:
    """One mode from a fresh network: images/s, peak memory (GiB) and data-wait share over the timed steps."""
    torch.manual_seed(0)
    model = model_from_config(cfg)
    counts = np.maximum(1, (data.dataset.targets.numpy() == 1).sum(axis=0))
    model.set_label_statistics(counts, len(data.dataset))
    apply_speedups(model, cuda=True, channels_last=True, compile=compile)
    model.cuda().train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.model.lr, weight_decay=cfg.model.weight_decay)
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    stream = batches(data)
    wait = total = 0.0
    for step in range(warmup + steps):
        start = time.perf_counter()
        batch = next(stream)
        fetched = time.perf_counter()
        images = batch["image"].cuda(non_blocking=True)
        targets = batch["target"].cuda(non_blocking=True)
        with torch.autocast("cuda", dtype=dtype or torch.float32, enabled=dtype is not None):
            loss = model.training_loss(images, targets.clamp_min(0), targets >= 0)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.trainer.gradient_clip_val)
        optimizer.step()
        torch.cuda.synchronize()
        if step >= warmup:
            wait += fetched - start
            total += time.perf_counter() - start
    if not torch.isfinite(loss.detach()).item():
        raise RuntimeError(f"non-finite loss {loss.item()} in {dtype or 'fp32'}")
    peak = torch.cuda.max_memory_allocated() / 2**30
    del model, optimizer
    return {"images_per_s": steps * cfg.data.batch_size / total, "peak_gib": peak, "wait_share": wait / total}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30, help="timed steps per mode and round")
    parser.add_argument("--warmup", type=int, default=5, help="untimed steps first (cuDNN autotuning, allocator)")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--workers", type=int, default=min(8, os.cpu_count() or 1), help="loader worker processes")
    parser.add_argument("--images", type=int, default=512, help="distinct images in memory (cycled)")
    parser.add_argument("--compile", action="store_true", help="compile the backbone in place, both modes")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. data.batch_size=48")
    args = parser.parse_args()
    reason = skip_reason()
    if reason:
        print(f"bench_gpu: skipped: {reason}")
        return 0
    cfg = preset_config(args.overrides)
    torch.backends.cudnn.benchmark = True
    data = loader(cfg, max(args.images, cfg.data.batch_size), args.workers)
    results: dict[str, list[dict]] = {mode: [] for mode in MODES}
    for _ in range(args.rounds):
        for mode, dtype in MODES.items():
            results[mode].append(run_mode(cfg, data, dtype, args.steps, args.warmup, args.compile))
            print(f"  {mode:<10} round: {results[mode][-1]}", flush=True)
    median = {mode: {key: statistics.median(r[key] for r in runs) for key in runs[0]} for mode, runs in results.items()}
    print(f"\ngpu  {torch.cuda.get_device_name()}  torch {torch.__version__}  model={cfg.model.backbone} "
          f"size={cfg.data.image_size} batch={cfg.data.batch_size} labels={len(cfg.task.labels)} loss={cfg.loss.name} "
          f"channels-last compile={args.compile} workers={args.workers} steps={args.steps} (+{args.warmup} warm-up) "
          f"rounds={args.rounds} cudnn.allow_tf32={torch.backends.cudnn.allow_tf32} "
          f"matmul.allow_tf32={torch.backends.cuda.matmul.allow_tf32}")  # fmt: skip
    print(f"  {'mode':<10} {'images/s':>10} {'peak GiB':>10} {'data wait':>10}")
    for mode, row in median.items():
        print(f"  {mode:<10} {row['images_per_s']:10.1f} {row['peak_gib']:10.2f} {row['wait_share']:10.1%}")
    fp32, bf16 = median["fp32"], median["bf16-mixed"]
    print(f"  bf16/fp32 images/s ratio: {bf16['images_per_s'] / fp32['images_per_s']:.2f}")
    print(f"  bf16/fp32 peak memory ratio: {bf16['peak_gib'] / fp32['peak_gib']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
