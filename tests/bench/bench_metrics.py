"""Metrics engine speed: the vectorised bootstrap suite versus a plain scikit-learn loop, and memory at 150k images.

Synthetic, seeded test set shaped like CXR-LT: 1,400 images x 30 classes, long-tailed prevalence from 0.1% to 40%
(log-uniform), scores correlated with the labels (logistic of label shift + noise). Times:

* the full suite (AP, AUROC, F1/P/R at 0.5, ECE per class and pooled, CIs from 1,000 case-level resamples);
* a plain loop calling ``average_precision_score`` and ``roc_auc_score`` per resample and class. It is timed on
  the first ``--loop-resamples`` resamples (same resamples as the suite) and extrapolated linearly to 1,000, and
  it computes only AP and AUROC, so the ratio understates the suite's advantage.

Both must agree on the point estimates and on the timed resamples' mAP/mAUROC. Then the suite runs on 150,000 x 30
with 1,000 resamples, reporting its time and peak memory (tracemalloc peak of allocations made during the call,
and the process's peak resident set size).

Last, the landed bootstrap path (``tests/bench/legacy_suite.py``, frozen) and the current one run side by side on
the same 150,000 x 30 input with 1,000 resamples drawn within two sources, as ``make bench-scale``'s test phase
calls it; the ratio and the largest difference between their replicates and CIs are printed (issue 31: >= 4x).
The current path evaluates its chunks on every CPU this process may use (``evaluation.suite.suite_threads``); its
one-thread time is printed beside it, so the gain of the arithmetic and that of the second core read apart.

Run: ``python tests/bench/bench_metrics.py`` (``--skip-large`` to leave out the 150k runs, ``--compare-only`` for
just the side-by-side comparison, ``--profile`` to add the current path's CPU time per stage).
"""

from __future__ import annotations

import argparse
import resource
import statistics
import sys
import time
import tracemalloc
from pathlib import Path

import numpy as np
from sklearn.metrics import average_precision_score, roc_auc_score

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from evaluation.bootstrap import resample_indices  # noqa: E402
from evaluation.suite import compute_suite, suite_threads  # noqa: E402
from tests.bench.legacy_suite import legacy_compute_suite  # noqa: E402


def synthetic(n: int, n_classes: int = 30, seed: int = 0) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """Long-tailed multi-label targets ``(n, C)`` and correlated probabilities ``(n, C)``."""
    rng = np.random.default_rng(seed)
    prevalence = np.exp(np.linspace(np.log(0.001), np.log(0.40), n_classes))  # 0.1% .. 40%
    targets = (rng.random((n, n_classes)) < prevalence).astype(np.int8)
    logit = np.log(prevalence / (1 - prevalence)) + 2.0 * targets + rng.normal(size=(n, n_classes))
    probs = 1.0 / (1.0 + np.exp(-logit))
    return targets, probs, [f"class_{c:02d}" for c in range(n_classes)]


def sklearn_macro(targets: np.ndarray, probs: np.ndarray) -> tuple[float, float]:
    """mAP and mAUROC by a plain per-class scikit-learn loop (classes without a positive/negative left out)."""
    aps, aurocs = [], []
    for c in range(targets.shape[1]):
        y, p = targets[:, c], probs[:, c]
        if y.sum() == 0:
            continue
        aps.append(average_precision_score(y, p))
        if (y == 0).any():
            aurocs.append(roc_auc_score(y, p))
    return float(np.mean(aps)), float(np.mean(aurocs))


