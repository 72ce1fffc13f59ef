"""The conventions the CXR-LT 2026 paper leaves open, as the platform's named choices (docs/rules.md §13).

Why a module of its own: the paper names its metrics and its bootstrap, but not every detail that moves a
figure (the threshold's value and side, the ECE's bins, which AP: it cites PASCAL VOC, whose interpolated AP is
not scikit-learn's step AP). A reader who puts a run's figure beside the paper's must see which reading
produced it. :class:`Conventions` holds the configurable ones, so every metric set of a run uses the same
reading; :data:`CHOICES` lists every choice (docs/rules.md §13 holds the same table, a test keeps them equal);
:func:`alternative_metrics` computes the other readings with the same resamples, shown but never ranked.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields

import numpy as np

from evaluation.metric_registry import AP_RULES
from evaluation.ranking import N_BINS
from evaluation.suite import compute_suite
from evaluation.thresholds import DEFAULT_THRESHOLD

#: Readable names of the AP definitions of :data:`evaluation.metric_registry.AP_RULES`.
AP_TITLES = {
    "step": "scikit-learn's step AP",
    "voc_all": "PASCAL VOC all-point interpolated AP",
    "voc_11": "PASCAL VOC 11-point interpolated AP",
}
#: Sides of the fixed threshold: the comparison that makes an image positive, and its short name in metric keys.
THRESHOLD_RULES = {">=": "ge", ">": "gt"}
#: How the pooled (internal + external) Task 2 test is resampled, and its short title.
UNSEEN_POOLED = {"within_source": "resampled within source", "whole": "resampled as one set"}
#: Where the alternatives of a metric set are logged: ``<set>/alternative/<name>``.
ALTERNATIVE = "alternative"
#: The figures that depend on the fixed threshold (the ``*_valthr`` ones use per-class thresholds instead).
THRESHOLD_FIGURES = ("mF1", "mPrecision", "mRecall")


@dataclass(frozen=True)
class Conventions:
    """The configurable readings of the paper's metrics; the defaults are the platform's choices.

    Attributes:
        threshold_rule: ``">="`` or ``">"``: which side of ``threshold`` is positive.
        ap: which AP ``mAP`` is, a key of :data:`AP_TITLES`.
        unseen_pooled_bootstrap: how Task 2's pooled test is resampled, a key of :data:`UNSEEN_POOLED`.
    """

    threshold: float = DEFAULT_THRESHOLD
    threshold_rule: str = ">="
    ece_bins: int = N_BINS
    ap: str = "step"
    unseen_pooled_bootstrap: str = "within_source"
    alternatives: bool = True

    def __post_init__(self) -> None:
        problems = []
        if self.threshold_rule not in THRESHOLD_RULES:
            problems.append(f"threshold_rule must be one of {list(THRESHOLD_RULES)}, got {self.threshold_rule!r}")
        if not 0.0 <= float(self.threshold) <= 1.0 or (self.threshold_rule == ">" and self.threshold >= 1.0):
            problems.append(f"threshold must be in [0, 1] (below 1 with '>'), got {self.threshold}")
        if int(self.ece_bins) != self.ece_bins or self.ece_bins < 1:
            problems.append(f"ece_bins must be a positive integer, got {self.ece_bins}")
        if self.ap not in AP_RULES:
            problems.append(f"ap must be one of {list(AP_RULES)}, got {self.ap!r}")
        if self.unseen_pooled_bootstrap not in UNSEEN_POOLED:
            problems.append(f"unseen_pooled_bootstrap must be one of {list(UNSEEN_POOLED)}, "
                            f"got {self.unseen_pooled_bootstrap!r}")  # fmt: skip
        if problems:
            raise ValueError("evaluation.conventions: " + "; ".join(problems))

    @classmethod
    def from_config(cls, evaluation: Mapping | None) -> Conventions:
        """From an ``evaluation`` config node; anything it lacks (a run stored before the node existed, a test's
        hand-built node) keeps the platform's default."""
        evaluation = evaluation if evaluation is not None else {}
        node = evaluation.get("conventions") or {}
        known = {f.name for f in fields(cls)} - {"threshold"}
        unknown = sorted(set(node) - known)
        if unknown:
            raise ValueError(f"evaluation.conventions: unknown keys {unknown}; known: {sorted(known)}")
        values = {key: node[key] for key in known if node.get(key) is not None}
        if evaluation.get("threshold") is not None:
            values["threshold"] = float(evaluation["threshold"])
        if "ece_bins" in values:
            values["ece_bins"] = int(values["ece_bins"])
        return cls(**values)

    @property
    def decision_threshold(self) -> float:
        """The threshold for the suite, which calls ``p >= t`` positive: ``p > t`` is ``p >=`` the next float up,
        exact for float64 probabilities."""
        return decision_threshold(self.threshold, self.threshold_rule)

    def suite_kwargs(self) -> dict:
        """The arguments of :func:`evaluation.suite.compute_suite` that carry these conventions."""
        return {"threshold": self.decision_threshold, "n_bins": int(self.ece_bins), "ap": self.ap}

    @property
    def unseen_within_source(self) -> bool:
        return self.unseen_pooled_bootstrap == "within_source"

    # --- the words printed beside each figure --------------------------------------------------------------------

    @property
    def threshold_text(self) -> str:
        """``p >= 0.5``."""
        return f"p {self.threshold_rule} {self.threshold:g}"

    def figure_notes(self) -> list[tuple[str, str]]:
        """``(figures, how they are computed)`` for every headline figure a convention affects."""
        bins = f"{self.ece_bins} equal-width bins"
        return [
            ("mAP", AP_TITLES[self.ap]),
            (", ".join(THRESHOLD_FIGURES), f"at {self.threshold_text}"),
            ("mECE", f"{bins}, mean over classes (ranked)"),
            ("ECE_pooled", f"{bins}, pooled over (image, class) pairs (not ranked)"),
        ]

    def line(self) -> str:
        """The same in one line, for the terminal."""
        return "; ".join(f"{figures} {text}" for figures, text in self.figure_notes())


