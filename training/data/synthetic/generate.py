"""Generate the built-in SYNTHETIC chest X-ray set: labels, images (in parallel), manifest, cache bookkeeping.

Layout of ``out_dir``::

    params.json          all generator parameters + version (the cache key), noise rates, realised counts
    images/synNNNNNN.png 8-bit grayscale films
    clean_labels.csv     image_id + noise-free labels (the truth the images were drawn from; for noise studies)
    manifest.csv         written last, atomically: its presence means the set is complete

Built on demand by ``SyntheticSource.prepare`` (training/data/sources.py).
"""

from __future__ import annotations

import csv
import hashlib
import json
import multiprocessing as mp
import os
import shutil
import time
from pathlib import Path

import cv2
import numpy as np

from training.data.synthetic.labels import FINDINGS, SPLITS, LabelConfig, LabelSample, count_table, sample_labels
from training.data.synthetic.render import ImageSpec, render_image


def _code_fingerprint() -> str:
    """Short hash of the generator's own source: editing a drawing rule invalidates every cached set."""
    digest = hashlib.sha256()
    for path in sorted(Path(__file__).parent.glob("*.py")):
        digest.update(path.name.encode() + path.read_bytes())
    return digest.hexdigest()[:10]


GENERATOR_VERSION = f"synthetic-cxr/1.0+{_code_fingerprint()}"
META_COLUMNS = ("image_id", "path", "split", "patient_id", "source", "view")


def image_id(index: int) -> str:
    return f"syn{index:06d}"


def spec_for(sample: LabelSample, index: int, seed: int) -> ImageSpec:
    """The drawing specification of image ``index`` of a label sample (drawn from its *clean* labels)."""
    positives = tuple(FINDINGS[c] for c in np.flatnonzero(sample.clean[index]))
    return ImageSpec(
        seed=seed,
        index=index,
        patient=int(sample.patient[index]),
        age=float(sample.age[index]),
        female=bool(sample.female[index]),
        source=str(sample.source[index]),
        view=str(sample.view[index]),
        findings=positives,
    )


def _draw_parallel(jobs: list, workers: int) -> None:
    """Draw ``jobs`` on a pool of ``workers`` processes (forked where the platform allows).

    Fork needs no ``if __name__ == "__main__"`` guard in the caller, but a forked child must not touch OpenCV's
    thread pool as inherited from a parent that already ran a parallel cv2 call (it hangs). So the parent drops to
    one OpenCV thread while it forks (children inherit 1 thread: one process per core, no oversubscription) and
    restores its setting afterwards.
    """
    method = "fork" if "fork" in mp.get_all_start_methods() else "spawn"
    previous = cv2.getNumThreads()
    cv2.setNumThreads(1)
    try:
        with mp.get_context(method).Pool(workers) as pool:
            for _ in pool.imap_unordered(_draw_chunk, jobs):
                pass
    finally:
        cv2.setNumThreads(previous)


def _draw_chunk(job: tuple[list[tuple[ImageSpec, str]], int]) -> int:
    tasks, image_size = job
    for spec, path in tasks:
        cv2.imwrite(path, render_image(spec, image_size))
    return len(tasks)


def _up_to_date(out_dir: Path, params: dict) -> bool:
    params_file, manifest = out_dir / "params.json", out_dir / "manifest.csv"
    if not (params_file.is_file() and manifest.is_file()):
        return False
    try:
        recorded = json.loads(params_file.read_text())
    except (OSError, json.JSONDecodeError):
        return False
    if recorded.get("params") != params:
        return False
    try:
        with open(manifest, newline="") as handle:
            paths = [row["path"] for row in csv.DictReader(handle)]
    except (OSError, KeyError, csv.Error):
        return False
    total = sum(params[f"n_{s}"] for s in SPLITS)
    return len(paths) == total and all((out_dir / p).is_file() for p in paths)


