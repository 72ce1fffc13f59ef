"""loss=db_winner2026 (training/losses/db.py, ClassMarginDBLoss): hand-computed values on two classes, and the
winner's formula restated independently in NumPy at the settings of its run (GitHub hieuphamha19/CXR_LT)."""

import math

import numpy as np
import pytest
import torch
from hydra.utils import instantiate
from omegaconf import OmegaConf

from tests.conftest import PROJECT_ROOT
from training.losses.db import ClassMarginDBLoss


def softplus(x: float) -> float:
    return math.log1p(math.exp(x))


def two_classes(**kwargs) -> ClassMarginDBLoss:
    """Counts (1, 2) with beta 0.5: raw weights 0.5 / 0.5 = 1 and 0.5 / 0.75 = 2/3, mean 1 -> (1.2, 0.8); their
    inverses (0.833, 1.25) rescale to (0, 1), so the margins are (0, 0.2): the more frequent class gets it all."""
    loss = ClassMarginDBLoss(class_beta=0.5, **kwargs)
    loss.set_class_counts(torch.tensor([1.0, 2.0]), 4)
    return loss


def test_weights_and_margins_by_hand():
    loss = two_classes()
    torch.testing.assert_close(loss.class_weights(), torch.tensor([1.2, 0.8]).sqrt())
    torch.testing.assert_close(loss.positive_margins(), torch.tensor([0.0, 0.2]))


def test_positives_by_hand():
    """sqrt(1.2) * softplus(-0.3) and sqrt(0.8) * softplus(-(0.5 - 0.2)), averaged: 0.607266 and 0.495830."""
    value = two_classes()(torch.tensor([[0.3, 0.5]]), torch.tensor([[1.0, 1.0]])).item()
    expected = (math.sqrt(1.2) * softplus(-0.3) + math.sqrt(0.8) * softplus(-0.3)) / 2
    assert value == pytest.approx(expected, rel=1e-5)
    assert value == pytest.approx(0.551548, abs=1e-5)


def test_negatives_with_a_scale_and_a_margin_by_hand():
    """Negatives: weight * softplus(2 (z + 0.1)) / 2; no class margin. 0.641438 and 0.654400, averaged."""
    loss = two_classes(neg_scale=2.0, neg_margin=0.1)
    value = loss(torch.tensor([[0.3, 0.5]]), torch.tensor([[0.0, 0.0]])).item()
    expected = (math.sqrt(1.2) * softplus(0.8) / 2 + math.sqrt(0.8) * softplus(1.2) / 2) / 2
    assert value == pytest.approx(expected, rel=1e-5)
    assert value == pytest.approx(0.647919, abs=1e-5)


def test_unlabelled_entries_count_for_nothing():
    loss = two_classes()
    logits, targets = torch.tensor([[0.3, 0.5]]), torch.tensor([[1.0, 1.0]])
    only_first = loss(logits, targets, torch.tensor([[True, False]])).item()
    assert only_first == pytest.approx(math.sqrt(1.2) * softplus(-0.3), rel=1e-5)


def winners_formula(counts, logits, targets, beta=0.9999, power=0.5, max_margin=0.2, scale=1.0):
    """The winner's loss at its run's settings (negative scale 1, negative margin 0), from its description."""
    n = np.maximum(np.asarray(counts, dtype=np.float64), 1.0)
    weights = (1 - beta) / (1 - beta**n)
    weights = weights / weights.mean()
    inverse = 1 / weights
    margins = max_margin * scale * (inverse - inverse.min()) / (inverse.max() - inverse.min())
    z = logits - targets * margins
    bce = np.logaddexp(0, z) - targets * z  # BCE with logits
    return float((weights**power * bce).mean())


def test_the_yaml_is_the_winners_loss():
    node = OmegaConf.to_container(OmegaConf.load(PROJECT_ROOT / "configs" / "loss" / "db_winner2026.yaml"))
    node.pop("name")
    loss = instantiate(node)
    counts = np.array([40000.0, 6000.0, 900.0, 120.0, 7.0])
    loss.set_class_counts(torch.tensor(counts), 60000)
    rng = np.random.default_rng(3)
    logits = rng.normal(0, 2, (16, 5))
    targets = (rng.random((16, 5)) < 0.3).astype(np.float64)
    value = loss(torch.tensor(logits, dtype=torch.float32), torch.tensor(targets, dtype=torch.float32)).item()
    assert value == pytest.approx(winners_formula(counts, logits, targets), rel=1e-5)
    margins = loss.positive_margins()
    assert margins[0].item() == pytest.approx(0.2) and margins[-1].item() == pytest.approx(0.0)
    assert loss.init_bias() is None  # no prior bias in the head: the winner's head starts at bias 0