def decision_threshold(threshold: float, rule: str) -> float:
    """``threshold`` as the suite's ``p >= t`` cut for ``rule``."""
    return float(threshold) if rule == ">=" else float(np.nextafter(float(threshold), np.inf))


# --- alternatives ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Alternative:
    """A reading of one figure other than the run's, computed with the same resamples.

    ``name`` is the key under ``<set>/alternative/`` (``mAP_voc_all``); ``overrides`` are the ``compute_suite``
    arguments that differ from the run's.
    """

    name: str
    title: str
    macro: str
    overrides: tuple[tuple[str, object], ...]


def alternatives(conventions: Conventions) -> list[Alternative]:
    """The readings the paper's citations suggest, other than the configured one: the other AP definitions and the
    other side of the threshold. (Pooled ECE, the other ECE, is logged by every run as ``ECE_pooled``.)"""
    out = [Alternative(f"mAP_{rule}", f"mAP as {AP_TITLES[rule]}", "mAP", (("ap", rule),))
           for rule in AP_RULES if rule != conventions.ap]  # fmt: skip
    other = next(rule for rule in THRESHOLD_RULES if rule != conventions.threshold_rule)
    cut = decision_threshold(conventions.threshold, other) if conventions.threshold < 1.0 or other == ">=" else None
    if cut is not None:
        out += [Alternative(f"{macro}_{THRESHOLD_RULES[other]}", f"{macro} at p {other} {conventions.threshold:g}",
                            macro, (("threshold", cut),)) for macro in THRESHOLD_FIGURES]  # fmt: skip
    return out


def alternative_metrics(targets: np.ndarray, probs: np.ndarray, labels: Sequence[str], conventions: Conventions,
                        n_boot: int, seed: int, strata: np.ndarray | None = None) -> dict[str, float]:  # fmt: skip
    """``alternative/<name>`` (with ``_ci_low``/``_ci_high``) of every :func:`alternatives` reading; empty when the
    conventions switch alternatives off.

    Same images, resamples (seed) and strata as the run's own figures, so an alternative differs from its figure
    only by the reading.
    """
    if not conventions.alternatives:
        return {}
    base = {"labels": labels, "n_boot": n_boot, "seed": seed, "strata": strata, **conventions.suite_kwargs()}
    wanted = alternatives(conventions)
    out: dict[str, float] = {}
    for overrides in dict.fromkeys(a.overrides for a in wanted):
        metrics = compute_suite(targets, probs, **{**base, **dict(overrides)}).metrics
        for alt in (a for a in wanted if a.overrides == overrides):
            for suffix in ("", "_ci_low", "_ci_high"):
                value = metrics.get(f"{alt.macro}{suffix}")
                if value is not None and np.isfinite(value):
                    out[f"{ALTERNATIVE}/{alt.name}{suffix}"] = float(value)
    return out


