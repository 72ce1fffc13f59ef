"""The conventions the paper leaves open, as named settings (evaluation/conventions.py, docs/rules.md §2, §3, §13):
PASCAL VOC's AP against hand-computed values and the devkit's code, the threshold's side, the ECE bins, the pooled
Task 2 resampling, the defaults unchanged, the doc's table equal to the module's, and what the report prints."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from omegaconf import OmegaConf
from sklearn.metrics import average_precision_score, f1_score, precision_score, recall_score

from evaluation.calibration import ece
from evaluation.conventions import (
    CHOICES,
    Conventions,
    alternative_metrics,
    markdown_table,
    terminal_lines,
    unseen_pooled_alternative,
)
from evaluation.evaluate import Evaluation, MetricSet
from evaluation.ranking import ClassPlan, counts_matrix, interpolated_ap
from evaluation.report import write_report
from evaluation.suite import compute_suite
from evaluation.unseen import UnseenReport, unseen_metrics

ROOT = Path(__file__).resolve().parents[2]
LABELS = ["Cardiomegaly", "Hernia", "Pleural Effusion"]


def voc_ap(y, p, points=None, counts=None):
    """PASCAL VOC AP of one class as the suite computes it (``interpolated_ap``); a float without ``counts``."""
    plan = ClassPlan.build(y, p)
    counts_t, batch = counts_matrix(len(y), counts)
    ap = interpolated_ap(plan, plan.stats(counts_t), points)
    return ap if batch else float(ap[0])


def devkit_voc_ap(y: np.ndarray, p: np.ndarray, use_07_metric: bool) -> float:
    """The PASCAL VOC devkit's AP as its Python port (py-faster-rcnn ``voc_eval.voc_ap``) computes it: one
    detection per image, ranked by score, no tie grouping."""
    order = np.argsort(-p, kind="stable")
    tp = np.cumsum(y[order])
    rec, prec = tp / y.sum(), tp / np.arange(1, len(y) + 1)
    if use_07_metric:
        ap = 0.0
        for t in np.arange(0.0, 1.1, 0.1):
            ap += (0 if np.sum(rec >= t) == 0 else np.max(prec[rec >= t])) / 11.0
        return ap
    mrec, mpre = np.concatenate(([0.0], rec, [1.0])), np.concatenate(([0.0], prec, [0.0]))
    for i in range(mpre.size - 1, 0, -1):
        mpre[i - 1] = max(mpre[i - 1], mpre[i])
    i = np.where(mrec[1:] != mrec[:-1])[0]
    return float(np.sum((mrec[i + 1] - mrec[i]) * mpre[i + 1]))


def scored(n: int = 120, seed: int = 0, positives: tuple[int, ...] = (30, 7, 13)) -> tuple[np.ndarray, np.ndarray]:
    """Targets with a given number of positives per class and scores that rank them imperfectly, no ties."""
    rng = np.random.default_rng(seed)
    targets = np.zeros((n, len(positives)), int)
    for c, k in enumerate(positives):
        targets[rng.choice(n, k, replace=False), c] = 1
    probs = np.clip(targets * 0.3 + rng.random(targets.shape) * 0.7, 0.0, 1.0)
    return targets, probs


# --- PASCAL VOC AP -----------------------------------------------------------------------------------------------


def test_voc_ap_by_hand_on_a_curve_whose_envelope_lifts_a_positive():
    # ranked: + - - + +  ->  precision at the positives 1, 2/4, 3/5; recall 1/3, 2/3, 1
    y, p = np.array([1, 0, 0, 1, 1]), np.array([0.9, 0.8, 0.7, 0.6, 0.5])
    assert average_precision_score(y, p) == pytest.approx((1 + 0.5 + 0.6) / 3)  # step AP: 0.7
    # all-point: the envelope lifts the second positive's 0.5 to the third's 0.6
    assert voc_ap(y, p) == pytest.approx((1 + 0.6 + 0.6) / 3)  # 0.7333
    # 11-point: r = 0, 0.1, 0.2, 0.3 reach the first positive (precision 1), r = 0.4 ... 1 the envelope 0.6
    assert voc_ap(y, p, points=11) == pytest.approx((4 * 1.0 + 7 * 0.6) / 11)  # 0.7455


@pytest.mark.parametrize("positives", [1, 3, 7, 13, 29])
def test_voc_ap_equals_the_devkit_code_without_ties(positives):
    rng = np.random.default_rng(positives)
    y = np.zeros(90, int)
    y[rng.choice(90, positives, replace=False)] = 1
    p = rng.random(90) + 0.4 * y
    assert voc_ap(y, p) == pytest.approx(devkit_voc_ap(y, p, False), abs=1e-12)
    # 11-point: with these counts no recall lands on a tenth, where the devkit's 0.1 * k rounding would differ
    assert voc_ap(y, p, points=11) == pytest.approx(devkit_voc_ap(y, p, True), abs=1e-12)
    assert voc_ap(y, p) >= average_precision_score(y, p) - 1e-12  # the envelope never lowers it


def test_voc_ap_meets_a_recall_level_exactly():
    # 10 positives all ranked first: recall 0.3 is reached exactly at the third, precision 1 everywhere -> AP 1
    y, p = np.r_[np.ones(10, int), np.zeros(5, int)], np.linspace(1.0, 0.0, 15)
    assert voc_ap(y, p, points=11) == 1.0
    assert devkit_voc_ap(y, p, True) == pytest.approx(1.0)  # here the devkit agrees; the levels are met
    y = np.r_[np.ones(3, int), np.zeros(1, int), np.ones(7, int)]  # recall 3/10 then precision falls to 10/11
    expected = (4 * 1.0 + 7 * (10 / 11)) / 11  # r <= 0.3 reach the first three positives exactly
    assert voc_ap(y, np.linspace(1.0, 0.0, 11), points=11) == pytest.approx(expected)


def test_weighted_voc_ap_equals_voc_ap_of_the_resampled_data():
    targets, probs = scored()
    y, p = targets[:, 0], probs[:, 0]
    counts = np.random.default_rng(5).multinomial(len(y), np.full(len(y), 1 / len(y)), size=6)  # (6, N)
    for points in (None, 11):
        weighted = voc_ap(y, p, points=points, counts=counts)
        for b, row in enumerate(counts):
            keep = np.repeat(np.arange(len(y)), row)
            assert weighted[b] == pytest.approx(voc_ap(y[keep], p[keep], points=points), abs=1e-12)


def test_the_suite_computes_map_as_configured():
    targets, probs = scored()
    for rule, points in (("voc_all", None), ("voc_11", 11)):
        metrics = compute_suite(targets, probs, LABELS, n_boot=30, seed=2, ap=rule).metrics
        expected = [voc_ap(targets[:, c], probs[:, c], points=points) for c in range(3)]
        assert metrics["mAP"] == pytest.approx(np.mean(expected))
        assert metrics["ap/Hernia"] == pytest.approx(expected[1])
    step = compute_suite(targets, probs, LABELS, n_boot=0).metrics["mAP"]
    assert step == pytest.approx(np.mean([average_precision_score(targets[:, c], probs[:, c]) for c in range(3)]))
    with pytest.raises(ValueError, match="ap must be one of"):
        compute_suite(targets, probs, LABELS, n_boot=0, ap="coco")


# --- the settings ------------------------------------------------------------------------------------------------


def _config(**conventions):
    node = OmegaConf.load(ROOT / "configs/evaluation/default.yaml")
    return OmegaConf.merge(node, {"conventions": conventions}) if conventions else node


def test_the_defaults_are_the_figures_the_platform_has_always_logged():
    conventions = Conventions.from_config(_config())
    assert conventions == Conventions()
    assert conventions.suite_kwargs() == {"threshold": 0.5, "n_bins": 15, "ap": "step"}
    targets, probs = scored()
    assert compute_suite(targets, probs, LABELS, n_boot=40, **conventions.suite_kwargs()).metrics == (
        compute_suite(targets, probs, LABELS, n_boot=40).metrics
    )
    assert Conventions.from_config(OmegaConf.create({"threshold": 0.5})) == Conventions()  # a run stored before


def test_strict_threshold_calls_a_probability_of_exactly_the_threshold_negative():
    y = np.array([1, 1, 0, 1, 0, 0])
    p = np.array([0.9, 0.5, 0.5, 0.2, 0.1, 0.7])  # two images sit exactly on 0.5
    targets, probs = np.c_[y, 1 - y], np.c_[p, 1 - p]
    for rule, predicted in ((">=", p >= 0.5), (">", p > 0.5)):
        kwargs = Conventions.from_config(_config(threshold_rule=rule)).suite_kwargs()
        metrics = compute_suite(targets, probs, ["a", "b"], n_boot=0, **kwargs).metrics
        assert metrics["f1/a"] == pytest.approx(f1_score(y, predicted))
        assert metrics["precision/a"] == pytest.approx(precision_score(y, predicted))
        assert metrics["recall/a"] == pytest.approx(recall_score(y, predicted))
    assert f1_score(y, p >= 0.5) != f1_score(y, p > 0.5)  # the case tells the two apart


def test_ece_bins_reach_the_suite():
    targets, probs = scored()
    kwargs = Conventions.from_config(_config(ece_bins=10)).suite_kwargs()
    metrics = compute_suite(targets, probs, LABELS, n_boot=0, **kwargs).metrics
    assert metrics["ece/Cardiomegaly"] == pytest.approx(ece(targets[:, 0], probs[:, 0], n_bins=10))
    assert metrics["ece/Cardiomegaly"] != pytest.approx(ece(targets[:, 0], probs[:, 0], n_bins=15))


def test_bad_settings_are_refused_by_name():
    with pytest.raises(ValueError, match="unknown keys \\['bins'\\]"):
        Conventions.from_config(_config(bins=10))
    with pytest.raises(ValueError, match="threshold_rule must be one of"):
        Conventions(threshold_rule="=>")
    with pytest.raises(ValueError, match="ap must be one of"):
        Conventions(ap="coco")
    with pytest.raises(ValueError, match="unseen_pooled_bootstrap"):
        Conventions(unseen_pooled_bootstrap="by_patient")
    with pytest.raises(ValueError, match="below 1 with '>'"):
        Conventions(threshold=1.0, threshold_rule=">")


# --- alternatives ------------------------------------------------------------------------------------------------


def test_alternatives_are_the_other_readings_on_the_same_resamples():
    targets, probs = scored()
    probs[:10, 0] = 0.5  # some on the threshold, so p > 0.5 differs
    other = alternative_metrics(targets, probs, LABELS, Conventions(), n_boot=40, seed=3)
    voc = compute_suite(targets, probs, LABELS, n_boot=40, seed=3, ap="voc_all").metrics
    for suffix in ("", "_ci_low", "_ci_high"):
        assert other[f"alternative/mAP_voc_all{suffix}"] == pytest.approx(voc[f"mAP{suffix}"])
    eleven = compute_suite(targets, probs, LABELS, n_boot=40, seed=3, ap="voc_11").metrics
    assert other["alternative/mAP_voc_11"] == pytest.approx(eleven["mAP"])
    strict = np.mean([f1_score(targets[:, c], probs[:, c] > 0.5) for c in range(3)])
    assert other["alternative/mF1_gt"] == pytest.approx(strict)
    assert other["alternative/mF1_gt"] != pytest.approx(compute_suite(targets, probs, LABELS, n_boot=0).metrics["mF1"])
    assert "alternative/mAP_step" not in other  # the configured reading is the figure itself
    switched = alternative_metrics(targets, probs, LABELS, Conventions(ap="voc_all", threshold_rule=">"), 0, 3)
    assert set(switched) == {"alternative/mAP_step", "alternative/mAP_voc_11", "alternative/mF1_ge",
                             "alternative/mPrecision_ge", "alternative/mRecall_ge"}  # fmt: skip
    assert alternative_metrics(targets, probs, LABELS, Conventions(alternatives=False), 40, 3) == {}


def test_task2_pooled_test_resampled_as_configured_and_the_other_way_as_alternative():
    targets, probs = scored(n=90, positives=(12, 9, 20))
    sources = np.where(np.arange(90) < 60, "padchest", "nih")
    within = compute_suite(targets, probs, LABELS, n_boot=50, seed=1, strata=sources).metrics
    whole = compute_suite(targets, probs, LABELS, n_boot=50, seed=1).metrics
    assert within["mAP_ci_low"] != whole["mAP_ci_low"]
    default = unseen_metrics(targets, probs, LABELS, sources, 50, 1, 0.5, "padchest", Conventions())
    assert default["test_unseen/mAP_ci_low"] == pytest.approx(within["mAP_ci_low"])
    assert default["test_unseen/alternative/mAP_whole_ci_low"] == pytest.approx(whole["mAP_ci_low"])
    flipped = unseen_metrics(targets, probs, LABELS, sources, 50, 1, 0.5, "padchest",
                             Conventions(unseen_pooled_bootstrap="whole"))  # fmt: skip
    assert flipped["test_unseen/mAP_ci_low"] == pytest.approx(whole["mAP_ci_low"])
    assert flipped["test_unseen/alternative/mAP_within_source_ci_high"] == pytest.approx(within["mAP_ci_high"])
    internal = compute_suite(targets[:60], probs[:60], LABELS, n_boot=50, seed=1, strata=sources[:60]).metrics
    assert flipped["test_unseen/internal/mAP_ci_low"] == pytest.approx(internal["mAP_ci_low"])  # scopes unchanged
    one_centre = unseen_pooled_alternative(targets, probs, LABELS, np.full(90, "a"), Conventions(), 50, 1)
    assert one_centre == {}
    # the report and the run's tag say which resampling the pooled figure had
    report = UnseenReport(flipped, pd.DataFrame(), LABELS, "padchest", ["nih"], sources=["nih", "padchest"],
                          pooled_bootstrap="whole")  # fmt: skip
    assert f"| pooled (resampled as one set) | {flipped['test_unseen/mAP']:.3f} [" in report.summary()
    assert (
        report.tags["cxrlt.unseen.bootstrap"] == "resampled within source (nih, padchest); pooled resampled as one set"
    )
    default_report = UnseenReport(default, pd.DataFrame(), LABELS, "padchest", ["nih"], sources=["nih", "padchest"])
    assert "| pooled (resampled within source) |" in default_report.summary()


# --- where it is written -----------------------------------------------------------------------------------------


def test_docs_rules_holds_the_modules_table_verbatim():
    text = (ROOT / "docs/rules.md").read_text()
    section = text[text.index("## 13. Platform choices") :]
    table = [line for line in section.splitlines() if line.startswith("|")]
    assert table == markdown_table()
    assert len(table) == len(CHOICES) + 2 and len({c.name for c in CHOICES}) == len(CHOICES)
    for name in ("threshold", "ece_bins", "ece_ranked", "ap", "unseen_pooled", "heldout_labels"):
        assert f"| `{name}` |" in section


def test_no_rules_sentence_gives_the_paper_a_value_it_leaves_open():
    """The values the paper does not state appear in rules.md only as the platform's."""
    text = (ROOT / "docs/rules.md").read_text()
    paper = re.findall(r"\*\*The paper says\.\*\*(.*?)(?=\n\n)", text, flags=re.S)
    assert len(paper) == 8  # §1-§5, §10-§12
    said = " ".join(" ".join(paper).split())  # one line, so a phrase broken across lines is found
    for value in (">=", "threshold of", "15 ", "bins", "scikit", "seed 2026", "1/2", "linear",
                  "pooled over", "probability 1/2", "1,024"):  # fmt: skip
        assert value not in said, value
    assert "does not state the threshold's value or side, the ECE's binning" in said


