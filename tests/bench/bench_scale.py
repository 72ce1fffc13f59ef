"""Release scale, measured: each stage of the platform at 10k, 40k and the full row count of a rehearsal release.

The rehearsal release is real metadata with placeholder pixels: every row of PadChest's own label table (through
the ``padchest`` adapter, docs/data.md "PadChest's own table") plus every row of NIH's ``Data_Entry_2017_v2020``,
their labels rolled up to the CXR-LT 2026 classes, patient-disjoint splits, one tiny PNG written per row under the
work folder (their count, names, folders and labels matter here, their pixels do not). Sizes are nested seeded
subsets of the rows, so a larger size always contains the smaller one.

Each (stage, size) runs in a fresh child process so its peak memory is its own: the parent polls the child and
all its descendants (data-loader workers) and records the peak of the summed resident set and of the summed
proportional set size (PSS counts a page shared by k processes as 1/k in each, so copy-on-write sharing between
forked workers is not counted k times). The growth exponent between two sizes is ``log(t2/t1) / log(n2/n1)``:
1 is linear, above 1.1 is flagged as super-linear (docs/scaling.md).

Run: ``make bench-scale`` (``python tests/bench/bench_scale.py [--sizes 10000 40000 full] [--stages ...]``);
the work folder (``--workdir``, default ``$CXRLT_BENCH_SCALE_DIR`` or ``/tmp/cxrlt-bench-scale``) keeps the
release and the placeholder images between runs (about 280k small files).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

SHARED = ROOT.parent / "shared" / "data"
NIH_TABLE = SHARED / "nih-labels" / "Data_Entry_2017_v2020.csv.gz"
PADCHEST_ROOT = SHARED / "padchest-labels"
#: NIH's finding names that are CXR-LT 2026 classes; the other NIH findings are not CXR-LT classes.
NIH_TO_CXRLT = {
    "Atelectasis": "Atelectasis",
    "Cardiomegaly": "Cardiomegaly",
    "Effusion": "Pleural Effusion",
    "Emphysema": "Emphysema",
    "Hernia": "Hernia",
    "Mass": "Mass",
    "Nodule": "Nodule",
    "Pleural_Thickening": "Pleural Thickening",
    "Pneumothorax": "Pneumothorax",
    "No Finding": "Normal",
}
STAGES = ("manifest", "data-check", "cache", "sampler-random", "sampler-class_aware", "sampler-repeat_factor",
          "loader-w1", "loader-w4", "train-steps", "test-phase")  # fmt: skip
IMAGE_SIZE = 16
BATCH = 64
STEPS = 60
ROUNDS = 5
#: train-steps: rounds of ``TRAIN_STEPS`` steps each way, alternated (short rounds: load on a shared machine comes in
#: bursts, and both sides must meet the same bursts)
TRAIN_ROUNDS, TRAIN_STEPS = 30, 10


# ---------------------------------------------------------------------------------------------- the release
def task_labels() -> list[str]:
    import yaml

    task = yaml.safe_load((ROOT / "configs" / "task" / "task2.yaml").read_text())
    return list(task["labels"]) + list(task["unseen"])


def build_release(workdir: Path) -> Path:
    """The full rehearsal manifest (written once), placeholder images included."""
    import cv2
    import pandas as pd

    from training.data.adapters.padchest import PadChestSource
    from training.data.splits import patient_split

    release = workdir / "release.csv"
    if release.is_file():
        return release
    labels = task_labels()
    images = workdir / "images"
    pad_manifest = PadChestSource(root=str(PADCHEST_ROOT), out_dir=str(workdir / "padchest")).prepare()
    pad = pd.read_csv(pad_manifest, dtype=str, keep_default_na=False)
    pad["path"] = "padchest/" + pad["image_id"]
    pad["source"] = "padchest"
    nih_raw = pd.read_csv(NIH_TABLE, dtype=str)
    nih = pd.DataFrame({
        "image_id": nih_raw["Image Index"],
        "path": "nih/" + nih_raw["Image Index"],
        "patient_id": "nih-" + nih_raw["Patient ID"],
        "source": "nih",
        "view": nih_raw["View Position"],
    })  # fmt: skip
    nih["split"] = patient_split(nih["patient_id"].tolist(), seed=0)
    findings = nih_raw["Finding Labels"].str.split("|")
    for column in labels:
        names = [n for n, c in NIH_TO_CXRLT.items() if c == column]
        nih[column] = findings.map(lambda f, names=names: "1" if set(f) & set(names) else "0") if names else ""
    keep = ["image_id", "path", "split", "patient_id", "source", "view", *labels]
    table = pd.concat([pad.reindex(columns=keep, fill_value=""), nih[keep]], ignore_index=True)
    ok, png = cv2.imencode(".png", np.full((8, 8), 128, np.uint8))
    data = png.tobytes()
    for folder in {str(Path(p).parent) for p in table["path"]}:
        (images / folder).mkdir(parents=True, exist_ok=True)
    for path in table["path"]:
        (images / path).write_bytes(data)
    order = np.random.default_rng(0).permutation(len(table))
    table.iloc[order].to_csv(release, index=False)
    return release


def sized_manifest(workdir: Path, rows: int) -> Path:
    import pandas as pd

    path = workdir / f"manifest_{rows}.csv"
    if not path.is_file():
        pd.read_csv(workdir / "release.csv", dtype=str, keep_default_na=False).head(rows).to_csv(path, index=False)
    return path


# ---------------------------------------------------------------------------------------------- the stages
def _manifest(workdir: Path, rows: int, labels: list[str]):
    from training.data.findings import KNOWN_FINDINGS
    from training.data.manifest import load_manifest

    return load_manifest(sized_manifest(workdir, rows), labels, KNOWN_FINDINGS, root=workdir / "images")


def stage_manifest(workdir, rows, labels) -> dict:
    """Validation against a plain ``read_csv`` of the same file, alternated ``ROUNDS`` times and compared by
    median, so load on a shared machine falls on both alike; imports happen before the first timer."""
    import pandas as pd

    import training.data.manifest  # noqa: F401  (imported outside the timer: the bench times reading, not importing)

    path = sized_manifest(workdir, rows)
    validate, plain = [], []
    for _ in range(ROUNDS):
        start = time.perf_counter()
        _manifest(workdir, rows, labels)
        validate.append(time.perf_counter() - start)
        start = time.perf_counter()
        pd.read_csv(path)
        plain.append(time.perf_counter() - start)
    validate_s, plain_s = float(np.median(validate)), float(np.median(plain))
    return {"seconds": validate_s, "read_csv_s": round(plain_s, 3), "vs_read_csv": round(validate_s / plain_s, 2)}


def stage_data_check(workdir, rows, labels) -> dict:
    from training.data.audit import check_dataset

    start = time.perf_counter()
    report = check_dataset(sized_manifest(workdir, rows), workdir / "images", labels=labels, workers=2)
    return {"seconds": time.perf_counter() - start, "errors": len(report.errors)}


def stage_cache(workdir, rows, labels) -> dict:
    import shutil

    from training.data.cache import PreprocessedCache

    manifest = _manifest(workdir, rows, labels)
    table = manifest.table
    cache = PreprocessedCache(f"bench-{rows}", IMAGE_SIZE, "stretch", root=workdir / "cache")
    shutil.rmtree(cache.dir, ignore_errors=True)
    start = time.perf_counter()
    cache.build([manifest.root / p for p in table["path"]], table["image_id"].tolist(), workers=2, progress=False)
    return {"seconds": time.perf_counter() - start}


def _sampler(name: str):
    from omegaconf import OmegaConf

    from training.components import build_component

    return build_component(OmegaConf.load(ROOT / "configs" / "sampler" / f"{name}.yaml"))


def stage_sampler(name: str):
    def run(workdir, rows, labels) -> dict:
        manifest = _manifest(workdir, rows, labels)
        targets = manifest.targets("train")
        start = time.perf_counter()
        sampler = _sampler(name).build(targets, 0)
        order = np.random.default_rng(0).permutation(len(targets)) if sampler is None else np.fromiter(sampler, int)
        return {"seconds": time.perf_counter() - start, "draws": int(order.size)}

    return run


def _datamodule(workdir: Path, rows: int, labels, workers: int, sampler: str = "class_aware", in_process=True):
    from training.data.datamodule import CXRDataModule
    from training.data.sources import ManifestSource

    source = ManifestSource(str(sized_manifest(workdir, rows)), root=str(workdir / "images"), name="bench")
    module = CXRDataModule(source, labels, IMAGE_SIZE, BATCH, num_workers=workers, sampler=_sampler(sampler),
                           cache_root=str(workdir / "cache"), loader_settings={"persistent_workers": False},
                           **({} if in_process else {"in_process_pixels": 0}))  # fmt: skip
    module.setup("fit")
    return module


def _workers_pss_mib() -> float:
    """Summed PSS of this process's loader workers now, MiB (what each holds of its own, shared pages split)."""
    import psutil

    total = 0
    for worker in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.Error):
            total += worker.memory_full_info().pss
    return round(total / 2**20, 1)