def unseen_pooled_alternative(targets: np.ndarray, probs: np.ndarray, labels: Sequence[str],
                              sources: np.ndarray | None, conventions: Conventions, n_boot: int,
                              seed: int) -> dict[str, float]:  # fmt: skip
    """``alternative/mAP_<other resampling>`` of Task 2's pooled test: its mAP interval resampled the other way
    (as one set, or within source). Empty without several sources, resamples or alternatives."""
    if not conventions.alternatives or sources is None or len(set(sources)) < 2 or not n_boot:
        return {}
    other = next(rule for rule in UNSEEN_POOLED if rule != conventions.unseen_pooled_bootstrap)
    metrics = compute_suite(targets, probs, labels, n_boot=n_boot, seed=seed, **conventions.suite_kwargs(),
                            strata=sources if other == "within_source" else None).metrics  # fmt: skip
    return {f"{ALTERNATIVE}/mAP_{other}{suffix}": float(metrics[f"mAP{suffix}"])
            for suffix in ("", "_ci_low", "_ci_high") if np.isfinite(metrics.get(f"mAP{suffix}", np.nan))}  # fmt: skip


# --- the list of the platform's own choices ----------------------------------------------------------------------


@dataclass(frozen=True)
class Choice:
    """One convention the platform chose where the paper is silent or not specific.

    Attributes:
        scope: ``metrics``, ``intervals``, ``groups``, ``perturbed``, ``heldout``, ``task2`` or ``training``; the
            report prints the scopes a run has.
        choice: what the platform does; ``{field}`` placeholders are filled from :class:`Conventions`.
        paper: what the paper says and leaves open; ``-`` where the choice rests on no statement of the paper.
    """

    name: str
    scope: str
    choice: str
    paper: str
    setting: str
    alternative: str = "-"

    def filled(self, conventions: Conventions) -> str:
        values = {f.name: getattr(conventions, f.name) for f in fields(conventions)}
        values.update(threshold_text=conventions.threshold_text, ap_title=AP_TITLES[conventions.ap],
                      unseen_pooled=UNSEEN_POOLED[conventions.unseen_pooled_bootstrap])  # fmt: skip
        return self.choice.format(**values)


