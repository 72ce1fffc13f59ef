"""Held-out stability subsets (evaluation/heldout.py, docs/rules.md §10): which cases are drawn, that they are
judged un-augmented with the test protocol, and that a run says plainly when the model trained on them."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
import torch
from omegaconf import DictConfig, OmegaConf

from apps.benchmarks.card import DEFAULT_CARD, load_card
from evaluation.heldout import TRAINED_ON_TAG, draw_rows, evaluate_heldout
from evaluation.report import TRAINED_ON_CAVEAT, ranking_chain
from evaluation.suite import compute_suite
from evaluation.test_phase import run_test_phase
from training.data.datamodule import CXRDataModule
from training.data.sources import ManifestSource

ROOT = Path(__file__).resolve().parents[2]
LABELS = ["Cardiomegaly", "Pleural Effusion", "Support Devices"]
FLIP = [{"_target_": "albumentations.HorizontalFlip", "p": 1.0}]


class LeftRight(torch.nn.Module):
    """Logits from left-half minus right-half brightness: a horizontal flip negates them, so an augmented
    prediction cannot pass for an un-augmented one."""

    def __init__(self):
        super().__init__()
        self.labels = list(LABELS)
        self.groups = {"common": [0, 1], "rare": [2]}
        self.train_counts = torch.tensor([5.0, 4.0, 1.0])
        self.train_size = 20
        self.scale = torch.nn.Parameter(torch.tensor([4.0, -3.0, 2.0]))

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        half = images.shape[-1] // 2
        contrast = images[..., :half].mean(dim=(1, 2, 3)) - images[..., half:].mean(dim=(1, 2, 3))
        return contrast[:, None] * self.scale


def _cfg(**heldout) -> DictConfig:
    spec = {"enabled": True, "split": "train", "size": 300, "seed": 2026, **heldout}
    evaluation = {"n_boot": 50, "seed": 0, "threshold": 0.5, "per_source": False, "per_class_metrics": True,
                  "plots": False, "perturbation": {"enabled": False}, "postprocess": [], "heldout": spec}  # fmt: skip
    return OmegaConf.create({"evaluation": evaluation, "tta": {"enabled": False}})


def _datamodule(manifest: Path, augment=None) -> CXRDataModule:
    module = CXRDataModule(ManifestSource(str(manifest)), LABELS, image_size=24, batch_size=8, train_augment=augment)
    module.setup()
    return module


# --- the draw ----------------------------------------------------------------------------------------------------


def test_the_draw_is_the_documented_rng_choice_over_sorted_ids():
    ids = [f"img{i:03d}" for i in range(50)][::-1]  # manifest order reversed: the draw must not care
    rows = draw_rows(ids, 7, seed=2026)
    expected = sorted(f"img{i:03d}" for i in np.random.default_rng(2026).choice(50, 7, replace=False))
    assert [ids[r] for r in rows] == expected


def test_the_same_images_in_any_row_order_give_the_same_cases():
    ids = [f"case-{i}" for i in range(400)]
    shuffled = list(np.random.default_rng(1).permutation(ids))
    a, b = draw_rows(ids, 300, seed=2026), draw_rows(shuffled, 300, seed=2026)
    assert [ids[r] for r in a] == [shuffled[r] for r in b]
    assert len(set(a.tolist())) == 300  # without replacement
    assert {ids[r] for r in a} != {ids[r] for r in draw_rows(ids, 300, seed=2027)}


def test_a_split_smaller_than_the_size_is_used_whole():
    ids = ["c", "a", "b"]
    assert [ids[r] for r in draw_rows(ids, 300, seed=0)] == ["a", "b", "c"]


def test_bad_sizes_and_repeated_ids_are_refused():
    with pytest.raises(ValueError, match="at least 1"):
        draw_rows(["a", "b"], 0, seed=0)
    with pytest.raises(ValueError, match="unique image ids"):
        draw_rows(["a", "b", "a"], 2, seed=0)


# --- the evaluation ----------------------------------------------------------------------------------------------


def _test_set(model: LeftRight) -> SimpleNamespace:
    """The part of an ``Evaluation`` the held-out subset reads: labels and head-to-tail groups."""
    return SimpleNamespace(labels=LABELS, groups=model.groups)


def test_a_training_subset_is_judged_unaugmented_with_the_test_protocol(make_manifest):
    manifest = make_manifest(n=90, size=24, labels=LABELS)
    augmented, plain = _datamodule(manifest, FLIP), _datamodule(manifest)
    model = LeftRight()
    heldout = evaluate_heldout(model, augmented, _cfg(size=12), _test_set(model))

    # The reference: the same rows through the plain (never augmented) loader of an identical module.
    logits = torch.cat([model(batch["image"]) for batch in plain.eval_dataloader("train")])
    all_probs = torch.sigmoid(logits).detach().numpy()
    rows = heldout.draw.rows
    assert len(rows) == 12 and heldout.draw.image_ids == tuple(plain.split_frame("train")["image_id"].iloc[rows])
    np.testing.assert_allclose(heldout.probs, all_probs[rows], atol=1e-6)
    targets = plain.datasets["train"].targets.numpy()[rows]
    expected = compute_suite(targets, all_probs[rows], LABELS, n_boot=50, seed=0, threshold=0.5,
                             class_groups=model.groups).metrics  # fmt: skip
    for name in ranking_chain():
        for key in (name, f"{name}_ci_low", f"{name}_ci_high"):
            if np.isfinite(expected[key]):
                assert heldout.metrics[f"heldout/{key}"] == pytest.approx(expected[key]), key
    assert heldout.metrics["heldout/group/common/mAP"] == pytest.approx(expected["group/common/mAP"])
    assert heldout.metrics["heldout/n_images"] == 12 and heldout.metrics["heldout/trained_on"] == 1
    assert heldout.draw.trained_on and heldout.draw.caveat == TRAINED_ON_CAVEAT
    assert not any(key.startswith("heldout/ap/") or "_valthr" in key for key in heldout.metrics)  # as test_tta


def test_a_short_validation_split_is_used_whole_and_the_selection_caveat_given(make_manifest):
    module = _datamodule(make_manifest(n=30, size=24, labels=LABELS))  # 10 val images, fewer than asked
    model = LeftRight()
    heldout = evaluate_heldout(model, module, _cfg(split="val", size=200), _test_set(model))
    assert len(heldout.draw.image_ids) == 10 and heldout.metrics["heldout/trained_on"] == 0
    assert heldout.draw.image_ids == tuple(sorted(module.split_frame("val")["image_id"]))
    assert "only 10 images, fewer than the 200 asked for: all used" in heldout.draw.describe()
    assert "checkpoint was selected" in heldout.draw.caveat


def test_a_subset_mixing_centres_is_also_resampled_within_each(make_manifest):
    manifest = make_manifest(n=90, size=24, labels=LABELS)
    table = pd.read_csv(manifest)
    table["source"] = np.where(np.arange(len(table)) % 2, "centre_b", "centre_a")
    table.to_csv(manifest, index=False)
    module, model = _datamodule(manifest), LeftRight()
    heldout = evaluate_heldout(model, module, _cfg(size=20), _test_set(model))
    centres = module.split_frame("train")["source"].to_numpy()[heldout.draw.rows]
    targets = module.datasets["train"].targets.numpy()[heldout.draw.rows]
    for centre in ("centre_a", "centre_b"):
        own = centres == centre
        expected = compute_suite(targets[own], heldout.probs[own], LABELS, n_boot=50, seed=0).metrics
        assert heldout.metrics[f"heldout/source/{centre}/mAP"] == pytest.approx(expected["mAP"])
        assert heldout.metrics[f"heldout/source/{centre}/mAP_ci_low"] == pytest.approx(expected["mAP_ci_low"])


def test_the_subset_logs_the_prevalence_floor_the_card_sets_beside_it(make_manifest):
    module, model = _datamodule(make_manifest(n=90, size=24, labels=LABELS)), LeftRight()
    heldout = evaluate_heldout(model, module, _cfg(size=20), _test_set(model))
    truth = pd.read_csv(module.manifest.source_file).set_index("image_id").loc[list(heldout.draw.image_ids), LABELS]
    prevalence = [truth[c].mean() for c in LABELS if truth[c].any()]  # a constant score's AP is the prevalence
    assert heldout.metrics["heldout/prevalence_baseline_mAP"] == pytest.approx(np.mean(prevalence))
    card_floors = {key for row in load_card(DEFAULT_CARD).run_metrics if row.key.startswith("heldout/")
                   for key in row.floor.values()}  # fmt: skip
    assert card_floors and card_floors <= set(heldout.metrics)


def test_switched_off_nothing_is_drawn(make_manifest):
    module = _datamodule(make_manifest(n=30, size=24, labels=LABELS))
    assert evaluate_heldout(LeftRight(), module, _cfg(enabled=False), None) is None


class Sink:
    def __init__(self):
        self.metrics, self.tags, self.artifacts = {}, {}, {}

    def log_metrics(self, metrics):
        self.metrics.update(metrics)

    def log_artifacts(self, folder, artifact_path=None):
        for path in Path(folder).rglob("*"):
            if path.is_file():
                self.artifacts[f"{artifact_path}/{path.relative_to(folder).as_posix()}"] = path.read_bytes()

    def log_artifact(self, path, artifact_path=None):
        self.artifacts[f"{artifact_path}/{Path(path).name}"] = Path(path).read_bytes()

    def set_tags(self, tags):
        self.tags.update(tags)


def test_the_test_phase_logs_reports_and_tags_a_trained_on_subset(make_manifest):
    module = _datamodule(make_manifest(n=90, size=24, labels=LABELS))
    sink = Sink()
    evaluation, _ = run_test_phase(LeftRight(), module, _cfg(size=15), sink)

    record = json.loads(sink.artifacts["evaluation/heldout.json"])
    assert record["split"] == "train" and record["trained_on"] is True and record["drawn"] == 15
    assert record["image_ids"] == list(evaluation.sets["heldout"].draw.image_ids)
    predictions = pd.read_csv(pd.io.common.BytesIO(sink.artifacts["predictions/heldout.csv"]))
    assert list(predictions["image_id"]) == record["image_ids"]
    assert sink.tags[TRAINED_ON_TAG] == "true"
    assert sink.metrics["heldout/mAP"] == evaluation.sets["heldout"].result.metrics["mAP"]
    report = sink.artifacts["evaluation/report.md"].decode()
    assert "## Held-out stability subset" in report and f"**Caveat: {TRAINED_ON_CAVEAT}.**" in report
    header = next(line for line in report.splitlines() if line.startswith("| rank | metric |"))
    assert header.rstrip(" |").endswith("heldout")  # one more column of the headline table


def test_configs_default_to_task1_and_take_a_task_override():
    node = OmegaConf.load(ROOT / "configs/evaluation/default.yaml")
    task1 = OmegaConf.create({"task": {"name": "task1"}, "evaluation": node})
    assert (task1.evaluation.heldout.split, task1.evaluation.heldout.size) == ("train", 300)
    task2 = OmegaConf.create({"task": {"name": "task2", "heldout": {"split": "val", "size": 200}}, "evaluation": node})
    assert (task2.evaluation.heldout.split, task2.evaluation.heldout.size) == ("val", 200)
    assert task1.evaluation.heldout.seed == task2.evaluation.heldout.seed == 2026