def generate(
    out_dir: str | Path,
    n_train: int = 6000,
    n_val: int = 1500,
    n_test: int = 1500,
    image_size: int = 128,
    seed: int = 0,
    workers: int = 2,
    force: bool = False,
    min_positives_per_split: int = 3,
    fn_rate: float = 0.12,
    fp_rate: float = 0.003,
    centre_b_trainval: float = 0.15,
    centre_b_test: float = 0.5,
    verbose: bool = True,
) -> Path:
    """Build (or reuse) a synthetic set and return the path of its manifest.

    Sizes are *image* counts per split; patients (1-3 images each) are generated until each count is reached and
    never cross splits. Everything is a pure function of the parameters: the same call gives byte-identical PNGs
    and manifest whatever ``workers`` is.

    Args:
        out_dir: folder of the set (created).
        n_train, n_val, n_test: images per split (defaults: 6000 / 1500 / 1500).
        image_size: square output size in pixels.
        seed: master seed.
        workers: drawing processes (1 = in this process). Not part of the cache key.
        force: regenerate even if an identical, complete set is present.
        min_positives_per_split: each finding gets at least this many positives in every split.
        fn_rate, fp_rate: train-only label noise (missed positives; false positives for classes >= 1 %).
        centre_b_trainval, centre_b_test: share of patients from centre_b in train/val and in test.
        verbose: print progress, timing and the per-class table.

    Returns:
        ``out_dir / "manifest.csv"``.
    """
    out_dir = Path(out_dir)
    cfg = LabelConfig(
        n_train=n_train,
        n_val=n_val,
        n_test=n_test,
        min_positives_per_split=min_positives_per_split,
        fn_rate=fn_rate,
        fp_rate=fp_rate,
        centre_b_fraction={"train": centre_b_trainval, "val": centre_b_trainval, "test": centre_b_test},
    )
    params = {
        "version": GENERATOR_VERSION,
        "n_train": n_train,
        "n_val": n_val,
        "n_test": n_test,
        "image_size": image_size,
        "seed": seed,
        "min_positives_per_split": min_positives_per_split,
        "fn_rate": fn_rate,
        "fp_rate": fp_rate,
        "fp_min_prevalence": cfg.fp_min_prevalence,
        "centre_b_fraction": cfg.centre_b_fraction,
        "ap_rate": cfg.ap_rate,
        "images_per_patient": list(cfg.images_per_patient),
        "unlabelled_rate": cfg.unlabelled_rate,
    }
    manifest = out_dir / "manifest.csv"
    if not force and _up_to_date(out_dir, params):
        if verbose:
            print(f"synthetic set up to date: {out_dir} ({sum(params[f'n_{s}'] for s in SPLITS)} images)")
        return manifest

    start = time.perf_counter()
    out_dir.mkdir(parents=True, exist_ok=True)
    manifest.unlink(missing_ok=True)  # from here on the folder is incomplete until the manifest is back
    shutil.rmtree(out_dir / "images", ignore_errors=True)
    (out_dir / "images").mkdir()
    sample = sample_labels(cfg, seed)
    n = len(sample)
    paths = [f"images/{image_id(i)}.png" for i in range(n)]
    tasks = [(spec_for(sample, i, seed), str(out_dir / paths[i])) for i in range(n)]
    chunk = 64
    jobs = [(tasks[k : k + chunk], image_size) for k in range(0, n, chunk)]
    if workers <= 1 or mp.current_process().daemon:  # a daemon (e.g. a loader worker) may not fork a pool
        for job in jobs:
            _draw_chunk(job)
    else:
        _draw_parallel(jobs, workers)
    elapsed = time.perf_counter() - start

    table = count_table(sample)
    record = {
        "params": params,
        "generator_version": GENERATOR_VERSION,
        "synthetic": True,
        "label_noise": {
            "applied_to": ["train"],
            "false_negative_rate": fn_rate,
            "false_positive_rate": fp_rate,
            "false_positive_min_prevalence": cfg.fp_min_prevalence,
            "realised": sample.noise,
        },
        # Train rows without any finding whose Normal is not given either: all-zero, unlabelled (docs/rules.md §12).
        "unlabelled_normal": {"applied_to": ["train"], "rate": cfg.unlabelled_rate, "rows": sample.noise["unlabelled"]},
        "workers": workers,
        "seconds": round(elapsed, 2),
        "images": n,
        "patients": int(len(np.unique(sample.patient))),
        "per_class": table,
    }
    (out_dir / "params.json").write_text(json.dumps(record, indent=2))
    _write_csv(out_dir / "clean_labels.csv", ["image_id", "age", "sex", *FINDINGS],
               ([image_id(i), f"{sample.age[i]:.0f}", "F" if sample.female[i] else "M", *sample.clean[i].tolist()]
                for i in range(n)))  # fmt: skip
    rows = (
        [image_id(i), paths[i], sample.split[i], f"pat{sample.patient[i]:05d}", sample.source[i], sample.view[i],
         *sample.labels[i].tolist()]
        for i in range(n)
    )  # fmt: skip
    _write_csv(manifest, [*META_COLUMNS, *FINDINGS], rows)  # last: marks the set complete
    if verbose:
        print(f"synthetic set: {n} images at {image_size}px in {elapsed:.1f}s with {workers} worker(s) -> {manifest}")
    return manifest


def _write_csv(path: Path, header, rows) -> None:
    """Write a CSV atomically (temporary file in the same folder, then rename)."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(header)
        writer.writerows(rows)
    os.replace(tmp, path)
