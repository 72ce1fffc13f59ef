"""Task 2's analyses of the unseen classes (held-out, TTA, perturbed; internal / external / pooled) and the ground
truth `make score` reads from the release's own label table, against values computed here independently."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
import torch
from omegaconf import OmegaConf
from sklearn.metrics import average_precision_score

from apps.score import score
from apps.score_truth import TruthError, internal_source, read_truth
from evaluation.heldout import draw_unseen
from evaluation.organiser_names import TASK1_COLUMNS, TASK2_COLUMNS
from evaluation.report import summary_lines
from evaluation.unseen import _heldout, analyses_table, perturbation_deltas, scoped_metrics, summary_table
from tests.cxrlt2026_release import DEV_LABELS, write_release
from training.data.adapters.cxrlt2026_files import TEST_LISTS
from training.data.findings import TASK2_LABELS

UNSEEN = ["Adenopathy", "Bulla", "Goiter"]


def macro_ap(targets: np.ndarray, scores: np.ndarray) -> float:
    """scikit-learn's AP averaged over the classes with a labelled positive (docs/rules.md §2)."""
    values = []
    for c in range(targets.shape[1]):
        known = targets[:, c] >= 0
        if (targets[known, c] == 1).any():
            values.append(average_precision_score(targets[known, c], scores[known, c]))
    return float(np.mean(values))


class MeanPixel(torch.nn.Module):
    """Unseen logits rising with an image's mean pixel, one positive slope per class: the AP of each class is then
    the AP of the raw mean pixel values, which the test computes without the model."""

    def __init__(self, n_classes: int):
        super().__init__()
        self.slope = torch.nn.Parameter(torch.linspace(1.0, 2.0, n_classes))

    def forward(self, images):  # (B, 1, H, W) -> (B, U)
        return images.mean(dim=(1, 2, 3))[:, None] * self.slope


