"""An estimate outside its own CI is explained where it is shown: the rule in one line and how many classes the
estimate and the resamples leave out (issue 30, 8)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pandas as pd

from evaluation.bootstrap import resample_indices
from evaluation.evaluate import MetricSet
from evaluation.intervals import CI_RULE, left_out_note
from evaluation.report import summary_lines, write_html, write_report
from evaluation.suite import compute_suite

N_BOOT, SEED = 200, 3
LABELS = ["easy1", "easy2", *[f"rare{i}" for i in range(10)], "absent1", "absent2"]


def _split() -> tuple[np.ndarray, np.ndarray]:
    """Two easy classes, ten with one positive ranked last (AP 1/40), two with no test positive at all: most
    resamples lose a hard rare class, so their mean sits above the estimate."""
    n = 40
    targets = np.zeros((n, len(LABELS)), int)
    targets[:20, 0], targets[10:30, 1] = 1, 1
    probs = np.where(targets == 1, 0.9, 0.1)
    probs[:, 2:12] = np.random.default_rng(0).random((n, 10)) * 0.5 + 0.5
    for i in range(10):
        targets[i * 3, 2 + i], probs[i * 3, 2 + i] = 1, 0.01
    return targets, probs


def _metrics(targets, probs):
    result = compute_suite(targets, probs, LABELS, n_boot=N_BOOT, seed=SEED)
    return result, {f"test/{key}": value for key, value in result.metrics.items()}


def _lost_a_class(targets) -> int:
    """A direct check of the suite's own resamples: how many lose a class the full test set has a positive of."""
    rows = resample_indices(len(targets), N_BOOT, SEED)
    has_positive = (targets == 1).any(axis=0)
    return int((((targets[rows] == 1).sum(axis=1) == 0) & has_positive).any(axis=1).sum())


def test_an_estimate_outside_its_interval_gets_the_rule_and_the_left_out_count_in_the_terminal():
    targets, probs = _split()
    _, metrics = _metrics(targets, probs)
    assert metrics["test/mAP"] < metrics["test/mAP_ci_low"]  # the hand-made case: the estimate below its CI
    lost = _lost_a_class(targets)
    assert lost > 0
    note = (f"2 of 14 classes have no positive in test and are left out of its macro means; {lost} resamples lost a "
            "further class and left it out too, so an estimate can sit outside its CI")  # fmt: skip
    lines = summary_lines(metrics)
    assert lines[1:3] == [CI_RULE, note]
    assert "challenge rule, docs/rules.md §3" in CI_RULE and "\n" not in CI_RULE
    assert left_out_note(metrics, "test", N_BOOT) == note.replace(f"{lost} resamples", f"{lost} of {N_BOOT} resamples")


def test_the_html_report_states_the_rule_and_the_count(tmp_path):
    targets, probs = _split()
    result, metrics = _metrics(targets, probs)
    frame = pd.DataFrame(probs, columns=LABELS).assign(**{f"true/{n}": targets[:, i] for i, n in enumerate(LABELS)})
    evaluation = SimpleNamespace(
        sets={"test": MetricSet("test", probs, result, metrics)}, metrics=metrics, predictions={"test": frame},
        labels=LABELS, groups={}, train_prevalence=np.full(len(LABELS), 0.01), sources={},
    )  # fmt: skip
    page = write_html(write_report(evaluation, tmp_path / "report.md", []), tmp_path / "report.html").read_text()
    assert f"{CI_RULE}, {N_BOOT} resamples here." in page
    assert (f"2 of 14 classes have no positive in test and are left out of its macro means; {_lost_a_class(targets)} "
            f"of {N_BOOT} resamples lost a further class") in page  # fmt: skip
    assert "test/mAP 0.1875 lies outside its 95% CI" in page


def test_no_note_when_nothing_is_left_out_and_none_for_a_run_logged_before_the_count():
    targets, probs = _split()
    full = compute_suite(targets[:, :2], probs[:, :2], LABELS[:2], n_boot=50, seed=SEED)
    logged = {f"test/{key}": value for key, value in full.metrics.items()}
    assert logged["test/mAP_classes_left_out"] == 0 and logged["test/mAP_resamples_dropping_a_class"] == 0
    assert left_out_note(logged, "test") is None
    older = {key: value for key, value in logged.items() if not key.endswith("_classes_left_out")}
    assert left_out_note(older, "test") is None
    assert CI_RULE in summary_lines(logged) and len(summary_lines({"test/mAP": 0.3})) == 1  # no CI, no rule line