def stage_loader(workers: int):
    def run(workdir, rows, labels) -> dict:
        """Two whole epochs; the workers' PSS after their first batches and at the end of each epoch (a worker
        whose memory grew with the epoch shows as an end figure above the early one)."""
        module = _datamodule(workdir, rows, labels, workers, in_process=False)  # the workers themselves measured
        start = time.perf_counter()
        seen, pss = 0, []
        for _ in range(2):
            steps = len(module.train_dataloader())
            for step, batch in enumerate(module.train_dataloader()):
                seen += len(batch["image"])
                if step == 20 or step == steps - 1:
                    pss.append(_workers_pss_mib())
        return {"seconds": time.perf_counter() - start, "images": seen,
                "worker_pss_early_end": "/".join(f"{p:.0f}" for p in pss)}  # fmt: skip

    return run


def stage_train_steps(workdir, rows, labels) -> dict:
    """Optimiser steps over the full data module and sampler, then the same on bare tensors, interleaved.

    ``TRAIN_ROUNDS`` times: ``TRAIN_STEPS`` steps pulling batches from the training loader, then as many on batches
    already in memory (the first few the loader gave), so load on a shared machine falls on both alike; the ratio is
    the median of the rounds' ratios. Both sides run the model on one thread: a two-thread step of this tiny network
    on a busy two-core machine waits on the other thread for most of its time, noise that swamped the data path
    being measured. The throughput ratio is over steady state, from the first batch on; the pass's start (drawing
    the sampler's epoch, the first batch), paid once an epoch, is ``first_batch_s``.
    """
    import torch
    from torch import nn

    torch.manual_seed(0)
    torch.set_num_threads(1)
    module = _datamodule(workdir, rows, labels, workers=1)
    model = nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                          nn.Linear(8, len(labels)))  # fmt: skip
    optimiser = torch.optim.SGD(model.parameters(), lr=0.01)
    loss_fn = nn.BCEWithLogitsLoss()

    def step(x, y):
        optimiser.zero_grad()
        loss_fn(model(x), torch.nan_to_num(y.float().clamp(min=0))).backward()
        optimiser.step()

    def epochs():  # a small size's epoch holds fewer than the 1 + rounds x steps batches: the next one follows
        while True:
            yield from module.train_dataloader()

    start = time.perf_counter()
    loader = epochs()
    first = next(loader)
    first_batch = time.perf_counter() - start
    step(first["image"], first["target"])
    batches = [(first["image"].clone(), first["target"].clone())]
    platform, bare = [], []
    for _ in range(TRAIN_ROUNDS):
        start = time.perf_counter()
        for _ in range(TRAIN_STEPS):
            batch = next(loader)
            step(batch["image"], batch["target"])
            if len(batches) < 8:
                batches.append((batch["image"].clone(), batch["target"].clone()))
        platform.append(time.perf_counter() - start)
        start = time.perf_counter()
        for i in range(TRAIN_STEPS):
            step(*batches[i % len(batches)])
        bare.append(time.perf_counter() - start)
    ratio = float(np.median(np.array(bare) / np.array(platform)))
    return {"seconds": sum(platform), "bare_s": round(sum(bare), 3), "first_batch_s": round(first_batch, 2),
            "steps": TRAIN_ROUNDS * TRAIN_STEPS, "workers": module.train_dataloader().num_workers,
            "throughput_vs_bare": round(ratio, 2)}  # fmt: skip


