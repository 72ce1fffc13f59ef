"""Unit tests for the multi-label losses.

Each loss is checked against a plain per-entry float64 re-derivation of its published formula (written here,
independently of the implementation), against the sanity ladders down to BCE, and for mask handling,
finiteness at extreme logits and Hydra instantiation of every ``configs/loss/*.yaml``.
"""

from __future__ import annotations

import inspect
import math
from pathlib import Path

import hydra.utils
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from omegaconf import OmegaConf

from training.losses.asl import AsymmetricLoss
from training.losses.bce import BCELoss
from training.losses.contrastive import multi_label_supcon
from training.losses.db import DistributionBalancedLoss, EffectiveNumberMarginDBLoss
from training.losses.focal import FocalLoss
from training.losses.ldam import LDAMLoss
from training.losses.weights import effective_number_weights

CONFIG_DIR = Path(__file__).resolve().parents[2] / "configs" / "loss"

# Long-tailed toy statistics: 4 classes, the last one has no positive at all (must stay finite).
COUNTS = torch.tensor([120.0, 30.0, 3.0, 0.0])
N_SAMPLES = 200


def _batch(seed: int = 0, b: int = 6, c: int = 4, scale: float = 3.0):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(b, c, generator=g) * scale
    targets = (torch.rand(b, c, generator=g) < 0.4).float()
    mask = torch.rand(b, c, generator=g) < 0.8
    return logits, targets, mask


def _sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x))


def _log_sigmoid(x: float) -> float:
    return -math.log1p(math.exp(-x)) if x >= 0 else x - math.log1p(math.exp(x))


def _bce(x: float, y: float) -> float:
    return -(y * _log_sigmoid(x) + (1 - y) * _log_sigmoid(-x))


def _reduce_np(e: np.ndarray, mask, reduction: str) -> float:
    m = np.ones_like(e) if mask is None else mask.numpy().astype(np.float64)
    e = e * m
    if reduction == "sum":
        return float(e.sum())
    if reduction == "batch_mean":
        return float(e.sum() / e.shape[0])
    return float(e.sum() / max(m.sum(), 1))


def _with_counts(loss, counts=COUNTS, n=N_SAMPLES):
    loss.set_class_counts(counts, n)
    return loss


# --------------------------------------------------------------------------------------------------- focal


def _focal_ref(x, y, gamma, alpha):
    out = np.zeros(x.shape)
    for i in range(x.shape[0]):
        for j in range(x.shape[1]):
            p = _sigmoid(float(x[i, j]))
            pos = y[i, j] > 0.5
            pt = p if pos else 1 - p
            a = 1.0 if alpha is None else (alpha if pos else 1 - alpha)
            out[i, j] = -a * (1 - pt) ** gamma * math.log(pt)
    return out


@pytest.mark.parametrize("gamma,alpha", [(2.0, None), (2.0, 0.25), (0.5, 0.75)])
def test_focal_matches_formula(gamma, alpha):
    x, y, m = _batch(1, scale=2.0)
    got = FocalLoss(gamma=gamma, alpha=alpha)(x, y, m)
    want = _reduce_np(_focal_ref(x, y, gamma, alpha), m, "mean")
    assert got.item() == pytest.approx(want, rel=1e-5)


def test_focal_gamma0_equals_bce():
    x, y, m = _batch(2)
    for reduction in ("mean", "sum", "batch_mean"):
        got = FocalLoss(gamma=0.0, alpha=None, reduction=reduction)(x, y, m)
        want = BCELoss(reduction=reduction)(x, y, m)
        assert got.item() == pytest.approx(want.item(), rel=1e-6)


def test_focal_downweights_easy_entries():
    # an easy positive (x = 4) loses far more of its BCE than a hard one (x = -1)
    x = torch.tensor([[4.0, -1.0]])
    y = torch.ones(1, 2)
    bce = F.binary_cross_entropy_with_logits(x, y, reduction="none")
    fl = FocalLoss(gamma=2.0, reduction="sum")
    ratio_easy = fl(x[:, :1], y[:, :1]) / bce[0, 0]
    ratio_hard = fl(x[:, 1:], y[:, 1:]) / bce[0, 1]
    assert ratio_easy.item() == pytest.approx((1 - _sigmoid(4.0)) ** 2, rel=1e-5)
    assert ratio_hard.item() == pytest.approx((1 - _sigmoid(-1.0)) ** 2, rel=1e-5)


# ----------------------------------------------------------------------------------------------------- ASL