CHOICES: tuple[Choice, ...] = (
    Choice("ap", "metrics", "AP is {ap_title}: the precision at each distinct score times the recall it adds",
           "mAP is the primary metric; cites PASCAL VOC; the step AP is not stated",
           "`evaluation.conventions.ap` (`step`, `voc_all`, `voc_11`); `val/mAP` is always step AP",
           "PASCAL VOC all-point and 11-point interpolated AP"),
    Choice("threshold", "metrics", "F1, precision and recall call an image positive at {threshold_text}",
           "F1, precision and recall at a fixed threshold; its value and side are not stated",
           "`evaluation.threshold`, `evaluation.conventions.threshold_rule`", "the other side (`p > 0.5`)"),
    Choice("zero_division", "metrics", "a zero denominator in precision, recall or F1 gives 0",
           "-", "fixed (`evaluation/thresholds.py`)"),
    Choice("ece_bins", "metrics", "ECE: {ece_bins} equal-width bins of [0, 1], L1; bin 0 closed at 0",
           "reports ECE; its binning is not stated", "`evaluation.conventions.ece_bins`"),
    Choice("ece_ranked", "metrics", "the ranked ECE is the mean of the per-class ECEs (`mECE`); pooled ECE is "
           "reported unranked", "ranks by ECE after mF1; per-class mean or pooled is not stated",
           "fixed: the tie-break place of `mECE` in `evaluation/metric_registry.py`, one chain for every run "
           "`make register` compares", "`ECE_pooled` in the chain's ECE place"),
    Choice("macro_point", "metrics", "a class without a positive (AUROC: or without a negative) is left out of "
           "the point estimate's macro mean too; an empty label is left out of its class",
           "states the rule for each bootstrap resample", "fixed (`evaluation/suite.py`)"),
    Choice("valthr", "metrics", "F1, precision and recall are also reported at per-class thresholds chosen on "
           "validation (`*_valthr`)", "-", "fixed (`evaluation/thresholds.py`)"),
    Choice("ci_percentiles", "intervals", "the percentiles use numpy's linear interpolation; a resample whose "
           "whole statistic is undefined is dropped", "1,000 case-level resamples, percentile interval",
           "fixed (`evaluation/bootstrap.py`)"),
    Choice("ci_seed", "intervals", "resample b draws from `SeedSequence(seed, spawn_key=(b,))`",
           "-", "`evaluation.seed` (0)"),
    Choice("ci_per_centre", "intervals", "a per-centre figure resamples within its centre",
           "resamples within source for its cross-centre analyses of Task 2",
           "fixed (`evaluation/evaluate.py`, `evaluation/unseen.py`)"),
    Choice("unseen_pooled", "task2", "Task 2's pooled test (internal + external) is {unseen_pooled}",
           "resamples within source for its cross-centre analyses; the pooled figure's resampling is not stated",
           "`evaluation.conventions.unseen_pooled_bootstrap` (`within_source`, `whole`)",
           "the other resampling"),
    Choice("unseen_exclusion", "task2", "an image positive for an unseen finding is removed from train and val, "
           "not only its label", "no supervised image label of the six unseen findings may be used",
           "fixed (`training/zeroshot/leak_guard.py`)"),
    Choice("internal_source", "task2", "the internal test is the centre `data.internal_source` names; every other "
           "centre is external", "internal test PadChest-GR, external test NIH ChestX-ray",
           "`data.internal_source` (`padchest`)"),
    Choice("group_bounds", "groups", "exactly 10% is medium, exactly 1% and 0.1% are rare; NIH's `No Finding` is "
           "the normal group", "Normal; common >10%, medium 1-10%, rare 0.1-1%, very rare <0.1%",
           "fixed (`evaluation/groups.py`)"),
    Choice("perturb_seed", "perturbed", "seed 2026; each image's draw from (seed, image index)",
           "generated once with a fixed seed", "`evaluation.perturbation.seed`"),
    Choice("perturb_draws", "perturbed", "scale and each axis's shift are each picked with probability 1/2, about "
           "the image centre, linear interpolation, black outside; noise clipped to [0, 1]; nothing else (no "
           "rotation)", "scale 0.9 or 1.1, shift -10% or +10% per axis, Gaussian noise with probability 0.5 and "
           "std in [0.1, 0.2] on [0, 1] intensities, no flip", "fixed (`evaluation/perturb.py`)"),
    Choice("perturb_resolution", "perturbed", "perturbed once at the source resolution (longer side at most "
           "1,024 px) before each model's resize, noise drawn at that resolution", "-",
           "`evaluation.perturbation.max_side`"),
    Choice("heldout_draw", "heldout", "sorted image ids, `default_rng(2026).choice` without replacement; Task 1 "
           "from the train split, Task 2 from val", "Task 1: 300 cases sampled from the training data; Task 2: 200 "
           "cases from the development set", "`evaluation.heldout`"),
    Choice("heldout_labels", "heldout", "the held-out subset is scored on the labels as released, not on the "
           "training targets (no `Normal` masking)", "-", "fixed (`evaluation/heldout.py`)"),
    Choice("normal_masking", "training", "on the train split, `Normal` of a row without any positive label is "
           "not labelled in training", "an all-zero label vector is not a confirmed normal",
           "fixed (`training/data/normal_label.py`)"),
    Choice("validation_split", "training", "10% of patients held out for validation (as the 2026 winner did), "
           "split by iterative stratification", "-", "the data config"),
    Choice("selection", "training", "`make register` picks by the task's `selection_metric` on validation, then "
           "the ranking chain on test", "-", "`configs/task/<task>.yaml`"),
)  # fmt: skip
"""The platform's own choices, one row each; docs/rules.md §13 holds this table verbatim."""

#: Order of the scopes in the table and the report.
SCOPES = ("metrics", "intervals", "task2", "groups", "perturbed", "heldout", "training")


def markdown_table(conventions: Conventions | None = None, scopes: Sequence[str] = SCOPES) -> list[str]:
    """The choices of ``scopes`` as a markdown table, with ``conventions``' values (the defaults: the doc's)."""
    conventions = conventions or Conventions()
    lines = ["| choice | the platform chooses | the paper says | setting | alternative shown |",
             "|---|---|---|---|---|"]  # fmt: skip
    for scope in SCOPES:
        if scope not in scopes:
            continue
        for c in (c for c in CHOICES if c.scope == scope):
            lines.append(f"| `{c.name}` | {c.filled(conventions)} | {c.paper} | {c.setting} | {c.alternative} |")
    return lines


# --- what the report and the terminal print ----------------------------------------------------------------------


def _cell(metrics: Mapping[str, float], key: str) -> str:
    value = metrics.get(key)
    if value is None or not np.isfinite(value):
        return "-"
    low, high = metrics.get(f"{key}_ci_low"), metrics.get(f"{key}_ci_high")
    return f"{value:.4f} [{low:.4f}, {high:.4f}]" if low is not None else f"{value:.4f}"


def of_evaluation(evaluation) -> Conventions:
    """The conventions an evaluation was computed with; the defaults for one that does not say."""
    return getattr(evaluation, "conventions", None) or Conventions()


