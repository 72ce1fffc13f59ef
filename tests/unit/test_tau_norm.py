"""tau-normalisation of the classifier (evaluation/tau_norm.py): hand-computed weights and logits, tau = 0 as the
identity, the ranking metrics' indifference to tau, the tuned tau on a set built so that it is known, and the one-line
refusal of a head it cannot normalise."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from hydra import compose, initialize_config_dir
from torch import nn

from evaluation.tau_norm import TauNormaliser, normalise_classifier, normalised_weight
from tests.conftest import PROJECT_ROOT
from training.errors import UserError
from training.models.heads.csra import CSRAHead
from training.models.tau_norm_check import TauNormRequirements
from training.pipeline import config_callbacks

WEIGHT = torch.tensor([[3.0, 4.0], [0.0, 2.0]])  # row norms 5 and 2


def test_normalised_weights_and_logits_by_hand():
    assert torch.allclose(normalised_weight(WEIGHT, 1.0), torch.tensor([[0.6, 0.8], [0.0, 1.0]]))
    half = torch.tensor([[3 / math.sqrt(5), 4 / math.sqrt(5)], [0.0, 2 / math.sqrt(2)]])
    assert torch.allclose(normalised_weight(WEIGHT, 0.5), half)
    assert torch.equal(normalised_weight(WEIGHT, 0.0), WEIGHT)  # tau = 0: the trained classifier
    head = nn.Linear(2, 2)
    with torch.no_grad():
        head.weight.copy_(normalised_weight(WEIGHT, 1.0))
        head.bias.copy_(torch.tensor([0.5, -1.0]))
    # f = (1, 1): 0.6 + 0.8 + 0.5 = 1.9 and 0 + 1 - 1 = 0 (the bias is kept)
    assert torch.allclose(head(torch.tensor([[1.0, 1.0]])), torch.tensor([[1.9, 0.0]]))
    assert torch.equal(normalised_weight(torch.zeros(1, 3), 1.0), torch.zeros(1, 3))  # no 0/0


class FeatureModel(nn.Module):
    """Pooled features are the images themselves: what a backbone hands a linear head."""

    def __init__(self, weight, bias, head=None):
        super().__init__()
        self.head = head or nn.Linear(weight.shape[1], weight.shape[0])
        if head is None:
            with torch.no_grad():
                self.head.weight.copy_(weight)
                self.head.bias.copy_(bias)
        self.labels = [f"class{c}" for c in range(weight.shape[0])]

    def features(self, images):
        return images


def _data(features, targets):
    batches = [{"image": torch.as_tensor(features[i : i + 3], dtype=torch.float32)} for i in range(0, len(features), 3)]
    val = SimpleNamespace(targets=torch.as_tensor(targets, dtype=torch.float32))
    return SimpleNamespace(eval_dataloader=lambda split: batches, datasets={"val": val})


# Class 0: weight (10, 0), bias -1. Its negatives score w.f = 3 (logit 2: a false positive at tau = 0), its positives
# 20. Scaled by 10^-tau: the negatives fall below the 0.5 threshold once 3 x 10^-tau < 1 (tau > 0.477) and the positives
# stay above while 20 x 10^-tau >= 1 (tau <= 1.30), so its F1 is 1 from tau = 0.5 to 1.3 and 2/3 below (3 TP, 3 FP). Class 1 (unit
# weight, tau changes nothing) is separated at every tau. The smallest best tau on the 0.1 grid: 0.5.
FEATURES = np.array([[2.0, 1.0], [2.0, -1.0], [0.3, 1.0], [0.3, -1.0], [2.0, -1.0], [0.3, 1.0]])
TARGETS = np.array([[1, 1], [1, 0], [0, 1], [0, 0], [1, 0], [0, 1]])
CLASSIFIER = (torch.tensor([[10.0, 0.0], [0.0, 1.0]]), torch.tensor([-1.0, 0.0]))


def test_tau_tuned_by_f1_is_the_hand_computed_one_and_goes_into_the_head():
    model = FeatureModel(*CLASSIFIER)
    node = {"name": "tau_norm", "_target_": "evaluation.tau_norm.TauNormaliser", "metric": "val/mF1"}
    result = normalise_classifier(model, _data(FEATURES, TARGETS), node)
    assert result.tau == 0.5
    assert result.values[0] == pytest.approx((2 / 3 + 1.0) / 2) and result.values[result.chosen] == pytest.approx(1.0)
    assert torch.allclose(model.head.weight, torch.tensor([[10.0 / math.sqrt(10), 0.0], [0.0, 1.0]]))
    assert torch.equal(model.head.bias, CLASSIFIER[1])
    assert result.logged()["tau_norm/tau"] == 0.5


def test_ranking_metrics_are_the_same_for_every_tau_so_the_classifier_stays():
    model = FeatureModel(*CLASSIFIER)
    node = {"_target_": "evaluation.tau_norm.TauNormaliser", "metric": "val/mAP"}
    result = normalise_classifier(model, _data(FEATURES, TARGETS), node)
    assert np.allclose(result.values, result.values[0])  # per-class rankings do not depend on tau
    assert result.tau == 0.0 and torch.equal(model.head.weight, CLASSIFIER[0])


def test_no_postprocess_leaves_the_model_alone():
    model = FeatureModel(*CLASSIFIER)
    assert normalise_classifier(model, None, {"name": "none"}) is None
    assert torch.equal(model.head.weight, CLASSIFIER[0])


def test_grid_and_metric_checks():
    assert TauNormaliser().taus.tolist() == pytest.approx([round(0.1 * i, 1) for i in range(21)])
    with pytest.raises(ValueError, match="val/proxy_ood_mAP"):
        TauNormaliser(metric="val/proxy_ood_mAP")


def test_a_non_linear_head_is_refused_in_one_line_before_training():
    model = FeatureModel(*CLASSIFIER, head=CSRAHead(in_features=2, num_labels=2))
    with pytest.raises(UserError) as refused:
        TauNormRequirements("val/mAP").setup(None, model, "fit")
    assert str(refused.value) == "postprocess=tau_norm needs a linear head (head=linear); this model's head is CSRAHead"
    with pytest.raises(UserError, match="not a validation suite metric"):
        TauNormRequirements("val/loss").setup(None, FeatureModel(*CLASSIFIER), "fit")
    TauNormRequirements("val/mF1").setup(None, FeatureModel(*CLASSIFIER), "fit")  # a linear head passes


def test_the_tau_norm_config_tunes_by_the_task_metric_and_adds_its_check():
    with initialize_config_dir(str(PROJECT_ROOT / "configs"), version_base=None):
        cfg = compose("train", overrides=["postprocess=tau_norm"])
        plain = compose("train")
    assert cfg.postprocess.metric == cfg.checkpoint.monitor == "val/mAP"
    assert [type(c) for c in config_callbacks(cfg) if isinstance(c, TauNormRequirements)] == [TauNormRequirements]
    assert not any(isinstance(c, TauNormRequirements) for c in config_callbacks(plain))
    assert plain.postprocess.name == "none"