def _asl_ref(x, y, gamma_neg, gamma_pos, clip, eps=1e-8):
    out = np.zeros(x.shape)
    for i in range(x.shape[0]):
        for j in range(x.shape[1]):
            p = _sigmoid(float(x[i, j]))
            p_m = max(p - clip, 0.0)
            l_pos = (1 - p) ** gamma_pos * math.log(max(p, eps))
            l_neg = p_m**gamma_neg * math.log(max(1 - p_m, eps))
            yy = float(y[i, j])
            out[i, j] = -(yy * l_pos + (1 - yy) * l_neg)
    return out


@pytest.mark.parametrize("gamma_neg,gamma_pos,clip", [(4.0, 0.0, 0.05), (4.0, 1.0, 0.05), (2.0, 1.0, 0.0)])
def test_asl_matches_formula(gamma_neg, gamma_pos, clip):
    x, y, m = _batch(3)
    loss = AsymmetricLoss(gamma_neg=gamma_neg, gamma_pos=gamma_pos, clip=clip)
    want = _asl_ref(x, y, gamma_neg, gamma_pos, clip)
    assert loss(x, y).item() == pytest.approx(want.sum(), rel=1e-5)  # default reduction: sum, like the reference
    assert loss(x, y, m).item() == pytest.approx(_reduce_np(want, m, "sum"), rel=1e-5)
    mean = AsymmetricLoss(gamma_neg=gamma_neg, gamma_pos=gamma_pos, clip=clip, reduction="mean")(x, y, m)
    assert mean.item() == pytest.approx(_reduce_np(want, m, "mean"), rel=1e-5)


def test_asl_no_focusing_no_clip_equals_bce_sum():
    x, y, m = _batch(4)
    got = AsymmetricLoss(gamma_neg=0, gamma_pos=0, clip=0)(x, y, m)
    want = BCELoss(reduction="sum")(x, y, m)
    assert got.item() == pytest.approx(want.item(), rel=1e-6)


def test_asl_hard_negative_keeps_more_weight_than_easy_negative():
    # Both entries are negatives. Hard: p ~ 0.9; easy: p ~ 0.2 (still above clip, so not discarded).
    x = torch.tensor([[math.log(0.9 / 0.1), math.log(0.2 / 0.8)]], requires_grad=True)
    y = torch.zeros(1, 2)
    loss = AsymmetricLoss()  # defaults: gamma_neg 4, clip 0.05
    per_entry = _asl_ref(x.detach(), y, 4.0, 0.0, 0.05)[0]
    loss(x, y).backward()
    g_hard, g_easy = x.grad[0].tolist()
    # gradient pushes both logits down; the hard negative gets the larger push
    assert g_hard > 0 and g_easy > 0
    assert g_hard > 10 * g_easy
    assert per_entry[0] > per_entry[1]
    # the known-wrong variant (1 - p) ** gamma_neg would give the hard negative 0.1**4 vs 0.8**4: inverted
    wrong_hard = (1 - 0.9) ** 4 * -math.log(1 - 0.85)
    wrong_easy = (1 - 0.2) ** 4 * -math.log(1 - 0.15)
    assert wrong_hard < wrong_easy  # documents what the assertion above rules out


def test_asl_clip_discards_easy_negatives_and_caps_loss():
    x = torch.tensor([[math.log(0.04 / 0.96), 50.0]], requires_grad=True)  # p = 0.04 < clip; p ~ 1
    y = torch.zeros(1, 2)
    loss = AsymmetricLoss(gamma_neg=4, gamma_pos=0, clip=0.05, reduction="sum")
    out = loss(x, y)
    out.backward()
    # p <= clip: zero loss and zero gradient; p = 1: loss capped at -(0.95^4) log(0.05)
    assert out.item() == pytest.approx(-(0.95**4) * math.log(0.05), rel=1e-5)
    assert x.grad[0, 0].item() == 0.0


def test_asl_disable_grad_focal_treats_weights_as_constants():
    x, y, _ = _batch(5, scale=1.5)
    xa = x.clone().requires_grad_(True)
    xb = x.clone().requires_grad_(True)
    la = AsymmetricLoss(disable_torch_grad_focal_loss=False)(xa, y)
    lb = AsymmetricLoss(disable_torch_grad_focal_loss=True)(xb, y)
    la.backward()
    lb.backward()
    assert la.item() == pytest.approx(lb.item(), rel=1e-6)  # same value
    # with constant weights, d/dx of -w log(1 - p_m) for a negative with p > clip is w * p (1-p) / (1 - p_m)
    p = torch.sigmoid(x)
    p_m = (p - 0.05).clamp_min(0)
    w_neg = p_m**4
    expected_neg = torch.where(p > 0.05, w_neg * p * (1 - p) / (1 - p_m), torch.zeros_like(p))
    expected_pos = -(1 - p)  # gamma_pos = 0: plain BCE gradient
    expected = torch.where(y > 0.5, expected_pos, expected_neg)
    assert torch.allclose(xb.grad, expected, atol=1e-5)
    assert not torch.allclose(xa.grad, xb.grad, atol=1e-5)