def bench_small(args: argparse.Namespace) -> None:
    targets, probs, labels = synthetic(1400)
    print(f"data: {targets.shape[0]} images x {targets.shape[1]} classes, positives per class "
          f"{targets.sum(axis=0).min()}..{targets.sum(axis=0).max()}")  # fmt: skip

    times = []
    for _ in range(args.repeats):
        start = time.perf_counter()
        result = compute_suite(targets, probs, labels, n_boot=args.n_boot, seed=0)
        times.append(time.perf_counter() - start)
    suite_s = statistics.median(times)

    indices = resample_indices(len(targets), args.n_boot, seed=0, stop=args.loop_resamples)  # same resamples
    start = time.perf_counter()
    loop_values = [sklearn_macro(targets[rows], probs[rows]) for rows in indices]
    loop_measured = time.perf_counter() - start
    loop_s = loop_measured / args.loop_resamples * args.n_boot
    point = sklearn_macro(targets, probs)

    m = result.metrics
    suite_boot = np.column_stack(
        [np.nanmean(result.replicates[k][: args.loop_resamples], axis=1) for k in ("ap", "auroc")]
    )
    boot_diff = float(np.abs(suite_boot - np.array(loop_values)).max())
    point_diff = max(abs(m["mAP"] - point[0]), abs(m["mAUROC"] - point[1]))

    print(f"suite (AP, AUROC, F1/P/R@0.5, ECE, pooled ECE; {args.n_boot} resamples): {suite_s:8.3f} s "
          f"(median of {args.repeats})")  # fmt: skip
    print(f"sklearn loop (AP + AUROC only; {args.loop_resamples} resamples timed = {loop_measured:.2f} s, "
          f"extrapolated linearly to {args.n_boot}): {loop_s:8.2f} s")  # fmt: skip
    print(f"speed-up (sklearn loop / suite): {loop_s / suite_s:8.1f}x   [suite {suite_s:.3f} s | loop {loop_s:.2f} s]")
    print(f"agreement: point mAP {m['mAP']:.6f} vs sklearn {point[0]:.6f}, mAUROC {m['mAUROC']:.6f} vs "
          f"{point[1]:.6f}; max |diff| point {point_diff:.1e}, "
          f"over {args.loop_resamples} resamples {boot_diff:.1e}")  # fmt: skip
    print(f"mAP {m['mAP']:.4f} [{m['mAP_ci_low']:.4f}, {m['mAP_ci_high']:.4f}]  mAUROC {m['mAUROC']:.4f} "
          f"[{m['mAUROC_ci_low']:.4f}, {m['mAUROC_ci_high']:.4f}]  mF1 {m['mF1']:.4f}  mECE {m['mECE']:.4f}  "
          f"ECE_pooled {m['ECE_pooled']:.4f}")  # fmt: skip
    if point_diff > 1e-9 or boot_diff > 1e-9:
        raise SystemExit("FAIL: suite and sklearn loop disagree")


def bench_large(args: argparse.Namespace) -> None:
    targets, probs, labels = synthetic(args.large_n, seed=1)
    inputs_mb = (targets.nbytes + probs.nbytes) / 2**20
    tracemalloc.start()
    start = time.perf_counter()
    result = compute_suite(targets, probs, labels, n_boot=args.n_boot, seed=0)
    elapsed = time.perf_counter() - start
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    print(f"large: {args.large_n} images x {len(labels)} classes, {args.n_boot} resamples: {elapsed:8.2f} s "
          f"(mAP {result.metrics['mAP']:.4f} [{result.metrics['mAP_ci_low']:.4f}, "
          f"{result.metrics['mAP_ci_high']:.4f}])")  # fmt: skip
    print(f"large peak memory: {peak / 2**20:.0f} MiB allocated during compute_suite (tracemalloc; inputs "
          f"{inputs_mb:.0f} MiB not included), process peak RSS {rss:.0f} MiB")  # fmt: skip


