"""The held-out subset of the training split is scored on the labels as released, not on the training targets
(docs/rules.md §10, §12): a row with no finding and a released Normal of 0 is a Normal negative there, though
training masks that Normal."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
import torch
from omegaconf import OmegaConf

from evaluation.heldout import evaluate_heldout, predictions_frame
from evaluation.suite import compute_suite
from training.data.datamodule import CXRDataModule
from training.data.sources import ManifestSource

LABELS = ["Cardiomegaly", "Pleural Effusion", "Normal"]
UNLABELLED = 5  # train rows written with no finding and Normal 0: unlabelled rows of a report-mined release


class Brightness(torch.nn.Module):
    """Logits from mean brightness, one scale per class: a fixed, image-dependent score."""

    def __init__(self):
        super().__init__()
        self.labels = list(LABELS)
        self.scale = torch.nn.Parameter(torch.tensor([3.0, -2.0, 4.0]))

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return (images.mean(dim=(1, 2, 3)) - 0.5)[:, None] * self.scale


def _module(make_manifest) -> tuple[CXRDataModule, pd.DataFrame]:
    """90 images; the first UNLABELLED train rows carry no label at all (every column 0)."""
    path = make_manifest(n=90, size=24, labels=LABELS)
    table = pd.read_csv(path)
    unlabelled = table.index[table["split"] == "train"][:UNLABELLED]
    table.loc[unlabelled, LABELS] = 0
    table.to_csv(path, index=False)
    module = CXRDataModule(ManifestSource(str(path)), LABELS, image_size=24, batch_size=8)
    module.setup()
    return module, table


def _cfg():
    spec = {"enabled": True, "split": "train", "size": 300, "seed": 2026}  # more than the split: all of it
    evaluation = {"n_boot": 40, "seed": 0, "threshold": 0.5, "heldout": spec}
    return OmegaConf.create({"evaluation": evaluation})


def test_train_rows_are_scored_on_the_released_normal_not_the_masked_target(make_manifest):
    module, table = _module(make_manifest)
    heldout = evaluate_heldout(Brightness(), module, _cfg(), SimpleNamespace(labels=LABELS, groups={}))
    ids = list(heldout.draw.image_ids)
    released = table.set_index("image_id").loc[ids, LABELS].to_numpy()  # the manifest's values, row by row
    masked = module.datasets["train"].targets.numpy()[heldout.draw.rows]
    normal = LABELS.index("Normal")
    assert (masked[:, normal] == -1).sum() == UNLABELLED  # training does mask them ...
    assert ((released[:, normal] == 0) & (released.sum(axis=1) == 0)).sum() == UNLABELLED  # ... the release does not

    expected = compute_suite(released, heldout.probs, LABELS, n_boot=40, seed=0).metrics
    as_trained = compute_suite(masked, heldout.probs, LABELS, n_boot=40, seed=0).metrics
    assert heldout.metrics["heldout/mAP"] == pytest.approx(expected["mAP"])
    assert heldout.metrics["heldout/mAP_ci_low"] == pytest.approx(expected["mAP_ci_low"])
    assert heldout.result.per_class["ap"][normal] == pytest.approx(expected["ap/Normal"])
    assert expected["ap/Normal"] != pytest.approx(as_trained["ap/Normal"])  # the case tells the two apart

    assert heldout.draw.released_differs == UNLABELLED
    assert (f"scored on the labels as released: {UNLABELLED} of them have no finding and keep their released "
            "Normal, which training masks") in heldout.draw.describe()  # fmt: skip
    assert heldout.draw.record()["released_labels_differ"] == UNLABELLED
    frame = predictions_frame(heldout, module, LABELS)
    np.testing.assert_array_equal(frame[[f"true/{c}" for c in LABELS]].to_numpy(), released)


def test_a_split_training_does_not_mask_says_nothing_of_it(make_manifest):
    module, _ = _module(make_manifest)
    cfg = _cfg()
    cfg.evaluation.heldout.split = "val"
    heldout = evaluate_heldout(Brightness(), module, cfg, SimpleNamespace(labels=LABELS, groups={}))
    assert heldout.draw.released_differs == 0 and "labels as released" not in heldout.draw.describe()
    np.testing.assert_array_equal(module.released_targets("val"), module.datasets["val"].targets.numpy())