# ---------------------------------------------------------------------------------------------------- LDAM


def test_ldam_margins_follow_n_to_minus_quarter_with_max_half():
    loss = _with_counts(LDAMLoss())
    m_pos, m_neg = loss.margins()
    n_pos = np.maximum(COUNTS.numpy(), 1)
    n_neg = np.maximum(N_SAMPLES - COUNTS.numpy(), 1)
    raw = np.concatenate([n_pos**-0.25, n_neg**-0.25])
    want = raw * 0.5 / raw.max()
    got = torch.cat([m_pos, m_neg]).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-6)
    assert got.max() == pytest.approx(0.5)
    # margin * n^(1/4) is one constant for every margin
    np.testing.assert_allclose(got * np.concatenate([n_pos, n_neg]) ** 0.25, 0.5, rtol=1e-6)
    # rare classes' positives get the larger margins; the zero-count class (clamped to 1) the largest
    assert torch.all(m_pos[1:] > m_pos[:-1])
    assert m_pos[3].item() == pytest.approx(0.5)
    # hence, at the same logit, a rare class's positive costs more than a common class's positive
    summed = _with_counts(LDAMLoss(reduction="sum", drw_epoch=None))
    x, y = torch.full((1, 4), 0.05), torch.ones(1, 4)
    per_class = [summed(x, y, torch.arange(4).eq(j).unsqueeze(0)).item() for j in range(4)]
    assert per_class == sorted(per_class) and per_class[0] < per_class[3]


def test_ldam_positive_only_margins():
    m_pos, m_neg = _with_counts(LDAMLoss(negative_margins=False)).margins()
    assert torch.all(m_neg == 0)
    assert m_pos.max().item() == pytest.approx(0.5)


def _ldam_ref(x, y, counts, n, max_m, s, w_pos):
    n_pos = np.maximum(counts, 1.0)
    n_neg = np.maximum(n - counts, 1.0)
    norm = max_m / max(np.max(n_pos**-0.25), np.max(n_neg**-0.25))
    out = np.zeros(x.shape)
    for i in range(x.shape[0]):
        for j in range(x.shape[1]):
            xx, yy = float(x[i, j]), float(y[i, j])
            if yy > 0.5:
                out[i, j] = w_pos[j] * _bce(s * (xx - norm * n_pos[j] ** -0.25), 1.0)
            else:
                out[i, j] = _bce(s * (xx + norm * n_neg[j] ** -0.25), 0.0)
    return out


def test_ldam_matches_formula_before_and_after_drw():
    x, y, m = _batch(6, scale=0.3)
    counts = COUNTS.numpy().astype(np.float64)
    loss = _with_counts(LDAMLoss(max_m=0.5, s=30.0, drw_epoch=3, beta=0.9999))
    loss.on_epoch_start(2)
    want = _reduce_np(_ldam_ref(x, y, counts, N_SAMPLES, 0.5, 30.0, np.ones(4)), m, "mean")
    assert loss(x, y, m).item() == pytest.approx(want, rel=1e-5)

    loss.on_epoch_start(3)
    eff = (1 - 0.9999) / (1 - 0.9999 ** np.maximum(counts, 1))
    w = eff / eff.sum() * 4
    want = _reduce_np(_ldam_ref(x, y, counts, N_SAMPLES, 0.5, 30.0, w), m, "mean")
    assert loss(x, y, m).item() == pytest.approx(want, rel=1e-5)


def test_ldam_zero_margin_is_scaled_bce():
    x, y, m = _batch(7, scale=0.2)
    loss = _with_counts(LDAMLoss(max_m=0.0, s=30.0, drw_epoch=None))
    want = BCELoss()(30.0 * x, y, m)
    assert loss(x, y, m).item() == pytest.approx(want.item(), rel=1e-6)
    loss_s1 = _with_counts(LDAMLoss(max_m=0.0, s=1.0, drw_epoch=None))
    assert loss_s1(x, y, m).item() == pytest.approx(BCELoss()(x, y, m).item(), rel=1e-6)