def stage_test_phase(workdir, rows, labels) -> dict:
    from evaluation.suite import compute_suite

    manifest = _manifest(workdir, rows, labels)
    test = manifest.split("test")
    targets = np.nan_to_num(manifest.targets("test"), nan=-1).astype(np.int8)
    sources = test["source"].to_numpy()
    rng = np.random.default_rng(0)
    probs = np.clip(0.3 * (targets == 1) + 0.7 * rng.random(targets.shape), 0, 1)
    start = time.perf_counter()
    compute_suite(targets, probs, labels, n_boot=1000, strata=sources)
    return {"seconds": time.perf_counter() - start, "test_images": int(len(targets))}


RUNNERS = {
    "manifest": stage_manifest,
    "data-check": stage_data_check,
    "cache": stage_cache,
    "sampler-random": stage_sampler("random"),
    "sampler-class_aware": stage_sampler("class_aware"),
    "sampler-repeat_factor": stage_sampler("repeat_factor"),
    "loader-w1": stage_loader(1),
    "loader-w4": stage_loader(4),
    "train-steps": stage_train_steps,
    "test-phase": stage_test_phase,
}


# ---------------------------------------------------------------------------------------------- measuring
def run_child(stage: str, rows: int, workdir: Path) -> dict:
    """Run one stage in a fresh process; return its report plus the peak memory of it and its workers."""
    import psutil

    command = [sys.executable, __file__, "--child", stage, "--rows", str(rows), "--workdir", str(workdir)]
    child = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    peaks = {"rss_parent": 0, "rss_total": 0, "pss_total": 0}
    done = threading.Event()

    def poll():
        try:
            parent = psutil.Process(child.pid)
        except psutil.Error:
            return
        while not done.is_set():
            try:
                members = [parent, *parent.children(recursive=True)]
                rss = [m.memory_info().rss for m in members]
                pss = [getattr(m.memory_full_info(), "pss", 0) for m in members]
            except psutil.Error:
                time.sleep(0.05)
                continue
            peaks["rss_parent"] = max(peaks["rss_parent"], rss[0])
            peaks["rss_total"] = max(peaks["rss_total"], sum(rss))
            peaks["pss_total"] = max(peaks["pss_total"], sum(pss))
            time.sleep(0.1)

    watcher = threading.Thread(target=poll, daemon=True)
    watcher.start()
    out, err = child.communicate()
    done.set()
    watcher.join()
    if child.returncode != 0:
        return {"error": (err.strip().splitlines() or ["?"])[-1]}
    report = json.loads(out.strip().splitlines()[-1])
    report.update({k: v / 2**20 for k, v in peaks.items()})
    return report


