"""Metrics engine speed: the bootstrap suite against a plain scikit-learn loop on a challenge-sized test set.

Synthetic, seeded test set shaped like CXR-LT: 1,400 images x 30 classes, long-tailed prevalence from 0.1% to 40%
(log-uniform), scores correlated with the labels (logistic of label shift + noise). Times:

* the full suite (AP, AUROC, F1/P/R at 0.5, ECE per class and pooled, CIs from 1,000 case-level resamples);
* a plain loop calling ``average_precision_score`` and ``roc_auc_score`` per resample and class. It is timed on
  the first ``--loop-resamples`` resamples (same resamples as the suite) and extrapolated linearly to 1,000, and
  it computes only AP and AUROC, so the ratio understates the suite's advantage.

Both must give the same per-class AP and AUROC, on the full set and on every timed resample, to ``TOLERANCE``
(the largest difference is printed); a class undefined in one must be undefined in the other.

Run: ``python tests/bench/bench_metrics.py`` (``make bench``).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np
from sklearn.metrics import average_precision_score, roc_auc_score

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from evaluation.bootstrap import resample_indices  # noqa: E402
from evaluation.suite import compute_suite  # noqa: E402

TOLERANCE = 1e-12


def synthetic(n: int, n_classes: int = 30, seed: int = 0) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """Long-tailed multi-label targets ``(n, C)`` and correlated probabilities ``(n, C)``."""
    rng = np.random.default_rng(seed)
    prevalence = np.exp(np.linspace(np.log(0.001), np.log(0.40), n_classes))  # 0.1% .. 40%
    targets = (rng.random((n, n_classes)) < prevalence).astype(np.int8)
    logit = np.log(prevalence / (1 - prevalence)) + 2.0 * targets + rng.normal(size=(n, n_classes))
    probs = 1.0 / (1.0 + np.exp(-logit))
    return targets, probs, [f"class_{c:02d}" for c in range(n_classes)]


def sklearn_per_class(targets: np.ndarray, probs: np.ndarray) -> np.ndarray:
    """``(2, C)`` AP and AUROC per class by a plain scikit-learn loop; NaN where a class has no positive (AUROC: or
    no negative), as the challenge leaves such a class out."""
    out = np.full((2, targets.shape[1]), np.nan)
    for c in range(targets.shape[1]):
        y, p = targets[:, c], probs[:, c]
        if y.sum() == 0:
            continue
        out[0, c] = average_precision_score(y, p)
        if (y == 0).any():
            out[1, c] = roc_auc_score(y, p)
    return out


def max_difference(ours: np.ndarray, theirs: np.ndarray) -> float:
    """Largest absolute difference; infinite where one side is defined and the other is not."""
    if not np.array_equal(np.isnan(ours), np.isnan(theirs)):
        return float("inf")
    return float(np.nanmax(np.abs(ours - theirs), initial=0.0))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n-boot", type=int, default=1000)
    parser.add_argument("--loop-resamples", type=int, default=50)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
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
    loop_values = np.stack([sklearn_per_class(targets[rows], probs[rows]) for rows in indices])  # (b, 2, C)
    loop_measured = time.perf_counter() - start
    loop_s = loop_measured / args.loop_resamples * args.n_boot

    suite_point = np.stack([result.per_class["ap"], result.per_class["auroc"]])
    suite_boot = np.stack([result.replicates[k][: args.loop_resamples] for k in ("ap", "auroc")], axis=1)
    difference = max(
        max_difference(suite_point, sklearn_per_class(targets, probs)), max_difference(suite_boot, loop_values)
    )
    m = result.metrics
    print(f"suite (AP, AUROC, F1/P/R@0.5, ECE, pooled ECE; {args.n_boot} resamples): {suite_s:8.3f} s "
          f"(median of {args.repeats})")  # fmt: skip
    print(f"sklearn loop (AP + AUROC only; {args.loop_resamples} resamples timed = {loop_measured:.2f} s, "
          f"extrapolated linearly to {args.n_boot}): {loop_s:8.2f} s")  # fmt: skip
    print(f"bootstrap {targets.shape[0]} x {targets.shape[1]}: sklearn loop / suite {loop_s / suite_s:.1f}x "
          f"[suite {suite_s:.3f} s | loop {loop_s:.2f} s]; same values to {TOLERANCE:.0e}: max |diff| "
          f"{difference:.1e} over per-class AP and AUROC, full set and {args.loop_resamples} resamples")  # fmt: skip
    print(f"mAP {m['mAP']:.4f} [{m['mAP_ci_low']:.4f}, {m['mAP_ci_high']:.4f}]  mAUROC {m['mAUROC']:.4f} "
          f"[{m['mAUROC_ci_low']:.4f}, {m['mAUROC_ci_high']:.4f}]  mF1 {m['mF1']:.4f}  mECE {m['mECE']:.4f}  "
          f"ECE_pooled {m['ECE_pooled']:.4f}")  # fmt: skip
    if difference > TOLERANCE:
        raise SystemExit(f"FAIL: suite and sklearn loop differ by {difference:.1e} (> {TOLERANCE:.0e})")


if __name__ == "__main__":
    main()