def test_drw_weights_schedule_and_normalisation():
    loss = _with_counts(LDAMLoss(drw_epoch=4))
    for epoch in (0, 3):
        loss.on_epoch_start(epoch)
        assert torch.equal(loss.class_weights(), torch.ones(4))
    for epoch in (4, 9):
        loss.on_epoch_start(epoch)
        w = loss.class_weights()
        assert w.sum().item() == pytest.approx(4.0, rel=1e-6)
        eff = (1 - 0.9999) / (1 - 0.9999 ** np.array([120.0, 30.0, 3.0, 1.0]))
        np.testing.assert_allclose(w.numpy(), eff / eff.sum() * 4, rtol=1e-5)
        assert torch.all(w[1:] > w[:-1])  # rarer class, larger weight
    never = _with_counts(LDAMLoss(drw_start=None, drw_epoch=None))
    never.on_epoch_start(10_000, 10_001)
    assert torch.equal(never.class_weights(), torch.ones(4))
    always = _with_counts(LDAMLoss(drw_epoch=0))
    assert not torch.equal(always.class_weights(), torch.ones(4))
    # beta = 0 gives the reference's pre-DRW all-ones weights
    assert torch.allclose(effective_number_weights(COUNTS, 0.0), torch.ones(4))


def test_drw_leaves_negatives_unweighted():
    x = torch.zeros(1, 4)
    y = torch.zeros(1, 4)
    loss = _with_counts(LDAMLoss(drw_epoch=1))
    before = loss(x, y)
    loss.on_epoch_start(1)
    assert loss(x, y).item() == pytest.approx(before.item(), rel=1e-7)


@pytest.mark.parametrize("cls", [LDAMLoss, DistributionBalancedLoss])
def test_count_dependent_losses_require_counts(cls):
    x, y, _ = _batch(8)
    with pytest.raises(RuntimeError, match="set_class_counts"):
        cls()(x, y)


# ------------------------------------------------------------------------------------------------------ DB

DB_COUNTS = torch.tensor([1.0, 2.0, 5.0])
DB_N = 10


def test_db_rebalance_weights_hand_computed():
    loss = _with_counts(DistributionBalancedLoss(), DB_COUNTS, DB_N)
    y = torch.tensor([[1.0, 0.0, 1.0], [0.0, 1.0, 0.0], [0.0, 0.0, 0.0]])
    w = loss.rebalance_weights(y)
    # 1/n = [1, 1/2, 1/5]; image 0: P^I = 1 + 1/5 = 6/5 -> r = [5/6, 5/12, 1/6]
    # image 1: P^I = 1/2 -> r = [2, 1, 2/5]; image 2 has no positive: r = inf -> w = alpha + 1
    r = [[5 / 6, 5 / 12, 1 / 6], [2.0, 1.0, 2 / 5]]
    want = [[0.1 + _sigmoid(10 * (v - 0.2)) for v in row] for row in r] + [[1.1, 1.1, 1.1]]
    np.testing.assert_allclose(w.numpy(), np.array(want), rtol=1e-6)
    # spot values: sigmoid(10 (1/6 - 0.2)) = sigmoid(-1/3)
    assert w[0, 2].item() == pytest.approx(0.1 + 1 / (1 + math.exp(1 / 3)), rel=1e-6)
    # unlabelled positives do not count: masking class 2 of image 0 leaves P^I = 1 -> r = [1, 1/2, 1/5]
    mask = torch.ones(3, 3, dtype=torch.bool)
    mask[0, 2] = False
    w_masked = loss.rebalance_weights(y, mask)
    want0 = [0.1 + _sigmoid(10 * (v - 0.2)) for v in (1.0, 0.5, 0.2)]
    np.testing.assert_allclose(w_masked[0].numpy(), want0, rtol=1e-6)


def test_db_init_bias_value():
    loss = _with_counts(DistributionBalancedLoss(), DB_COUNTS, DB_N)
    # -log(N/n - 1) * 0.05 / 2 with N/n - 1 = [9, 4, 1]
    want = torch.tensor([-math.log(9) * 0.025, -math.log(4) * 0.025, 0.0])
    assert torch.allclose(loss.init_bias(), want, atol=1e-7)
    assert loss.init_bias()[0].item() == pytest.approx(-0.0549306, abs=1e-6)
    # it is (kappa / lambda) * logit(prior)
    prior = DB_COUNTS / DB_N
    assert torch.allclose(loss.init_bias(), 0.025 * torch.log(prior / (1 - prior)), atol=1e-6)
    # zero-count and all-positive classes stay finite
    edge = _with_counts(DistributionBalancedLoss(), torch.tensor([0.0, 10.0]), 10)
    assert torch.isfinite(edge.init_bias()).all()
    # bias_in_loss: nothing for the head
    assert _with_counts(DistributionBalancedLoss(bias_in_loss=True), DB_COUNTS, DB_N).init_bias() is None


