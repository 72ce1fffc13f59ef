"""Task 2's training rule (docs/rules.md §11) and Normal vs an all-zero row (§12), on hand-built manifests."""

from __future__ import annotations

from types import SimpleNamespace

import cv2
import numpy as np
import pandas as pd
import pytest
import torch
import torch.nn.functional as F

from training.data.datamodule import CXRDataModule
from training.data.normal_label import mask_unlabelled_normal
from training.data.sources import ManifestSource
from training.losses.bce import BCELoss
from training.zeroshot.leak_guard import GUARD_VERSION, SeenOnlySource
from training.zeroshot.training_rule import TrainingRuleError, check_parent_run, enforce_training_rule

SEEN = ["Cardiomegaly", "Normal"]
UNSEEN = ["Bulla", "Scoliosis"]
# image id, split, Cardiomegaly, Normal, Bulla, Scoliosis ("" = not labelled)
ROWS = [
    ("t0", "train", 1, 0, 0, 0), ("t1", "train", 0, 0, 1, 0), ("t2", "train", 0, 0, 1, 1), ("t3", "train", 0, 1, 0, 0),
    ("t4", "train", 0, 0, 0, 0),
    ("v0", "val", 0, 0, 0, 1), ("v1", "val", 0, 1, 0, 0), ("v2", "val", 1, 0, 0, 0), ("v3", "val", 1, 0, "", 0),
    ("s0", "test", 0, 0, 1, 0), ("s1", "test", 0, 0, 0, 1), ("s2", "test", 0, 1, 0, 0), ("s3", "test", 1, 0, 0, 0),
]  # fmt: skip


@pytest.fixture
def manifest(tmp_path):
    (tmp_path / "images").mkdir()
    rows = []
    for image_id, split, *labels in ROWS:
        cv2.imwrite(str(tmp_path / "images" / f"{image_id}.png"), np.full((8, 8), 100, np.uint8))
        rows.append({"image_id": image_id, "path": f"images/{image_id}.png", "split": split,
                     "patient_id": f"p-{image_id}", **dict(zip(SEEN + UNSEEN, labels, strict=True))})  # fmt: skip
    path = tmp_path / "manifest.csv"
    pd.DataFrame(rows).to_csv(path, index=False)
    return path


def _guarded(manifest, tmp_path):
    return SeenOnlySource(ManifestSource(str(manifest), root=str(tmp_path)), UNSEEN, tmp_path / "guard")


def _datamodule(source):
    datamodule = CXRDataModule(source, SEEN, image_size=8, batch_size=4, preload=False, cache=False)
    datamodule.setup("fit")
    return datamodule


def test_guard_removes_every_train_and_val_image_of_an_unseen_finding_and_keeps_test(manifest, tmp_path):
    source = _guarded(manifest, tmp_path)
    guarded = pd.read_csv(source.prepare(), dtype=str, keep_default_na=False)
    # t1 (Bulla), t2 (Bulla + Scoliosis), v0 (Scoliosis) leave; v3's empty Bulla is not a positive; test stays whole.
    assert list(guarded["image_id"]) == ["t0", "t3", "t4", "v1", "v2", "v3", "s0", "s1", "s2", "s3"]
    assert not set(UNSEEN) & set(guarded.columns)
    tags = source.run_tags
    assert tags["cxrlt.training_rule.excluded.train"] == "2" and tags["cxrlt.training_rule.excluded.val"] == "1"
    assert tags["cxrlt.training_rule.excluded.by_label"] == "Bulla:2,Scoliosis:2"  # t1, t2 / t2, v0
    assert tags["cxrlt.training_rule.test_kept"] == "4" and tags["cxrlt.training_rule.checked"] == "true"
    assert source.excluded.test_unseen_positive == 2  # s0, s1: what the unseen report scores
    datamodule = _datamodule(source)
    enforce_training_rule(UNSEEN, datamodule, None, client=lambda: pytest.fail("no parent run: no client needed"))
    assert len(datamodule.datasets["train"]) == 3 and len(datamodule.datasets["test"]) == 4


