"""Paired bootstrap between runs judged on one test set: is run B really better than run A, or is it noise?

Why paired: two runs scored on the same images share that test set's luck, so the difference is measured in
every resample on the *same* images (docs/rules.md §3), and its spread is much narrower than the two runs' own
intervals suggest. The difference, its percentile CI, the two-sided p-value by inverting the percentile
interval with the Monte-Carlo ``+1`` (Efron & Tibshirani 1993, ch. 15-16; Davison & Hinkley 1997, ch. 4), Holm's
correction within a family (Holm 1979) and the between-seed term added for entries of several seeds are
defined in docs/compare.md. No p-value is below ``2 / (n + 1)``, so Holm over ``m`` tests can only reach
``alpha`` when ``n + 1 > 2 m / alpha`` (:func:`smallest_holm_p`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from evaluation.bootstrap import percentile_ci
from evaluation.metric_registry import SUITE
from evaluation.suite import compute_suite
from evaluation.thresholds import DEFAULT_THRESHOLD

#: Spawn key of the between-seed normal draws: a 2-tuple, so it is no resample's ``(b,)`` key.
SEED_TERM_KEY = (1, 0)


def bootstrap_p_value(deltas: np.ndarray) -> float:
    """Two-sided bootstrap p-value of ``H0: difference = 0`` from the per-resample differences (module docstring).

    Args:
        deltas: ``(B,)`` differences; NaN (undefined in that resample) are dropped.

    Returns:
        p in ``(0, 1]``; NaN when no resample is defined.
    """
    values = np.asarray(deltas, dtype=np.float64).ravel()
    values = values[np.isfinite(values)]
    if values.size == 0:
        return float("nan")
    tail = min(int((values <= 0).sum()), int((values >= 0).sum()))
    return float(min(1.0, 2.0 * (tail + 1) / (values.size + 1)))


def holm(p_values: Sequence[float] | np.ndarray) -> np.ndarray:
    """Holm-adjusted p-values, in the input order; NaN entries stay NaN and are not counted as tests.

    Step-down: the ``i``-th smallest of ``m`` p-values is multiplied by ``m - i + 1`` (``i`` from 1), capped at 1,
    and made non-decreasing in that order, so an adjusted p below ``alpha`` rejects at family-wise level ``alpha``.
    """
    p = np.asarray(p_values, dtype=np.float64)
    out = np.full(p.shape, np.nan)
    finite = np.flatnonzero(np.isfinite(p))
    order = finite[np.argsort(p[finite], kind="stable")]
    m = len(order)
    scaled = np.minimum(1.0, (m - np.arange(m)) * p[order])
    out[order] = np.maximum.accumulate(scaled) if m else scaled
    return out


def smallest_holm_p(n_boot: int, n_tests: int) -> float:
    """The smallest Holm-adjusted p a family of ``n_tests`` bootstrap tests over ``n_boot`` resamples can reach."""
    return min(1.0, n_tests * 2.0 / (n_boot + 1))


def macro(values: np.ndarray) -> np.ndarray:
    """Mean over classes (last axis) of the defined values, NaN where none is: the suite's macro rule (§2)."""
    values = np.asarray(values, dtype=np.float64)
    defined = np.isfinite(values)
    count = defined.sum(axis=-1)
    total = np.where(defined, values, 0.0).sum(axis=-1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(count > 0, total / np.maximum(count, 1), np.nan)


@dataclass(frozen=True)
class Replicates:
    """One entry's values of one statistic: per seed on the full test set and in every shared resample.

    Attributes:
        point: ``(S, ...)`` full-test-set value of each of the entry's ``S`` seeds (``...``: nothing for a macro
            metric, ``(C,)`` for a per-class one).
        resampled: ``(S, B, ...)`` the same in each of the ``B`` shared resamples (NaN where undefined).
    """

    point: np.ndarray
    resampled: np.ndarray

    @property
    def seeds(self) -> int:
        return int(self.point.shape[0])

    def mean(self) -> np.ndarray:
        """``(...)`` mean over seeds on the full test set."""
        return self.point.mean(axis=0)

    def mean_resampled(self) -> np.ndarray:
        """``(B, ...)`` mean over seeds in each resample."""
        return self.resampled.mean(axis=0)

    def seed_term(self) -> np.ndarray:
        """``(...)`` variance of the seed mean from seed sampling, ``s^2 / S``; 0 with one seed."""
        if self.seeds < 2:
            return np.zeros(self.point.shape[1:])
        return self.point.var(axis=0, ddof=1) / self.seeds


def seed_noise(n_boot: int, seed: int) -> np.ndarray:
    """``(B,)`` standard normal draws of the between-seed term, the same for every comparison of one seed."""
    return np.random.default_rng(np.random.SeedSequence(int(seed), spawn_key=SEED_TERM_KEY)).standard_normal(n_boot)


@dataclass(frozen=True)
class Estimate:
    """A value (an entry's mean, or a difference) with its 95 % interval and, for a difference, its p-value."""

    value: float
    low: float
    high: float
    p: float = float("nan")
    defined: int = 0  # resamples where it was defined


def _replicate_stats(value: float, draws: np.ndarray, ci: float, with_p: bool) -> Estimate:
    low, high = percentile_ci(draws, ci)
    p = bootstrap_p_value(draws) if with_p else float("nan")
    return Estimate(float(value), low, high, p, int(np.isfinite(draws).sum()))


def entry_estimate(entry: Replicates, noise: np.ndarray, ci: float = 0.95) -> list[Estimate]:
    """An entry's mean over seeds with an interval for test-set and seed sampling, one per trailing position."""
    draws = entry.mean_resampled() + noise.reshape((-1,) + (1,) * (entry.point.ndim - 1)) * np.sqrt(entry.seed_term())
    value = np.atleast_1d(entry.mean())
    draws = draws.reshape(len(noise), -1)
    return [_replicate_stats(value[k], draws[:, k], ci, False) for k in range(value.size)]


def paired_difference(a: Replicates, b: Replicates, noise: np.ndarray, ci: float = 0.95) -> list[Estimate]:
    """``b - a`` with its paired-bootstrap interval and p-value, one per trailing position (one for a macro metric,
    one per class for a per-class one). Both entries must come from the same resamples (same test set, seed,
    strata)."""
    if a.resampled.shape[1:] != b.resampled.shape[1:]:
        raise ValueError(f"replicates of different shapes {a.resampled.shape[1:]} and {b.resampled.shape[1:]}: not "
                         "the same resamples of one test set")  # fmt: skip
    spread = np.sqrt(a.seed_term() + b.seed_term())
    draws = b.mean_resampled() - a.mean_resampled() + noise.reshape((-1,) + (1,) * spread.ndim) * spread
    value = np.atleast_1d(b.mean() - a.mean())
    draws = draws.reshape(len(noise), -1)
    return [_replicate_stats(value[k], draws[:, k], ci, True) for k in range(value.size)]


def chain_names() -> tuple[str, ...]:
    """The ranking chain's macro names in chain order (docs/rules.md §2), from the metric registry."""
    return tuple(metric.name for metric in SUITE.tie_break_chain())


def higher_is_better(name: str) -> bool:
    return SUITE.by_key(name).higher_is_better


def entry_replicates(targets: np.ndarray, probs_per_seed: Sequence[np.ndarray], labels: Sequence[str], *,
                     n_boot: int, seed: int, strata: np.ndarray | None = None, threshold: float = DEFAULT_THRESHOLD,
                     per_class: str = "ap", macros: Sequence[str] | None = None) -> dict[str, Replicates]:  # fmt: skip
    """One entry's :class:`Replicates` of every ranking-chain macro (or of ``macros``) and of ``per_class`` (key
    ``per_class``), over the shared resamples of ``evaluation.suite.compute_suite``, one row per seed.

    Every entry of a comparison must be given the same ``targets``, ``strata`` and resampling arguments: that is
    what makes the resamples the same images for every run.
    """
    results = [compute_suite(targets, probs, labels, n_boot=n_boot, seed=seed, threshold=threshold, strata=strata)
               for probs in probs_per_seed]  # fmt: skip
    out = {}
    for name in chain_names() if macros is None else macros:
        key = SUITE.by_key(name).key
        out[name] = Replicates(np.array([float(macro(r.per_class[key][None])[0]) for r in results]),
                               np.stack([macro(r.replicates[key]) for r in results]))  # fmt: skip
    key = SUITE.by_key(per_class).key
    out[per_class] = Replicates(np.stack([r.per_class[key] for r in results]),
                                np.stack([r.replicates[key] for r in results]))  # fmt: skip
    return out