def _db_ref(x, y, counts, n, alpha, beta, mu, gamma, balance, lam, kappa, add_bias):
    freq_inv = 1.0 / np.maximum(counts, 1.0)
    bias = -np.log(n / np.clip(counts, 1, n - 1) - 1) * kappa / lam
    out = np.zeros(x.shape)
    for i in range(x.shape[0]):
        p_img = sum(freq_inv[j] for j in range(x.shape[1]) if y[i, j] > 0.5)
        for j in range(x.shape[1]):
            w = alpha + (_sigmoid(beta * (freq_inv[j] / p_img - mu)) if p_img > 0 else 1.0)
            z = float(x[i, j]) + (bias[j] if add_bias else 0.0)
            if y[i, j] > 0.5:
                ce = _bce(z, 1.0)
            else:
                ce = _bce(lam * z, 0.0)
                w = w / lam
            pt = math.exp(-ce)
            out[i, j] = balance * (1 - pt) ** gamma * w * ce
    return out


@pytest.mark.parametrize("bias_in_loss", [False, True])
def test_db_matches_formula(bias_in_loss):
    x, y, _ = _batch(9, b=5, c=3)
    y[4] = 0  # one image without positives
    loss = _with_counts(DistributionBalancedLoss(bias_in_loss=bias_in_loss), DB_COUNTS, DB_N)
    ref = _db_ref(x, y, DB_COUNTS.numpy(), DB_N, 0.1, 10.0, 0.2, 2.0, 2.0, 2.0, 0.05, add_bias=bias_in_loss)
    assert loss(x, y).item() == pytest.approx(ref.mean(), rel=1e-5)
    if not bias_in_loss:
        # platform mode + head bias == reference mode
        ref_mode = _with_counts(DistributionBalancedLoss(bias_in_loss=True), DB_COUNTS, DB_N)
        assert loss(x + loss.init_bias(), y).item() == pytest.approx(ref_mode(x, y).item(), rel=1e-6)


def test_db_reduces_to_bce():
    x, y, m = _batch(10, c=3)
    loss = _with_counts(
        DistributionBalancedLoss(rebalance=False, focal=False, neg_scale=1.0, init_bias=0.0, bias_in_loss=True),
        DB_COUNTS,
        DB_N,
    )
    assert loss(x, y, m).item() == pytest.approx(BCELoss()(x, y, m).item(), rel=1e-6)


def test_db_negative_tolerance_softens_negative_gradient():
    # a negative already below zero: lambda = 2 shrinks its gradient versus plain BCE
    x = torch.tensor([[-2.0]], requires_grad=True)
    y = torch.zeros(1, 1)
    plain = _with_counts(DistributionBalancedLoss(rebalance=False, focal=False, neg_scale=1.0), DB_COUNTS[:1], 10)
    ntr = _with_counts(DistributionBalancedLoss(rebalance=False, focal=False, neg_scale=2.0), DB_COUNTS[:1], 10)
    plain(x, y).backward()
    g_plain = x.grad.item()
    x.grad = None
    ntr(x, y).backward()
    assert g_plain == pytest.approx(_sigmoid(-2.0), rel=1e-5)
    assert x.grad.item() == pytest.approx(_sigmoid(-4.0), rel=1e-5)  # d/dz (1/2) softplus(2z) = sigmoid(2z)


def test_db_variant_weights_and_margin_on_a_two_class_toy():
    """Row A's variant: effective-number class weights and a positive margin, by hand on 2 classes.

    beta 0.5, counts [1, 2]: raw weights (1 - 0.5) / (1 - 0.5^n) = [1, 2/3], normalised to sum 2: [6/5, 4/5].
    Margin 0.5 on the positive of class 0 (logit 0.3 -> -0.2); the negative of class 1 keeps its logit -0.4.
    """
    bare = {"focal": False, "neg_scale": 1.0, "init_bias": 0.0, "reduction": "sum"}
    loss = _with_counts(
        EffectiveNumberMarginDBLoss(class_beta=0.5, pos_margin=0.5, **bare), torch.tensor([1.0, 2.0]), 4
    )
    np.testing.assert_allclose(loss.class_weights().numpy(), [1.2, 0.8], rtol=1e-6)
    x = torch.tensor([[0.3, -0.4]])
    y = torch.tensor([[1.0, 0.0]])
    want = 1.2 * math.log1p(math.exp(0.2)) + 0.8 * math.log1p(math.exp(-0.4))  # 1.2 bce(-0.2, 1) + 0.8 bce(-0.4, 0)
    assert loss(x, y).item() == pytest.approx(want, rel=1e-6)
    # the margin costs a positive exactly what a logit 0.5 lower costs it; negatives do not move
    no_margin = _with_counts(
        EffectiveNumberMarginDBLoss(class_beta=0.5, pos_margin=0.0, **bare), torch.tensor([1.0, 2.0]), 4
    )
    assert loss(x, y).item() == pytest.approx(no_margin(x - torch.tensor([[0.5, 0.0]]), y).item(), rel=1e-6)
    # the plain DB class has both parts off by default
    assert torch.equal(_with_counts(DistributionBalancedLoss(), DB_COUNTS, DB_N).class_weights(), torch.ones(3))