def test_a_release_whose_training_rows_carry_no_unseen_label_is_not_tagged_as_checked(manifest, tmp_path, caplog):
    table = pd.read_csv(manifest, dtype=str, keep_default_na=False)
    table.loc[table["split"] != "test", UNSEEN] = ""  # the columns are there, labelled on the test rows only
    table.to_csv(manifest, index=False)
    source = _guarded(manifest, tmp_path)
    source.prepare()
    tags = source.run_tags
    assert tags["cxrlt.training_rule.checked"] == "false (no unseen label on the training rows: nothing to check)"
    assert tags["cxrlt.training_rule.excluded.train"] == "0"
    assert tags["cxrlt.leak_guard.dropped_columns"] == "Bulla,Scoliosis"
    assert "no train or val row of" in caplog.text and "nothing could be checked" in caplog.text
    # One labelled training cell, even a negative, gives the rule something to read.
    table.loc[table["image_id"] == "t4", "Bulla"] = "0"
    table.to_csv(manifest, index=False)
    relabelled = SeenOnlySource(ManifestSource(str(manifest), root=str(tmp_path)), UNSEEN, tmp_path / "guard2")
    relabelled.prepare()
    assert relabelled.run_tags["cxrlt.training_rule.checked"] == "true"
    # A two-stage run may start from a parent trained under the same guard on such a release.
    parent = SimpleNamespace(get_run=lambda run_id: SimpleNamespace(data=SimpleNamespace(tags=tags)))
    assert check_parent_run(parent, "abc123", UNSEEN) is None


def test_a_manifest_that_still_holds_unseen_images_fails_before_training(manifest, tmp_path):
    source = _guarded(manifest, tmp_path)
    # A stale copy in the guard's place, as the column-only guard wrote it: unseen columns gone, images kept.
    full = pd.read_csv(manifest, dtype=str, keep_default_na=False)
    source.prepare()
    (stale,) = (tmp_path / "guard").glob(f"*-{GUARD_VERSION}.csv")
    full.drop(columns=UNSEEN).to_csv(stale, index=False)
    datamodule = _datamodule(source)  # the manifest itself is valid: only the rule check can refuse it
    with pytest.raises(TrainingRuleError) as error:
        enforce_training_rule(UNSEEN, datamodule, None, client=lambda: None)
    message = str(error.value)
    assert "train: 2 images (Bulla 2, Scoliosis 1; e.g. t1, t2)" in message
    assert "val: 1 images (Bulla 0, Scoliosis 1; e.g. v0)" in message and "docs/rules.md §11" in message


def test_a_parent_run_that_saw_unseen_images_is_refused():
    def client(tags):
        return SimpleNamespace(get_run=lambda run_id: SimpleNamespace(data=SimpleNamespace(tags=tags)))

    with pytest.raises(TrainingRuleError, match=r"parent run abc123 \(task 'task1'\)"):
        check_parent_run(client({"task": "task1"}), "abc123", UNSEEN)
    partial = {"task": "task2", "cxrlt.training_rule.checked": "true", "cxrlt.leak_guard.unseen": "Bulla"}
    with pytest.raises(TrainingRuleError, match="Bulla, Scoliosis"):
        check_parent_run(client(partial), "def456", UNSEEN)  # trained without Scoliosis's images only
    ruled = {**partial, "cxrlt.leak_guard.unseen": "Bulla,Scoliosis"}
    assert check_parent_run(client(ruled), "fed789", UNSEEN) is None


# Normal vs an all-zero row (docs/rules.md §12)


def test_an_all_zero_train_row_has_no_normal_target_and_adds_nothing_to_the_loss(manifest, tmp_path):
    datamodule = _datamodule(_guarded(manifest, tmp_path))
    train = datamodule.datasets["train"].targets.numpy()  # t0 (Cardiomegaly), t3 (Normal), t4 (all zero)
    np.testing.assert_array_equal(train, [[1, 0], [0, 1], [0, -1]])
    val = datamodule.datasets["val"].targets.numpy()  # scored as given: v1..v3 have a positive anyway
    np.testing.assert_array_equal(val, [[0, 1], [1, 0], [1, 0]])
    targets = torch.as_tensor(train)
    logits = torch.tensor([[2.0, -1.0], [0.5, 1.5], [-3.0, 0.7]])
    loss = BCELoss()(logits, targets.clamp_min(0), targets >= 0)
    sp, x = F.softplus, logits
    # Five known entries; t4's Normal logit (0.7) is absent, its Cardiomegaly 0 is a negative.
    expected = (sp(-x[0, 0]) + sp(x[0, 1]) + sp(x[1, 0]) + sp(-x[1, 1]) + sp(x[2, 0])) / 5
    torch.testing.assert_close(loss, expected)


def test_mask_unlabelled_normal_touches_only_normal_on_rows_without_a_positive():
    targets = np.array([[0, 0, 0], [0, 1, 0], [-1, 0, 0], [1, 0, -1]], dtype=np.float32)
    out = mask_unlabelled_normal(targets, ["A", "Normal", "B"])
    np.testing.assert_array_equal(out, [[0, -1, 0], [0, 1, 0], [-1, -1, 0], [1, 0, -1]])
    assert mask_unlabelled_normal(targets, ["A", "C", "B"]) is targets  # no Normal label: nothing to mask