def _evaluation(conventions: Conventions) -> Evaluation:
    targets, probs = scored(n=80, positives=(25, 4, 12))
    kwargs = conventions.suite_kwargs()
    result = compute_suite(targets, probs, LABELS, n_boot=30, seed=1, **kwargs)
    metrics = {f"test/{k}": v for k, v in result.metrics.items() if np.isfinite(v)}
    metrics.update({f"test/{k}": v for k, v in alternative_metrics(targets, probs, LABELS, conventions, 30, 1).items()})
    frame = pd.DataFrame(probs, columns=LABELS).assign(**{f"true/{c}": targets[:, i] for i, c in enumerate(LABELS)})
    return Evaluation({"test": MetricSet("test", probs, result, metrics)}, metrics, {"test": frame}, LABELS,
                      {"common": [0, 2], "rare": [1]}, np.array([0.3, 0.004, 0.15]), {}, conventions=conventions)  # fmt: skip


def test_the_report_prints_each_figures_reading_its_alternatives_and_the_choices_that_apply(tmp_path):
    evaluation = _evaluation(Conventions())
    report = write_report(evaluation, tmp_path / "report.md", []).read_text()
    assert ("How these figures are computed (the platform's choices; the paper does not state them, docs/rules.md "
            "§13): mAP: scikit-learn's step AP; mF1, mPrecision, mRecall: at p >= 0.5; mECE: 15 equal-width bins, "
            "mean over classes (ranked); ECE_pooled: 15 equal-width bins, pooled over (image, class) pairs "
            "(not ranked).") in report  # fmt: skip
    m = evaluation.metrics
    voc = m["test/alternative/mAP_voc_all"]
    row = (f"| mAP as PASCAL VOC all-point interpolated AP | {voc:.4f} [{m['test/alternative/mAP_voc_all_ci_low']:.4f}, "
           f"{m['test/alternative/mAP_voc_all_ci_high']:.4f}] |")  # fmt: skip
    assert row in report and "| mF1 at p > 0.5 |" in report and "| ECE_pooled in the chain's ECE place |" in report
    assert "Alternatives the paper's citations suggest (not the platform's choice, not ranked)" in report
    assert "| class | train prevalence | AP | AUROC | F1 (p >= 0.5) | ECE |" in report
    choices = report[report.index("## Platform choices behind these figures") :]
    assert "| `threshold` | F1, precision and recall call an image positive at p >= 0.5 |" in choices
    assert "| `group_bounds` |" in choices and "| `perturb_seed` |" not in choices  # no perturbed set here
    assert "| `unseen_pooled` |" not in choices and "| `heldout_labels` |" not in choices

    switched = _evaluation(Conventions(ap="voc_11", threshold=0.4, threshold_rule=">", ece_bins=10))
    text = write_report(switched, tmp_path / "switched.md", []).read_text()
    assert (
        "mAP: PASCAL VOC 11-point interpolated AP; mF1, mPrecision, mRecall: at p > 0.4; mECE: 10 equal-width" in text
    )
    assert "| mAP as scikit-learn's step AP |" in text and "| mF1 at p >= 0.4 |" in text
    assert "| `ap` | AP is PASCAL VOC 11-point interpolated AP:" in text


