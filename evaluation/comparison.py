"""The tables and the verdict of a paired comparison of several entries (runs, or one configuration's seeds).

Built on ``evaluation.paired`` (the statistics) and ``evaluation.paired_data`` (the shared test set). Two families
of tests, each corrected with Holm's method (docs/compare.md, "Which run is really better"):

- **headline**: every pair of entries on each ranking-chain metric; the family of a metric is its pairs;
- **per class**: every entry against the first one (the reference) on each class's AP; the family of an entry
  is its classes.

A difference is *significant* when its Holm-adjusted p is below ``alpha``. Its interval is the plain 95 %
percentile interval of that one difference, not a simultaneous one.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from evaluation.paired import (
    chain_names,
    entry_estimate,
    entry_replicates,
    higher_is_better,
    holm,
    paired_difference,
    seed_noise,
    smallest_holm_p,
)
from evaluation.paired_data import PairedData

CORRECTION = "Holm"
P_VALUE = "two-sided bootstrap p = min(1, 2 (1 + min(#{d* <= 0}, #{d* >= 0})) / (n + 1))"
PER_CLASS = "ap"


@dataclass(frozen=True)
class Settings:
    n_boot: int = 10000
    seed: int = 0
    alpha: float = 0.05
    ci: float = 0.95
    threshold: float = 0.5


@dataclass
class Comparison:
    """What ``make compare`` reports: the entries' values, the pairs, the per-class table and how they were got."""

    entries: list[str]
    seeds: dict[str, int]
    values: pd.DataFrame  # entry, seeds, metric, value, ci_low, ci_high
    pairs: pd.DataFrame  # a, b, metric, a_value, b_value, difference, ci_low, ci_high, p, p_holm, significant, better
    per_class: pd.DataFrame  # class, group, support, <entry> AP..., then per other entry: vs reference
    settings: Settings
    strata: str
    notes: list[str]

    def verdict(self) -> list[str]:
        """One line per pair: who wins on which chain metric (advantage, 95 % CI, Holm p), the rest tied."""
        lines = []
        for (a, b), rows in self.pairs.groupby(["a", "b"], sort=False):
            won, tied = [], []
            for row in rows.itertuples():
                if not row.significant:
                    tied.append(row.metric)
                    continue
                winner, loser = (row.b, row.a) if row.better == row.b else (row.a, row.b)
                sign = 1.0 if (winner == row.b) == higher_is_better(row.metric) else -1.0
                low, high = sorted((sign * row.ci_low, sign * row.ci_high))
                won.append(f"{winner} beats {loser} on {row.metric} by {sign * row.difference:.3f} [{low:.3f}, "
                           f"{high:.3f}], p = {row.p_holm:.2g}")  # fmt: skip
            if tied:
                won.append(f"tied on {', '.join(tied)}")
            lines.append(f"{b} vs {a}: " + "; ".join(won))
        return lines

    def verdict_table(self) -> pd.DataFrame:
        """The pairs table as people read it, the runs in the order they were given: the difference b - a with its
        CI and Holm p, per pair and metric."""
        table = self.pairs.assign(
            difference=self.pairs.apply(lambda r: f"{r.difference:+.4f} [{r.ci_low:+.4f}, {r.ci_high:+.4f}]", axis=1),
            p=self.pairs["p"].map(lambda p: f"{p:.2g}"),
            p_holm=self.pairs["p_holm"].map(lambda p: f"{p:.2g}"),
            verdict=self.pairs.apply(lambda r: f"{r.better} better" if r.significant else "tied", axis=1),
        )
        return table[["a", "b", "metric", "a_value", "b_value", "difference", "p", "p_holm", "verdict"]].round(4)


