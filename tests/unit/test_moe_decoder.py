"""head=moe_decoder (an ML-Decoder whose output layer becomes experts) and phase 2's partly trained backbone
(callbacks.two_phase.train_backbone), the two parts of overview Table 2 row C's second phase."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from training.errors import UserError
from training.models.heads.ml_decoder import MLDecoderHead
from training.models.heads.moe_decoder import MoEDecoderHead
from training.models.two_phase import freeze_backbone_except


def _head(**kwargs) -> MoEDecoderHead:
    torch.manual_seed(0)
    return MoEDecoderHead(in_features=8, num_labels=5, dim=16, heads=2, dropout=0.0, **kwargs).eval()


def test_phase_one_is_the_ml_decoder_it_extends():
    """Reference: an MLDecoderHead loaded with the same decoder weights gives the same logits."""
    head = _head(groups=2)
    reference = MLDecoderHead(in_features=8, num_labels=5, dim=16, heads=2, dropout=0.0, groups=2).eval()
    reference.load_state_dict({k: v for k, v in head.state_dict().items() if k in reference.state_dict()})
    features = torch.randn(3, 8, 2, 2)
    torch.testing.assert_close(head(features), reference(features))


def test_at_the_switch_noiseless_experts_and_a_uniform_gate_reproduce_phase_one():
    """K identical experts mixed with weights 1/K give the single layer's logits; the balance term is then 0."""
    head = _head(noise=0.0, experts=3)
    features = torch.randn(4, 8, 3, 3)
    before = head(features)
    head.start_phase_two()
    assert head.in_phase_two
    torch.testing.assert_close(head(features), before)
    targets, mask = torch.randint(0, 2, (4, 5)).float(), torch.ones(4, 5, dtype=torch.bool)
    bce = lambda logits, t, m: F.binary_cross_entropy_with_logits(logits, t)  # noqa: E731
    torch.testing.assert_close(head.training_loss(features, targets, mask, bce), bce(before, targets, mask))


def test_the_phase_travels_with_the_state_dict():
    trained = _head()
    trained.start_phase_two()
    fresh = _head()
    fresh.load_state_dict(trained.state_dict())
    assert fresh.in_phase_two
    features = torch.randn(2, 8, 2, 2)
    torch.testing.assert_close(fresh(features), trained(features))


def _toy_backbone() -> nn.Module:
    stage = lambda: nn.Sequential(nn.Conv2d(2, 2, 1), nn.BatchNorm2d(2), nn.Dropout(0.5))  # noqa: E731
    return nn.ModuleDict({"stages": nn.Sequential(stage(), stage()), "head": nn.ModuleDict({"norm": nn.LayerNorm(2)})})


def test_only_the_named_prefixes_keep_training_and_the_rest_is_in_eval_mode():
    backbone = _toy_backbone().train()
    freeze_backbone_except(backbone, ["stages.1", "head.norm"])
    trainable = sorted(name for name, p in backbone.named_parameters() if p.requires_grad)
    assert trainable == ["head.norm.bias", "head.norm.weight", "stages.1.0.bias", "stages.1.0.weight",
                         "stages.1.1.bias", "stages.1.1.weight"]  # fmt: skip
    assert not backbone["stages"][0][1].training  # a frozen BatchNorm keeps its statistics
    assert backbone["stages"][1][1].training and backbone["stages"][1][2].training  # trained stage: its dropout too


def test_a_prefix_matching_nothing_is_refused_by_name():
    with pytest.raises(UserError, match="stages.3"):
        freeze_backbone_except(_toy_backbone(), ["stages.3"])