def test_db_variant_matches_formula_with_every_part_on():
    """The full variant (NTR, prior bias in the head, focal term) against a float64 loop."""
    x, y, _ = _batch(21, b=5, c=3)
    loss = _with_counts(EffectiveNumberMarginDBLoss(), DB_COUNTS, DB_N)
    counts = DB_COUNTS.numpy().astype(np.float64)
    eff = (1 - 0.9999) / (1 - 0.9999**counts)
    w_class = eff / eff.sum() * 3
    out = np.zeros((5, 3))
    for i in range(5):
        for j in range(3):
            z = float(x[i, j])
            if y[i, j] > 0.5:
                w, ce = w_class[j], _bce(z - 0.5, 1.0)
            else:
                w, ce = w_class[j] / 2.0, _bce(2.0 * z, 0.0)
            out[i, j] = 2.0 * (1 - math.exp(-ce)) ** 2 * w * ce
    assert loss(x, y).item() == pytest.approx(out.mean(), rel=1e-5)
    assert loss.init_bias() is not None  # the prior bias still goes into the head


# ---------------------------------------------------------------------------------------------- DRW share


@pytest.mark.parametrize(("max_epochs", "first"), [(20, 16), (8, 6), (1, 0)])
def test_ldam_drw_start_is_a_share_of_the_run(max_epochs, first):
    """drw_start 0.8: DRW from epoch 16 of 20, 6 of 8 (the old fixed default), 0 of a one-epoch run."""
    loss = _with_counts(LDAMLoss(drw_start=0.8))
    for epoch in range(max_epochs):
        loss.on_epoch_start(epoch, max_epochs)
        assert loss.drw_active == (epoch >= first), (epoch, max_epochs)
    # an absolute drw_epoch (older configs) wins over the share
    legacy = _with_counts(LDAMLoss(drw_start=0.8, drw_epoch=2))
    legacy.on_epoch_start(2, 20)
    assert legacy.drw_active


def test_ldam_drw_start_without_the_run_length_is_reported():
    loss = _with_counts(LDAMLoss(drw_start=0.8))
    assert not loss.drw_active  # before any epoch: nothing of the run has passed
    loss.on_epoch_start(3)
    with pytest.raises(RuntimeError, match="max_epochs"):
        loss.class_weights()


# -------------------------------------------------------------------------------------- contrastive (aux)


def _supcon_loop(z: np.ndarray, y: np.ndarray, t: float) -> float:
    """The multi-label supervised contrastive loss written out: anchors (i, c), positives j != i with y_jc = 1."""
    z = z / np.linalg.norm(z, axis=1, keepdims=True)
    n = len(z)
    terms = []
    for i in range(n):
        denominator = sum(math.exp(float(z[i] @ z[a]) / t) for a in range(n) if a != i)
        for c in range(y.shape[1]):
            positives = [j for j in range(n) if j != i and y[j, c] == 1]
            if y[i, c] == 1 and positives:
                terms.append(
                    -sum(math.log(math.exp(float(z[i] @ z[p]) / t) / denominator) for p in positives) / len(positives)
                )
    return sum(terms) / len(terms)