def exponent(rows: list[int], seconds: list[float]) -> list[str]:
    """Growth exponent of each size against the previous one (empty for the first)."""
    cells = [""]
    for i in range(1, len(rows)):
        (n1, t1), (n2, t2) = (rows[i - 1], seconds[i - 1]), (rows[i], seconds[i])
        cells.append(f"{math.log(t2 / t1) / math.log(n2 / n1):.2f}" if min(t1, t2) > 0 and n2 != n1 else "")
    return cells


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", nargs="+", default=["10000", "40000", "full"])
    parser.add_argument("--stages", nargs="+", default=list(STAGES), choices=STAGES)
    parser.add_argument("--workdir", default=os.environ.get("CXRLT_BENCH_SCALE_DIR", "/tmp/cxrlt-bench-scale"))
    parser.add_argument("--child", choices=STAGES)
    parser.add_argument("--rows", type=int)
    args = parser.parse_args()
    workdir = Path(args.workdir)
    if args.child:
        print(json.dumps(RUNNERS[args.child](workdir, args.rows, task_labels())))
        return
    if not PADCHEST_ROOT.is_dir() or not NIH_TABLE.is_file():
        sys.exit(f"bench-scale needs {PADCHEST_ROOT} and {NIH_TABLE} (../shared/data beside the repository)")
    workdir.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    release = build_release(workdir)
    total = sum(1 for _ in release.open()) - 1
    print(f"rehearsal release: {total:,} rows ({release}), ready in {time.perf_counter() - start:.0f} s", flush=True)
    sizes = [total if s == "full" else min(int(s), total) for s in args.sizes]
    print(f"{'stage':<22} {'rows':>8} {'wall s':>8} {'exp':>5} {'parent MiB':>10} {'all RSS MiB':>11} "
          f"{'all PSS MiB':>11}  notes")  # fmt: skip
    results = {}
    for stage in args.stages:
        reports = [run_child(stage, rows, workdir) for rows in sizes]
        results[stage] = dict(zip(sizes, reports, strict=True))
        seconds = [r.get("seconds", float("nan")) for r in reports]
        for rows, report, exp in zip(sizes, reports, exponent(sizes, seconds), strict=True):
            if "error" in report:
                print(f"{stage:<22} {rows:>8} failed: {report['error']}")
                continue
            notes = ", ".join(f"{k}={v}" for k, v in report.items()
                              if k not in {"seconds", "rss_parent", "rss_total", "pss_total"})  # fmt: skip
            flag = " super-linear" if exp and float(exp) > 1.1 else ""
            print(f"{stage:<22} {rows:>8} {report['seconds']:>8.2f} {exp:>5} {report['rss_parent']:>10.0f} "
                  f"{report['rss_total']:>11.0f} {report['pss_total']:>11.0f}  {notes}{flag}", flush=True)  # fmt: skip
    for line in target_lines(results, sizes):
        print(line, flush=True)


