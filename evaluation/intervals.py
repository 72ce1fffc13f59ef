"""What a bootstrap interval means, in one line, and which classes it and its point estimate leave out.

A macro mean leaves out every class without a positive (AUROC: without a positive or a negative), in the point
estimate and, by the challenge's rule, in each resample too (docs/rules.md §3). A resample that loses a rare, hard
class averages over easier ones, so an estimate can sit at or outside the edge of its own interval
(``mAP 0.085 [0.085, 0.125]``). That is the rule working, not a bug; readers only trust the pair when the rule and
the counts are written beside it: the terminal summary, the report (markdown and HTML) and the model card all read
these lines from here, from a run's flat metrics alone (``<set>/mAP_classes_left_out`` and
``<set>/mAP_resamples_dropping_a_class``, logged by :func:`evaluation.suite.compute_suite`).
"""

from __future__ import annotations

from evaluation.metric_registry import SUITE
from evaluation.suite import DROPPED_SUFFIX, LEFT_OUT_SUFFIX, SCORED_SUFFIX

#: The rule behind every ``value [low, high]`` the platform prints, in one line.
CI_RULE = ("[low, high] = 95% bootstrap interval: 2.5th-97.5th percentiles of case-level resamples; a class with no "
           "positive is left out of the macro mean, in the estimate and in each resample (challenge rule, "
           "docs/rules.md §3)")  # fmt: skip


def classes_left_out(metrics: dict[str, float], prefix: str, macro: str = "mAP") -> tuple[int, int, int] | None:
    """``(left out, classes, resamples losing one more)`` of ``prefix``'s ``macro``; None for a run logged before
    the count was (no ``<prefix>/<macro>_classes_left_out``)."""
    left_out = metrics.get(f"{prefix}/{macro}{LEFT_OUT_SUFFIX}")
    if left_out is None:
        return None
    entering = metrics.get(f"{prefix}/{macro}{SCORED_SUFFIX}")
    if entering is None:  # a run logged before that count: a class entering the mean has its own value logged
        per_class = f"{prefix}/{SUITE.by_key(macro).key}/"
        entering = sum(1 for key in metrics if key.startswith(per_class))
    return int(left_out), int(left_out) + int(entering), int(metrics.get(f"{prefix}/{macro}{DROPPED_SUFFIX}", 0))


def left_out_note(metrics: dict[str, float], prefix: str = "test", n_boot: int | None = None) -> str | None:
    """``2 of 30 classes have no positive in test and are left out of its macro means; 412 of 1000 resamples lost a
    further class and left it out too, so an estimate can sit outside its CI``; None when nothing is left out or the
    run predates the count. mAUROC's stricter rule (a negative too) is added when it leaves out more."""
    counts = classes_left_out(metrics, prefix)
    if counts is None or not (counts[0] or counts[2]):
        return None
    left_out, classes, resamples = counts
    of = f" of {n_boot}" if n_boot else ""
    if left_out:
        parts = [f"{left_out} of {classes} classes have no positive in {prefix} and are left out of its macro means"]
    else:
        parts = [f"all {classes} classes have a positive in {prefix}"]
    if resamples:
        further, too = ("a further", " too") if left_out else ("a", "")
        parts.append(f"{resamples}{of} resamples lost {further} class and left it out{too}, so an estimate can sit "
                     "outside its CI")  # fmt: skip
    auroc = classes_left_out(metrics, prefix, "mAUROC")
    if auroc is not None and auroc[0] > left_out:
        parts.append(f"mAUROC, which needs a negative too, leaves out {auroc[0]} of {auroc[1]}")
    return "; ".join(parts)