def bench_compare(args: argparse.Namespace) -> None:
    """Landed vs current bootstrap on one input, timed one after the other in this process."""
    targets, probs, labels = synthetic(args.large_n, seed=1)
    sources = np.where(np.arange(args.large_n) % 3 == 0, "nih", "padchest")  # two strata
    start = time.perf_counter()
    old = legacy_compute_suite(targets, probs, labels, n_boot=args.n_boot, seed=0, strata=sources)
    old_s = time.perf_counter() - start
    start = time.perf_counter()
    new = compute_suite(targets, probs, labels, n_boot=args.n_boot, seed=0, strata=sources)
    new_s = time.perf_counter() - start
    start = time.perf_counter()
    compute_suite(targets, probs, labels, n_boot=args.n_boot, seed=0, strata=sources, threads=1)
    one_s = time.perf_counter() - start
    replicate_diff = max(
        float(np.nanmax(np.abs(new.replicates[k] - old.replicates[k]), initial=0.0)) for k in old.replicates
    )
    same_nan = all(np.array_equal(np.isnan(new.replicates[k]), np.isnan(old.replicates[k])) for k in old.replicates)
    ci_keys = [k for k in old.metrics if k.endswith(("_ci_low", "_ci_high"))]
    ci_diff = max(abs(new.metrics[k] - old.metrics[k]) for k in ci_keys)
    print(f"bootstrap {args.large_n} x {len(labels)}, {args.n_boot} resamples within 2 sources: landed "
          f"{old_s:.2f} s | current {new_s:.2f} s | speed-up {old_s / new_s:.2f}x (target >= 4x)")  # fmt: skip
    print(f"  current on {suite_threads()} thread(s) as above; on one thread {one_s:.2f} s, {old_s / one_s:.2f}x "
          "the landed path (which is single-threaded)")  # fmt: skip
    print(f"agreement: max |diff| replicates {replicate_diff:.1e}, CIs {ci_diff:.1e} over {len(ci_keys)} bounds, "
          f"same undefined resamples: {same_nan}")  # fmt: skip
    if replicate_diff > 1e-12 or ci_diff > 1e-12 or not same_nan:
        raise SystemExit("FAIL: current and landed bootstrap disagree")
    if args.profile:
        profile_current(targets, probs, labels, sources, args.n_boot)


STAGES = (  # (file the entry is in, "~" for built-ins; function name, or text in a built-in's) -> stage
    (("~", "csr_matvecs"), "ranking product (all classes, packed counts)"),
    (("~", "csc_matvecs"), "calibration product (float64 counts)"),
    (("bootstrap.py", "stratum_count_rows"), "count draws (generator + bincount)"),
    (("ranking.py", "_compute_ap_auroc"), "AP/AUROC from the prefix sums (incl. unpacking)"),
    (("packed_counts.py", "widen"), "widening narrow lanes"),
    (("~", "'cumsum'"), "prefix sums"),
    (("packed_counts.py", "pack"), "packing counts"),
)


def profile_current(targets: np.ndarray, probs: np.ndarray, labels: list[str], sources: np.ndarray, n_boot: int):
    """Where the current path spends its time: CPU seconds per stage (cProfile on process time, so other jobs on
    the machine inflate the figures less than wall time), setup (``n_boot=0``: sorting, segments, matrices, point
    estimate) timed on its own, then the costliest calls."""
    import cProfile
    import pstats

    start = time.process_time()
    compute_suite(targets, probs, labels, n_boot=0, seed=0, strata=sources, threads=1)
    setup_s = time.process_time() - start
    profiler = cProfile.Profile(time.process_time)
    profiler.enable()  # one thread: cProfile sees only the thread that enabled it
    compute_suite(targets, probs, labels, n_boot=n_boot, seed=0, strata=sources, threads=1)
    profiler.disable()
    stats = pstats.Stats(profiler)
    total = sum(entry[2] for entry in stats.stats.values())  # tottime over all entries = profiled CPU time
    print(f"profile of the current path ({n_boot} resamples): {total:.2f} CPU s under the profiler; setup and point")
    print(f"  estimate alone (n_boot=0, no profiler): {setup_s:.2f} CPU s")
    for (where, text), stage in STAGES:
        cumtime = sum(
            entry[3]
            for (path, _, name), entry in stats.stats.items()
            if path.endswith(where) and (text in name if where == "~" else name == text)
        )
        print(f"  {stage:50s} {cumtime:6.2f} s  ({100 * cumtime / total:4.1f}%)")
    stats.sort_stats("tottime").print_stats(12)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n-boot", type=int, default=1000)
    parser.add_argument("--loop-resamples", type=int, default=50)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--large-n", type=int, default=150_000)
    parser.add_argument("--skip-large", action="store_true")
    parser.add_argument("--compare-only", action="store_true", help="only the landed-vs-current 150k comparison")
    parser.add_argument(
        "--profile", action="store_true", help="after the comparison, CPU time per stage of the current path"
    )
    args = parser.parse_args()
    if not args.compare_only:
        bench_small(args)
    if not args.skip_large:
        if not args.compare_only:
            bench_large(args)
        bench_compare(args)


if __name__ == "__main__":
    main()