def target_lines(results: dict, sizes: list[int]) -> list[str]:
    """The ratio targets of issue 31, read off this run.

    Loader memory is judged on summed PSS: summed RSS counts every page a forked worker shares with the parent
    (copy-on-write: the libraries, the images, the parent's heap) once per worker, memory that exists once.
    """
    lines = []
    for rows in sizes:
        manifest = results.get("manifest", {}).get(rows, {})
        if "vs_read_csv" in manifest:
            lines.append(f"manifest validation at {rows} rows: {manifest['vs_read_csv']:.2f}x a plain read_csv "
                         "(target <= 3)")  # fmt: skip
        one, four = results.get("loader-w1", {}).get(rows, {}), results.get("loader-w4", {}).get(rows, {})
        if "pss_total" in one and "pss_total" in four:
            lines.append(f"loader-w4 / loader-w1 at {rows} rows: PSS {four['pss_total'] / one['pss_total']:.2f}x "
                         f"(target <= 1.5), RSS {four['rss_total'] / one['rss_total']:.2f}x")  # fmt: skip
        train = results.get("train-steps", {}).get(rows, {})
        if "throughput_vs_bare" in train:
            lines.append(f"train-steps at {rows} rows: throughput_vs_bare {train['throughput_vs_bare']:.2f} "
                         "(target >= 0.9)")  # fmt: skip
    return lines


if __name__ == "__main__":
    main()