def compare(data: PairedData, members: Mapping[str, Sequence[str]], groups: Mapping[str, str] | None = None,
            settings: Settings = Settings()) -> Comparison:  # fmt: skip
    """Compare the entries of ``members`` (``{entry: [keys of data.probs, one per seed]}``, in order; the first is
    the per-class reference) on the shared resamples of ``data``."""
    names = list(members)
    replicates = {
        name: entry_replicates(data.targets, [data.probs[key] for key in keys], data.labels, n_boot=settings.n_boot,
                               seed=settings.seed, strata=data.strata, threshold=settings.threshold)
        for name, keys in members.items()
    }  # fmt: skip
    noise = seed_noise(settings.n_boot, settings.seed)
    chain = chain_names()
    values = []
    for name in names:
        for metric in chain:
            (estimate,) = entry_estimate(replicates[name][metric], noise, settings.ci)
            values.append({"entry": name, "seeds": len(members[name]), "metric": metric, "value": estimate.value,
                           "ci_low": estimate.low, "ci_high": estimate.high})  # fmt: skip
    pairs = []
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            for metric in chain:
                (d,) = paired_difference(replicates[a][metric], replicates[b][metric], noise, settings.ci)
                pairs.append({"a": a, "b": b, "metric": metric, "a_value": float(replicates[a][metric].mean()),
                              "b_value": float(replicates[b][metric].mean()), "difference": d.value,
                              "ci_low": d.low, "ci_high": d.high, "p": d.p, "resamples": d.defined})  # fmt: skip
    pairs = pd.DataFrame(pairs)
    pairs["p_holm"] = np.nan
    for _, index in pairs.groupby("metric", sort=False).groups.items():
        pairs.loc[index, "p_holm"] = holm(pairs.loc[index, "p"].to_numpy())
    pairs["significant"] = pairs["p_holm"] < settings.alpha
    up = pairs["metric"].map(higher_is_better)
    pairs["better"] = np.where(~pairs["significant"], "", np.where((pairs["difference"] > 0) == up, pairs["b"],
                                                                   pairs["a"]))  # fmt: skip
    per_class, per_class_tests = _per_class(data, names, replicates, noise, groups or {}, settings)
    notes = []
    for family, m in (("a chain metric's pairs", len(names) * (len(names) - 1) // 2),
                      ("an entry's classes", per_class_tests)):  # fmt: skip
        if smallest_holm_p(settings.n_boot, m) >= settings.alpha:
            notes.append(f"with {settings.n_boot} resamples no p-value is below {2 / (settings.n_boot + 1):.2g}, so "
                         f"Holm over {family} ({m} tests) cannot reach {settings.alpha}: raise --n-boot")  # fmt: skip
    if any(len(keys) == 1 for keys in members.values()):
        notes.append("an entry with one run has no seed spread to add: its intervals are test-set resampling only")
    strata = ("unstratified (no source recorded)" if data.strata is None else
              f"stratified by source ({len(set(data.strata))} source(s))")  # fmt: skip
    return Comparison(names, {n: len(k) for n, k in members.items()}, pd.DataFrame(values), pairs, per_class,
                      settings, strata, notes)  # fmt: skip


def _per_class(data, names, replicates, noise, groups, settings) -> tuple[pd.DataFrame, int]:
    """Class, group, support, each entry's AP, then each other entry's difference from the reference."""
    table = pd.DataFrame({"class": data.labels, "group": [groups.get(c, "") for c in data.labels],
                          "support": data.support()})  # fmt: skip
    for name in names:
        table[name] = replicates[name][PER_CLASS].mean()
    reference, largest = names[0], 0
    for name in names[1:]:
        diffs = paired_difference(replicates[reference][PER_CLASS], replicates[name][PER_CLASS], noise, settings.ci)
        p = np.array([d.p for d in diffs])
        largest = max(largest, int(np.isfinite(p).sum()))
        adjusted = holm(p)
        table[f"{name} - {reference}"] = [d.value for d in diffs]
        table[f"{name} ci_low"] = [d.low for d in diffs]
        table[f"{name} ci_high"] = [d.high for d in diffs]
        table[f"{name} p_holm"] = adjusted
        table[f"{name} mark"] = np.where(adjusted < settings.alpha, np.where(table[f"{name} - {reference}"] > 0,
                                                                             "better", "worse"), "")  # fmt: skip
    return table, largest