def test_multi_label_supcon_on_three_samples_matches_a_plain_loop():
    z = torch.tensor([[1.0, 0.0], [0.6, 0.8], [0.0, 1.0]])
    y = torch.tensor([[1.0, 1.0], [1.0, 0.0], [0.0, 1.0]])  # class 0: images 0, 1; class 1: images 0, 2
    got = multi_label_supcon(z, y, temperature=0.5)
    assert got.item() == pytest.approx(_supcon_loop(z.numpy(), y.numpy(), 0.5), rel=1e-6)
    # by hand: the anchors are (0,0) -> 1, (1,0) -> 0, (0,1) -> 2, (2,1) -> 0, with s01 = 0.6, s02 = 0, s12 = 0.8
    e = math.exp
    want = (
        -math.log(e(1.2) / (e(1.2) + e(0.0)))
        - math.log(e(1.2) / (e(1.2) + e(1.6)))
        - math.log(e(0.0) / (e(1.2) + e(0.0)))
        - math.log(e(0.0) / (e(0.0) + e(1.6)))
    ) / 4
    assert got.item() == pytest.approx(want, rel=1e-6)
    # an unlabelled entry is not a positive: masking y[2, 1] leaves class 1 with image 0 alone, no anchor there
    mask = torch.ones(3, 2, dtype=torch.bool)
    mask[2, 1] = False
    masked = multi_label_supcon(z, y, mask, temperature=0.5)
    assert masked.item() == pytest.approx(_supcon_loop(z.numpy(), (y * mask).numpy(), 0.5), rel=1e-6)


def test_multi_label_supcon_pulls_same_finding_together_and_is_zero_without_pairs():
    y = torch.tensor([[1.0], [1.0], [0.0]])
    close = multi_label_supcon(torch.tensor([[1.0, 0.0], [0.9, 0.1], [-1.0, 0.0]]), y)
    apart = multi_label_supcon(torch.tensor([[1.0, 0.0], [-1.0, 0.0], [0.9, 0.1]]), y)
    assert close < apart
    z = torch.randn(3, 4, requires_grad=True)
    none = multi_label_supcon(z, torch.tensor([[1.0], [0.0], [0.0]]))  # one positive: no positive pair
    none.backward()
    assert none.item() == 0.0 and torch.equal(z.grad, torch.zeros_like(z))


def test_contrastive_aux_term_trains_beside_the_loss_and_never_predicts():
    """aux_loss=multi_supcon in the classifier: loss = main + weight * contrastive(projection(pooled feature))."""
    from training.models.module import MultiLabelClassifier

    node = OmegaConf.to_container(OmegaConf.load(CONFIG_DIR.parent / "aux_loss" / "multi_supcon.yaml"))
    node["weight"] = 0.4
    model_cfg = {"backbone": "resnet10t", "pretrained": False, "lr": 1e-3, "weight_decay": 0.0, "aux_loss": node}
    torch.manual_seed(0)
    model = MultiLabelClassifier(model_cfg, {"name": "bce", "_target_": "training.losses.bce.BCELoss"}, ["A", "B"])
    model.eval()
    assert model.aux_head is None and model.aux_term is not None
    images = torch.randn(4, 1, 32, 32)
    targets = torch.tensor([[1, 0], [1, 1], [0, 1], [1, 0]])
    mask = torch.ones_like(targets, dtype=torch.bool)
    with torch.no_grad():
        pooled = model.backbone(images)
        main = BCELoss()(model.head(pooled), targets, mask)
        aux = multi_label_supcon(model.aux_term.projection(pooled), targets, mask, temperature=0.1)
        torch.testing.assert_close(model.training_loss(images, targets, mask), main + 0.4 * aux)
        before = model(images)
        for parameter in model.aux_term.parameters():
            parameter.add_(3.0)
        torch.testing.assert_close(model(images), before)  # predictions never read the projection


# ---------------------------------------------------------------------------------------- shared properties


def _all_losses():
    return [
        FocalLoss(),
        FocalLoss(alpha=0.25),
        AsymmetricLoss(),
        AsymmetricLoss(disable_torch_grad_focal_loss=True, reduction="mean"),
        LDAMLoss(drw_epoch=0),
        DistributionBalancedLoss(),
        DistributionBalancedLoss(bias_in_loss=True),
    ]


@pytest.mark.parametrize("loss", _all_losses(), ids=lambda loss: type(loss).__name__)
def test_mask_excludes_unlabelled_entries(loss):
    _with_counts(loss)
    x, y, m = _batch(11)
    x = x.requires_grad_(True)
    # change everything that is masked out: flip targets, push logits to extremes
    x2 = torch.where(m, x.detach(), torch.full_like(x, 50.0)).requires_grad_(True)
    y2 = torch.where(m, y, 1 - y)
    a = loss(x, y, m)
    b = loss(x2, y2, m)
    assert a.item() == pytest.approx(b.item(), rel=1e-6)
    a.backward()
    assert torch.all(x.grad[~m] == 0)
    assert x.grad[m].abs().sum() > 0
    # an all-masked batch contributes exactly nothing
    none = torch.zeros_like(m)
    assert loss(x.detach(), y, none).item() == 0.0