def development_split(n=30, seed=0):
    """A development split of ``n`` images from two centres, ids out of order, each class positive in both."""
    rng = np.random.default_rng(seed)
    ids = [f"dev{k:02d}" for k in rng.permutation(n)]
    images = rng.integers(0, 256, (n, 6, 6), dtype=np.uint8)
    targets = (rng.random((n, len(UNSEEN))) < 0.4).astype(np.float32)
    targets[: n // 2 : 5] = 1  # positives in centre a
    targets[n // 2 :: 5] = 1  # and in centre b
    targets[3, 0] = -1  # one label not given: left out of that class
    frame = pd.DataFrame({"image_id": ids, "source": ["a"] * (n // 2) + ["b"] * (n - n // 2)})
    return frame, targets, images


class DevelopmentModule:
    """What the held-out draw needs of a data module: the split as released (``unseen_split``) and a batch size."""

    batch_size = 4

    def __init__(self, frame, targets, images):
        self.frame, self.targets, self.images = frame, targets, images
        self.asked = []

    def unseen_split(self, unseen, split):
        self.asked.append((tuple(unseen), split))
        return self.frame, self.targets, SimpleNamespace(image=lambda i: self.images[i])


def test_heldout_unseen_is_the_macro_ap_of_the_ten_drawn_development_images():
    frame, targets, images = development_split()
    module = DevelopmentModule(frame, targets, images)
    cfg = OmegaConf.create({"evaluation": {"heldout": {"enabled": True, "split": "val", "size": 10, "seed": 7}}})
    suite = dict(labels=UNSEEN, n_boot=50, seed=0, threshold=0.5)
    metrics, predictions, draw = _heldout(MeanPixel(len(UNSEEN)), module, cfg, UNSEEN, "a", suite)
    assert module.asked == [(tuple(UNSEEN), "val")]  # the split as released, on the unseen classes
    # The draw, redone by hand: ids sorted as text, then numpy's choice of 10 of the 30 with the seed.
    order = np.argsort(frame["image_id"].to_numpy())
    rows = order[np.sort(np.random.default_rng(7).choice(30, size=10, replace=False))]
    assert list(predictions["image_id"]) == list(frame["image_id"].iloc[rows]) == list(draw.image_ids)
    means = images[rows].reshape(10, -1).mean(axis=1)
    scores = np.repeat(means[:, None], len(UNSEEN), axis=1)  # the ranking every class's probabilities follow
    assert metrics["heldout_unseen/mAP"] == pytest.approx(macro_ap(targets[rows], scores))
    centre = frame["source"].to_numpy()[rows]
    for scope, name in (("internal", "a"), ("external", "b")):
        part = centre == name
        assert metrics[f"heldout_unseen/{scope}/mAP"] == pytest.approx(macro_ap(targets[rows][part], scores[part]))
    low, high = metrics["heldout_unseen/mAP_ci_low"], metrics["heldout_unseen/mAP_ci_high"]
    assert 0 <= low <= high <= 1 and metrics["heldout_unseen/n_images"] == 10
    assert metrics["heldout_unseen/trained_on"] == 0 and draw.caveat.startswith("the checkpoint was selected")
    np.testing.assert_array_equal(predictions[[f"true/{n}" for n in UNSEEN]].to_numpy(), targets[rows].astype(int))


def test_heldout_unseen_is_left_out_when_switched_off_or_without_a_positive():
    frame, targets, images = development_split()
    suite = dict(labels=UNSEEN, n_boot=0, seed=0, threshold=0.5)
    off = OmegaConf.create({"evaluation": {"heldout": {"enabled": False, "split": "val", "size": 10, "seed": 7}}})
    assert _heldout(MeanPixel(3), DevelopmentModule(frame, targets, images), off, UNSEEN, "a", suite) is None
    on = OmegaConf.create({"evaluation": {"heldout": {"enabled": True, "split": "train", "size": 10, "seed": 7}}})
    unlabelled = DevelopmentModule(frame, np.full_like(targets, -1), images)  # e.g. training rows: none labelled
    assert _heldout(MeanPixel(3), unlabelled, on, UNSEEN, "a", suite) is None


def test_heldout_unseen_draws_only_among_the_rows_labelled_for_an_unseen_class_and_says_so():
    frame, targets, images = development_split()
    targets[::2] = -1  # every other development row carries no unseen label, as a release's training rows do
    cfg = OmegaConf.create({"evaluation": {"heldout": {"enabled": True, "split": "val", "size": 10, "seed": 7}}})
    suite = dict(labels=UNSEEN, n_boot=0, seed=0, threshold=0.5)
    metrics, predictions, draw = _heldout(MeanPixel(3), DevelopmentModule(frame, targets, images), cfg, UNSEEN,
                                          "a", suite)  # fmt: skip
    # Redone by hand: the 15 labelled rows' ids sorted as text, then numpy's choice of 10 of them with the seed.
    pool = sorted(frame["image_id"].iloc[1::2])
    assert list(draw.image_ids) == [pool[k] for k in sorted(np.random.default_rng(7).choice(15, 10, replace=False))]
    assert (predictions[[f"true/{n}" for n in UNSEEN]].to_numpy() >= 0).any(axis=1).all()
    assert draw.available == 15 and metrics["heldout_unseen/n_images"] == 10
    assert "10 cases of the val split, drawn among its 15 rows labelled for an unseen class (seed 7)" in draw.describe()
    assert "drawn among its 15 rows labelled for an unseen class" in summary_table(metrics, UNSEEN, "a", None, draw)
    assert draw.record()["drawn_among"] == "rows labelled for an unseen class"
    with pytest.raises(ValueError, match=r"none of the full manifest's 30 val rows has a label for an unseen class "
                                         r"\(Adenopathy, Bulla, Goiter\)"):  # fmt: skip
        draw_unseen(MeanPixel(3), DevelopmentModule(frame, np.full_like(targets, -1), images), cfg, UNSEEN)


def test_a_perturbed_copy_is_scored_on_internal_external_and_pooled_and_its_change_is_per_scope():
    rng = np.random.default_rng(3)
    sources = np.array(["padchest"] * 12 + ["nih"] * 8)
    targets = (rng.random((20, 3)) < 0.4).astype(float)
    targets[[0, 12], :] = 1
    plain, perturbed = rng.random((20, 3)), rng.random((20, 3))
    suite = dict(labels=UNSEEN, n_boot=0, seed=0, threshold=0.5)
    metrics = scoped_metrics("test_unseen", targets, plain, sources, "padchest", suite)
    metrics.update(scoped_metrics("test_unseen_perturbed", targets, perturbed, sources, "padchest", suite))
    for scope, rows in (("internal", sources == "padchest"), ("external", sources == "nih")):
        assert metrics[f"test_unseen_perturbed/{scope}/mAP"] == pytest.approx(macro_ap(targets[rows], perturbed[rows]))
    assert metrics["test_unseen_perturbed/pooled/mAP"] == pytest.approx(macro_ap(targets, perturbed))
    deltas = perturbation_deltas(metrics)
    for scope, rows in (("/internal", sources == "padchest"), ("/external", sources == "nih"), ("", slice(None))):
        expected = macro_ap(targets[rows], perturbed[rows]) - macro_ap(targets[rows], plain[rows])
        assert deltas[f"test_unseen_perturbed{scope}/delta/mAP"] == pytest.approx(expected)


HAND = {"test_unseen/mAP": 0.30, "test_unseen/internal/mAP": 0.35, "test_unseen/external/mAP": 0.20,
        "test_unseen/pooled/mAP": 0.30, "test_unseen_tta/mAP": 0.32, "test_unseen_tta/internal/mAP": 0.36,
        "test_unseen_tta/external/mAP": 0.25, "test_unseen_tta/pooled/mAP": 0.32,
        "test_unseen_perturbed/mAP": 0.22, "test_unseen_perturbed/internal/mAP": 0.27,
        "test_unseen_perturbed/external/mAP": 0.10, "test_unseen_perturbed/pooled/mAP": 0.22,
        "heldout_unseen/mAP": 0.41, "heldout_unseen/mAP_ci_low": 0.30, "heldout_unseen/mAP_ci_high": 0.52,
        "heldout_unseen/n_images": 200}  # fmt: skip


def test_the_report_and_the_terminal_show_every_analysis_per_scope_with_the_perturbed_change():
    metrics = {**HAND, **perturbation_deltas(HAND)}
    table = analyses_table(metrics, "padchest")
    assert table[2] == "| scope | test | test with TTA | test perturbed | held-out subset | perturbed - test |"
    assert table[4:] == ["| pooled (resampled within source) | 0.300 | 0.320 | 0.220 | 0.410 [0.300, 0.520] | -0.080 |",
                         "| internal (padchest) | 0.350 | 0.360 | 0.270 | n/a | -0.080 |",
                         "| external | 0.200 | 0.250 | 0.100 | n/a | -0.100 |"]  # fmt: skip
    lines = summary_lines({"test/mAP": 0.5}, metrics)
    assert "unseen mAP, test perturbed: pooled 0.220, internal 0.270, external 0.100 (-0.080 vs test)" in lines
    assert "unseen mAP, test with TTA: pooled 0.320, internal 0.360, external 0.250" in lines
    assert "unseen mAP, held-out subset, 200 cases: 0.410 [0.300, 0.520]" in lines


@pytest.fixture(scope="module")
def release(tmp_path_factory):
    return write_release(tmp_path_factory.mktemp("release") / "release", n_train=12, n_task1=4, n_task2=16, size=8)


def test_a_task2_submission_in_the_organisers_spelling_scores_as_sklearn_does(release, tmp_path):
    table = pd.read_csv(release.root / DEV_LABELS["task2"], dtype={"ImageID": str})
    rng = np.random.default_rng(5)
    columns = list(TASK2_COLUMNS.values())  # "goiter", as Eval_Class_Task2.txt spells it
    submission = pd.DataFrame({"ImageID": table["ImageID"], **{c: rng.random(len(table)) for c in columns}})
    path = tmp_path / "task2.csv"
    submission.to_csv(path, index=False)
    args = SimpleNamespace(predictions=path, manifest=release.root / DEV_LABELS["task2"], split="test", task="task2",
                           n_boot=20, data=None)  # fmt: skip
    results = score(args)
    assert results["all"]["mAP"] == pytest.approx(macro_ap(table[columns].to_numpy(), submission[columns].to_numpy()))


def test_a_training_table_scores_only_the_rows_predicted(release, tmp_path):
    """The training table as truth for a held-out subset: the rows the predictions name, and it says how many."""
    ids = release.training["ImageID"].iloc[:10].tolist()
    frame = pd.DataFrame({"ImageID": ids, **{c: 0.5 for c in TASK1_COLUMNS.values()}})
    path = tmp_path / "heldout.csv"
    frame.to_csv(path, index=False)
    truth = read_truth(release.root / "CXRLT_2026_training.csv", list(TASK1_COLUMNS), "test", ids=ids)
    assert truth.frame["image_id"].tolist() == ids
    assert f"10 of its {len(release.training)} rows" in truth.described


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda t: t.loc.__setitem__((2, "goiter"), "maybe"), r"line 4, column 'goiter': 'maybe' is not a label"),
        (lambda t: t.pop("Bulla"), r"line 1: no column for the class\(es\) \['Bulla'\]"),
        (lambda t: t.loc.__setitem__((3, "ImageID"), t.loc[1, "ImageID"]), r"line 5, column 'ImageID': '.*' appears twice"),
        (lambda t: t.rename(columns={"ImageID": "image"}, inplace=True), r"line 1: neither a manifest"),
    ],
)  # fmt: skip
def test_a_bad_organisers_table_is_named_by_file_line_and_column(release, tmp_path, edit, message):
    table = pd.read_csv(release.root / DEV_LABELS["task2"], dtype=str, keep_default_na=False)
    edit(table)
    path = tmp_path / "labels.csv"
    table.to_csv(path, index=False)
    with pytest.raises(TruthError, match=message):
        read_truth(path, list(TASK2_LABELS), "test")


def test_an_evaluation_list_without_labels_is_refused_as_truth(release):
    with pytest.raises(TruthError, match="class columns have no names"):
        read_truth(release.root / TEST_LISTS["task1"], list(TASK1_COLUMNS), "test")


def test_the_internal_source_is_a_data_configs_definition_never_the_larger_centre():
    many_nih = np.array(["nih"] * 5 + ["padchest"])
    assert internal_source(many_nih, None) == "padchest"  # configs/data/cxrlt2026.yaml names it
    assert internal_source(np.array(["centre_b", "centre_a"]), None) == "centre_a"  # configs/data/synthetic.yaml
    assert internal_source(np.array(["x", "y"]), None) is None  # no config names either
    assert internal_source(many_nih, "synthetic") is None  # DATA= names centre_a, which these rows lack
