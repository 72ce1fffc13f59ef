"""What a reader of a run's report sees: intervals that exclude their own point explained, report.html
self-contained, the per-class AP chart."""

from __future__ import annotations

import base64
import re
from types import SimpleNamespace

import numpy as np
import pandas as pd

from evaluation.bootstrap import resample_indices
from evaluation.evaluate import MetricSet
from evaluation.plots import per_class_ap
from evaluation.report import interval_notes, write_html, write_report
from evaluation.suite import compute_suite

LABELS = ["Common", "Medium", "Rare"]


def _split(seed: int = 0, n: int = 60) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    targets = np.zeros((n, 3), int)
    targets[rng.choice(n, 20, replace=False), 0] = 1
    targets[rng.choice(n, 6, replace=False), 1] = 1
    targets[rng.choice(n, 1), 2] = 1  # one positive: absent from about a third of all resamples
    probs = np.clip(targets * 0.3 + rng.random((n, 3)) * 0.7, 0, 1)
    return targets, probs


def test_dropped_resamples_are_counted_like_a_direct_check_of_each_resample():
    targets, probs = _split()
    result = compute_suite(targets, probs, LABELS, n_boot=300, seed=7)
    rows = resample_indices(len(targets), 300, 7)  # (B, N): the suite's own resamples
    no_positive = (targets[rows] == 1).sum(axis=1) == 0  # (B, C)
    expected = int(no_positive.any(axis=1).sum())
    assert 0 < expected < 300
    assert result.metrics["mAP_resamples_dropping_a_class"] == expected == result.resamples_dropping_a_class("ap")
    no_negative = (targets[rows] == 0).sum(axis=1) == 0
    assert result.metrics["mAUROC_resamples_dropping_a_class"] == int((no_positive | no_negative).any(axis=1).sum())


def _evaluation(targets, probs, n_boot=300):
    result = compute_suite(targets, probs, LABELS, n_boot=n_boot, seed=7)
    metrics = {f"test/{k}": v for k, v in result.metrics.items()}
    frame = pd.DataFrame(probs, columns=LABELS).assign(**{f"true/{n}": targets[:, i] for i, n in enumerate(LABELS)})
    return SimpleNamespace(
        sets={"test": MetricSet("test", probs, result, metrics)}, metrics=metrics, predictions={"test": frame},
        labels=LABELS, groups={"common": [0], "medium": [1], "rare": [2]},
        train_prevalence=np.array([0.3, 0.05, 0.005]), sources={},
    )  # fmt: skip


def _with_metrics(**metrics):
    result = SimpleNamespace(metrics=metrics, n_boot=1000)
    return SimpleNamespace(sets={"test": SimpleNamespace(result=result)})


def test_a_point_outside_its_interval_is_explained_with_the_count():
    # The README's NIH hold-out row: 0.095 [0.095, 0.135], the point just below its interval.
    evaluation = _with_metrics(mAP=0.0950, mAP_ci_low=0.0953, mAP_ci_high=0.135, mAP_resamples_dropping_a_class=412,
                               mAUROC=0.70, mAUROC_ci_low=0.65, mAUROC_ci_high=0.75)  # fmt: skip
    (note,) = interval_notes(evaluation)
    assert note.startswith("test/mAP 0.0950 lies outside its 95% CI [0.0953, 0.1350]: 412 of 1000 resamples")


def test_no_note_when_every_point_lies_in_its_interval_or_has_none():
    evaluation = _with_metrics(mAP=0.2, mAP_ci_low=0.2, mAP_ci_high=0.3, mAUROC=0.7, mF1=float("nan"),
                               mF1_ci_low=0.1, mF1_ci_high=0.2)  # fmt: skip
    assert interval_notes(evaluation) == []


def test_report_html_embeds_every_figure_and_renders_the_tables(tmp_path):
    evaluation = _evaluation(*_split())
    figure = per_class_ap(evaluation, tmp_path / "per_class_ap.png")
    assert figure.read_bytes().startswith(b"\x89PNG")
    html = write_html(write_report(evaluation, tmp_path / "report.md", [figure]), tmp_path / "report.html").read_text()
    embedded = re.findall(r'src="data:image/png;base64,([^"]+)"', html)
    assert [base64.b64decode(data) for data in embedded] == [figure.read_bytes()]
    assert "per_class_ap.png" not in html  # no link left to a file the viewer cannot follow
    assert "<table>" in html and "<td>Rare</td>" in html and "<h2>Headline</h2>" in html