@pytest.mark.parametrize("loss", _all_losses(), ids=lambda loss: type(loss).__name__)
def test_finite_with_extreme_logits(loss):
    _with_counts(loss)
    x = torch.tensor([[50.0, -50.0, 50.0, -50.0], [-50.0, 50.0, 0.0, 1e4]], dtype=torch.float32, requires_grad=True)
    y = torch.tensor([[1.0, 0.0, 0.0, 1.0], [1.0, 0.0, 1.0, 0.0]])
    out = loss(x, y)
    out.backward()
    assert torch.isfinite(out)
    assert out.item() > 0
    assert torch.isfinite(x.grad).all()


@pytest.mark.parametrize("loss", _all_losses(), ids=lambda loss: type(loss).__name__)
def test_half_precision_logits_are_accepted(loss):
    _with_counts(loss)
    x, y, m = _batch(12)
    full = loss(x, y, m)
    half = loss(x.half(), y, m)
    assert half.dtype == torch.float32
    assert half.item() == pytest.approx(full.item(), rel=1e-2)


# ------------------------------------------------------------------------------------------------- configs

CONFIGS = sorted(CONFIG_DIR.glob("*.yaml"))


def test_every_new_loss_has_a_config():
    names = {p.stem for p in CONFIGS}
    assert {"bce", "focal", "asl", "ldam", "db", "db_en_margin"} <= names


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.stem)
def test_config_instantiates_and_trains(path):
    cfg = OmegaConf.load(path)
    # `name` is the public name used in run names, stripped before instantiation (training/models/module.py)
    assert cfg.name == path.stem
    cfg = OmegaConf.create({k: v for k, v in cfg.items() if k != "name"})
    loss = hydra.utils.instantiate(cfg)
    # every constructor argument is spelled out in the YAML, with the constructor's default
    params = {k: v for k, v in inspect.signature(type(loss).__init__).parameters.items() if k != "self"}
    keys = set(cfg.keys()) - {"_target_"}
    assert keys == set(params), f"{path.name}: YAML keys {sorted(keys)} != arguments {sorted(params)}"
    for name, p in params.items():
        assert cfg[name] == p.default, f"{path.name}: {name}={cfg[name]!r}, constructor default {p.default!r}"

    loss.set_class_counts(COUNTS, N_SAMPLES)
    loss.on_epoch_start(100, 120)
    head = torch.nn.Linear(5, 4)
    bias = loss.init_bias()
    if bias is not None:
        assert bias.shape == (4,) and torch.isfinite(bias).all()
        with torch.no_grad():
            head.bias.copy_(bias)
    g = torch.Generator().manual_seed(13)
    feats = torch.randn(8, 5, generator=g)
    y = (torch.rand(8, 4, generator=g) < 0.3).float()
    mask = torch.rand(8, 4, generator=g) < 0.9
    out = loss(head(feats), y, mask)
    out.backward()
    assert out.ndim == 0 and torch.isfinite(out) and out.item() > 0
    assert torch.isfinite(head.weight.grad).all() and head.weight.grad.abs().sum() > 0


@pytest.mark.parametrize("config", sorted((Path(__file__).resolve().parents[2] / "configs" / "loss").glob("*.yaml")),
                         ids=lambda p: p.stem)  # fmt: skip
@pytest.mark.parametrize("autocast", [False, True], ids=["fp32", "bf16-autocast"])
def test_gradients_finite_over_the_logit_range(config, autocast):
    """Logits spanning [-30, 30] through a linear head, in fp32 and under CPU bf16 autocast."""
    from hydra.utils import instantiate
    from omegaconf import OmegaConf

    node = OmegaConf.to_container(OmegaConf.load(config))
    node.pop("name", None)
    loss = instantiate(node)
    loss.set_class_counts(torch.tensor([400.0, 40.0, 4.0, 1.0]), 1000)
    torch.manual_seed(0)
    features = torch.randn(64, 8)
    head = torch.nn.Linear(8, 4)
    targets = (torch.rand(64, 4) < 0.3).float()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        logits = head(features)
        logits = 30.0 * logits / logits.abs().max().detach()  # stretched onto exactly [-30, 30]
        value = loss(logits, targets, torch.ones_like(targets, dtype=torch.bool))
    value.backward()
    assert logits.abs().max() > 29  # the range is actually exercised
    assert torch.isfinite(value) and torch.isfinite(head.weight.grad).all() and head.weight.grad.abs().sum() > 0
