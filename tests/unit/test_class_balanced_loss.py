"""Class-balanced loss (Cui et al. 2019) against its formula, computed here in plain float64 per entry."""

from __future__ import annotations

import math

import pytest
import torch

from training.losses.bce import BCELoss
from training.losses.class_balanced import ClassBalancedLoss


def cui_weights(counts: list[int], beta: float) -> list[float]:
    """w_c = (1 - beta) / (1 - beta ** n_c), then scaled so the weights sum to the number of classes."""
    raw = [(1 - beta) / (1 - beta**n) for n in counts]
    return [w * len(counts) / sum(raw) for w in raw]


def test_weights_for_100_10_1_at_beta_099():
    loss = ClassBalancedLoss(beta=0.99)
    loss.set_class_counts(torch.tensor([100.0, 10.0, 1.0]), 120)
    expected = cui_weights([100, 10, 1], 0.99)
    # by hand: raw 0.01 / (1 - 0.99 ** 100) = 0.015774, 0.01 / (1 - 0.99 ** 10) = 0.104583, 0.01 / 0.01 = 1
    assert expected == pytest.approx([0.042237, 0.280044, 2.677719], abs=1e-6)
    assert loss.class_weights().tolist() == pytest.approx(expected, rel=1e-6)


@pytest.mark.parametrize("gamma", [0.0, 2.0])
def test_value_matches_formula_per_entry(gamma):
    loss = ClassBalancedLoss(beta=0.99, gamma=gamma)
    loss.set_class_counts(torch.tensor([100.0, 10.0, 1.0]), 120)
    x = torch.tensor([[2.0, -1.0, 0.5], [-3.0, 0.2, 4.0]])
    y = torch.tensor([[1.0, 0.0, 0.0], [0.0, 1.0, 1.0]])
    mask = torch.tensor([[True, True, False], [True, True, True]])
    w = cui_weights([100, 10, 1], 0.99)
    terms = []
    for i in range(2):
        for c in range(3):
            if not mask[i, c]:
                continue
            p = 1 / (1 + math.exp(-float(x[i, c])))
            p_t = p if y[i, c] == 1 else 1 - p
            terms.append(w[c] * (1 - p_t) ** gamma * -math.log(p_t))
    assert loss(x, y, mask).item() == pytest.approx(sum(terms) / len(terms), rel=1e-5)


def test_beta_zero_is_bce():
    """beta = 0 makes every effective number 1, so every weight is 1: plain BCE."""
    loss = ClassBalancedLoss(beta=0.0)
    loss.set_class_counts(torch.tensor([100.0, 10.0, 1.0]), 120)
    x, y = torch.randn(4, 3, generator=torch.Generator().manual_seed(1)), torch.tensor([[1.0, 0, 1]] * 4)
    assert loss(x, y).item() == pytest.approx(BCELoss()(x, y).item(), rel=1e-6)


def test_rare_class_entry_weighs_more_than_common():
    loss = ClassBalancedLoss(beta=0.999)
    loss.set_class_counts(torch.tensor([500.0, 5.0]), 600)
    x = torch.zeros(1, 2, requires_grad=True)
    loss(x, torch.ones(1, 2)).backward()
    assert x.grad[0, 1].abs() > 10 * x.grad[0, 0].abs()