def headline_notes(evaluation) -> list[str]:
    """Markdown under the headline tables: how their figures are computed, and the alternative readings as rows
    labelled alternatives (values of every metric set that logged them, Task 2's unseen classes first)."""
    conventions = of_evaluation(evaluation)
    notes = "; ".join(f"{figures}: {text}" for figures, text in conventions.figure_notes())
    lines = ["", f"How these figures are computed (the platform's choices; the paper does not state them, "
             f"docs/rules.md §13): {notes}."]  # fmt: skip
    unseen = getattr(getattr(evaluation, "unseen", None), "metrics", None) or {}
    metrics = {**evaluation.metrics, **unseen}
    sets = ["test_unseen"] * any(k.startswith(f"test_unseen/{ALTERNATIVE}/") for k in unseen) + list(evaluation.sets)
    rows = [(alt.title, f"{ALTERNATIVE}/{alt.name}") for alt in alternatives(conventions)]
    rows.append(("ECE_pooled in the chain's ECE place", "ECE_pooled"))
    rows = [(title, key) for title, key in rows if any(f"{s}/{key}" in metrics for s in sets)]
    if rows and any(f"{s}/{ALTERNATIVE}/" in key for key in metrics for s in sets):
        lines += ["", "Alternatives the paper's citations suggest (not the platform's choice, not ranked):", "",
                  "| alternative | " + " | ".join(sets) + " |", "|---" * (len(sets) + 1) + "|"]  # fmt: skip
        lines += [f"| {title} | " + " | ".join(_cell(metrics, f"{s}/{key}") for s in sets) + " |"
                  for title, key in rows]  # fmt: skip
    return lines


def applicable_scopes(evaluation) -> tuple[str, ...]:
    """The scopes of :data:`CHOICES` whose figures ``evaluation`` shows."""
    sets = getattr(evaluation, "sets", {})
    scopes = ["metrics", "intervals"]
    if getattr(evaluation, "unseen", None) is not None:
        scopes.append("task2")
    if getattr(evaluation, "groups", None):
        scopes.append("groups")
    if "test_perturbed" in sets:
        scopes.append("perturbed")
    if "heldout" in sets:
        scopes.append("heldout")
    return tuple(scopes) + ("training",)


def choices_section(evaluation) -> list[str]:
    """Markdown: the platform's choices behind this report's figures, with this run's settings."""
    conventions = of_evaluation(evaluation)
    lines = ["", "## Platform choices behind these figures", "",
             "Where the paper leaves a convention open, the platform chose one; these apply to this report "
             "(docs/rules.md §13 lists them all).", ""]  # fmt: skip
    lines += markdown_table(conventions, applicable_scopes(evaluation))
    unseen = getattr(getattr(evaluation, "unseen", None), "metrics", None) or {}
    task2 = unseen_alternative_line(conventions, unseen)
    if task2:
        lines += ["", task2]
    return lines


def unseen_alternative_line(conventions: Conventions, metrics: Mapping[str, float], prefix: str = "test_unseen"):
    """``Task 2 pooled mAP ...``: the pooled test's interval as configured and the other resampling; None without
    the alternative."""
    other = next(rule for rule in UNSEEN_POOLED if rule != conventions.unseen_pooled_bootstrap)
    key = f"{prefix}/{ALTERNATIVE}/mAP_{other}"
    if key not in metrics:
        return None
    return (f"Task 2 pooled test mAP, {UNSEEN_POOLED[conventions.unseen_pooled_bootstrap]} (the platform's "
            f"choice): {_cell(metrics, f'{prefix}/mAP')}; alternative, {UNSEEN_POOLED[other]}: "
            f"{_cell(metrics, key)}")  # fmt: skip


def terminal_lines(conventions: Conventions, metrics: Mapping[str, float]) -> list[str]:
    """The lines the terminal prints after the test figures: the reading behind them and, where logged, the
    alternatives of the unseen-class and the plain test sets and of Task 2's pooled interval."""
    lines = [f"conventions (the platform's, not stated by the paper; docs/rules.md §13): {conventions.line()}"]
    for prefix in ("test_unseen", "test"):
        shown = [f"{alt.title} {_cell(metrics, f'{prefix}/{ALTERNATIVE}/{alt.name}')}"
                 for alt in alternatives(conventions) if f"{prefix}/{ALTERNATIVE}/{alt.name}" in metrics]  # fmt: skip
        if shown:
            lines.append(f"alternatives, not ranked ({prefix}): " + "; ".join(shown))
    task2 = unseen_alternative_line(conventions, metrics)
    if task2:
        lines.append(task2)
    return lines