def test_the_terminal_prints_the_reading_and_the_alternatives():
    evaluation = _evaluation(Conventions())
    lines = terminal_lines(Conventions(), evaluation.metrics)
    assert lines[0] == ("conventions (the platform's, not stated by the paper; docs/rules.md §13): mAP scikit-learn's "
                        "step AP; mF1, mPrecision, mRecall at p >= 0.5; mECE 15 equal-width bins, mean over classes "
                        "(ranked); ECE_pooled 15 equal-width bins, pooled over (image, class) pairs (not ranked)")  # fmt: skip
    voc = evaluation.metrics["test/alternative/mAP_voc_all"]
    assert lines[1].startswith("alternatives, not ranked (test): mAP as PASCAL VOC all-point interpolated AP ")
    assert f"{voc:.4f} [" in lines[1] and "mRecall at p > 0.5 " in lines[1]
    unseen = {"test_unseen/mAP": 0.3, "test_unseen/mAP_ci_low": 0.2, "test_unseen/mAP_ci_high": 0.4,
              "test_unseen/alternative/mAP_whole": 0.3, "test_unseen/alternative/mAP_whole_ci_low": 0.22,
              "test_unseen/alternative/mAP_whole_ci_high": 0.41}  # fmt: skip
    assert terminal_lines(Conventions(), unseen)[-1] == (
        "Task 2 pooled test mAP, resampled within source (the platform's choice): 0.3000 [0.2000, 0.4000]; "
        "alternative, resampled as one set: 0.3000 [0.2200, 0.4100]"
    )
