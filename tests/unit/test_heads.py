"""The selectable heads (configs/head), the auxiliary loss and the two-phase switch, on small tensors."""

from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from lightning.pytorch.callbacks import ModelCheckpoint

from training.losses.bce import BCELoss
from training.models.heads import build_head
from training.models.heads.ml_decoder import MLDecoderHead
from training.models.heads.moe import MoEHead
from training.models.heads.two_stage import TwoStageHead, product_logit
from training.models.module import MultiLabelClassifier
from training.models.two_phase import TwoPhase

MODEL = {"backbone": "resnet10t", "pretrained": False, "lr": 1e-3, "weight_decay": 0.0}
LOSS = {"name": "bce", "_target_": "training.losses.bce.BCELoss"}
HEADS = "training.models.heads."


def _model(head: dict | None = None, aux_weight: float = 0.0, labels=("Normal", "A", "B")) -> MultiLabelClassifier:
    cfg = {**MODEL, "head": head, "aux_loss": {"name": "linear", "weight": aux_weight}}
    return MultiLabelClassifier(cfg, LOSS, list(labels))


# ML-Decoder


def test_ml_decoder_reads_locations_not_their_average():
    torch.manual_seed(0)
    head = MLDecoderHead(8, 3, dim=16, heads=2, layers=2, dropout=0.0).eval()
    x = torch.randn(2, 8, 3, 3)
    shuffled = x.flatten(2)[:, :, torch.randperm(9)].reshape_as(x)
    # No positional encoding: the queries attend over a set of locations, so their order does not matter ...
    torch.testing.assert_close(head(shuffled), head(x))
    # ... but, unlike a pooled linear head, the same mean spread differently over the map gives another answer.
    moved = x.clone()
    moved[:, :, 0, 0] += 3.0
    moved[:, :, 0, 1] -= 3.0
    torch.testing.assert_close(moved.mean((2, 3)), x.mean((2, 3)))
    assert not torch.allclose(head(moved), head(x), atol=1e-4)


def test_ml_decoder_queries_do_not_see_each_other_and_groups_decode_their_own_classes():
    """Without self-attention, class k's logit depends on query k alone; with groups, on its group's query."""
    for groups, owner in ((None, [0, 1, 2, 3, 4]), (2, [0, 0, 0, 1, 1])):
        head = MLDecoderHead(8, 5, dim=16, heads=2, layers=2, dropout=0.0, groups=groups)
        x = torch.randn(2, 8, 2, 2)
        for k in range(5):
            (grad,) = torch.autograd.grad(head(x)[:, k].sum(), head.queries)
            used = grad.abs().sum(dim=1) > 0
            assert used.tolist() == [q == owner[k] for q in range(len(grad))], (groups, k)


def test_ml_decoder_in_the_classifier_gets_the_map_and_the_aux_head_the_pooled_feature():
    model = _model({"_target_": HEADS + "ml_decoder.MLDecoderHead", "name": "ml_decoder", "dim": 16, "heads": 2},
                   aux_weight=0.5).eval()  # fmt: skip
    images = torch.randn(2, 1, 32, 32)
    features = model.features(images)
    assert features.ndim == 4 and features.shape[1] == model.backbone.num_features
    torch.testing.assert_close(model.pooled(features), model.backbone(images))
    assert model(images).shape == (2, 3)


# Auxiliary loss


def test_aux_loss_adds_its_weighted_term_in_training_and_is_absent_from_predictions():
    torch.manual_seed(0)
    model = _model({"_target_": HEADS + "ml_decoder.MLDecoderHead", "dim": 16, "heads": 2, "dropout": 0.0},
                   aux_weight=0.3).eval()  # fmt: skip
    images, targets = torch.randn(4, 1, 32, 32), torch.randint(0, 2, (4, 3))
    mask = torch.ones_like(targets, dtype=torch.bool)
    mask[0, 1] = False
    bce = BCELoss()
    with torch.no_grad():
        main = bce(model.head(model.backbone.forward_features(images)), targets, mask)
        aux = bce(model.aux_head(model.backbone(images)), targets, mask)
        assert float(aux) > 0
        torch.testing.assert_close(model.training_loss(images, targets, mask), main + 0.3 * aux)
        before = model(images)
        model.aux_head.weight.add_(5.0)
        model.aux_head.bias.add_(5.0)
        torch.testing.assert_close(model(images), before)  # inference never reads the auxiliary head
    assert _model(aux_weight=0.0).aux_head is None


# Two-stage gate


def test_two_stage_output_is_the_gate_times_the_class_probability():
    torch.manual_seed(0)
    head = TwoStageHead(6, 3, labels=["A", "Normal", "B"])
    x = torch.randn(5, 6)
    gate, classes = head.parts(x)
    probs = torch.sigmoid(head(x))
    torch.testing.assert_close(probs[:, [0, 2]], torch.sigmoid(gate) * torch.sigmoid(classes[:, [0, 2]]))
    torch.testing.assert_close(probs[:, 1], torch.sigmoid(classes[:, 1]))  # Normal: its own output, ungated
    # Stable far outside where the product could be formed in float32: compared with float64 arithmetic.
    g = torch.tensor([-60.0, 40.0, 40.0, 0.0, -5.0])
    c = torch.tensor([30.0, 40.0, -60.0, 0.0, 7.0])
    p = torch.sigmoid(g.double()) * torch.sigmoid(c.double())
    out = product_logit(g, c)
    assert torch.isfinite(out).all()
    expected = torch.log(p) - torch.log1p(-p)
    finite = torch.isfinite(expected)  # float64 rounds p to 1 for (40, 40): the stable form still answers
    torch.testing.assert_close(out[finite].double(), expected[finite], rtol=1e-5, atol=1e-5)
    assert out[1] > 30  # p close to 1: a large positive logit, not inf


def test_two_stage_gate_target_on_a_hand_made_batch():
    head = TwoStageHead(4, 3, labels=["A", "Normal", "B"])
    targets = torch.tensor([[1, 0, 0], [0, 1, 0], [0, 0, 0], [-1, 0, 0], [-1, 1, 0], [0, 0, 1], [1, -1, -1]])
    abnormal, known = head.gate_target(targets.clamp_min(0), targets >= 0)
    assert abnormal.tolist() == [True, False, False, False, False, True, True]
    # row 3: finding A unlabelled and Normal not set, so it may be abnormal: left out of the gate loss
    assert known.tolist() == [True, True, True, False, True, True, True]
    # Without a Normal label every column is a finding: abnormal = any labelled positive.
    plain = TwoStageHead(4, 2, labels=["A", "B"])
    abnormal, known = plain.gate_target(
        torch.tensor([[0, 1], [0, 0], [0, 0]]), torch.tensor([[1, 1], [1, 1], [0, 1]]) > 0
    )
    assert abnormal.tolist() == [True, False, False] and known.tolist() == [True, True, False]


def test_two_stage_class_logits_learn_from_abnormal_images_only_and_the_gate_is_trained():
    torch.manual_seed(0)
    head = TwoStageHead(4, 3, labels=["A", "Normal", "B"])
    seen = {}
    parts = head.parts

    def spy(features):
        gate, classes = parts(features)
        classes.retain_grad()
        seen["classes"] = classes
        return gate, classes

    head.parts = spy
    targets = torch.tensor([[1, 0, 0], [0, 1, 0], [0, 0, 1], [0, 1, 0]])
    loss = head.training_loss(torch.randn(4, 4), targets, torch.ones(4, 3, dtype=torch.bool), BCELoss())
    loss.backward()
    grad = seen["classes"].grad
    assert torch.equal(grad[[1, 3]][:, [0, 2]], torch.zeros(2, 2))  # normal images: no gradient into a finding
    assert (grad[[0, 2]][:, [0, 2]] != 0).all() and (grad[:, 1] != 0).all()  # Normal learns on every image
    assert head.gate.weight.grad.abs().sum() > 0


def test_two_stage_normal_is_its_own_output_and_an_all_zero_row_teaches_it_nothing():
    """docs/rules.md §12 by hand: zero weights, class biases (A, Normal, B) = (0, 1, -1), gate bias 0.5."""
    head = TwoStageHead(2, 3, labels=["A", "Normal", "B"])
    with torch.no_grad():
        head.weight.zero_(), head.gate.weight.zero_()
        head.bias.copy_(torch.tensor([0.0, 1.0, -1.0])), head.gate.bias.fill_(0.5)
    # Row 0 has A, row 1 is labelled Normal, row 2 is all-zero: the data module made its Normal target -1.
    targets = torch.tensor([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, -1.0, 0.0]])
    probs = torch.sigmoid(head(torch.zeros(3, 2)))
    p_any = torch.sigmoid(torch.tensor(0.5))
    torch.testing.assert_close(probs[:, 1], torch.full((3,), torch.sigmoid(torch.tensor(1.0)).item()))
    assert (probs[:, 1] - (1 - p_any)).abs().min() > 0.3  # 0.731, not 1 - P(any finding) = 0.378
    loss = head.training_loss(torch.zeros(3, 2), targets.clamp_min(0), targets >= 0, BCELoss())
    sp = F.softplus
    one = torch.tensor(1.0)
    # Class entries kept: row 0 A (y=1, c=0), Normal (y=0, c=1), B (y=0, c=-1); row 1 Normal (y=1, c=1). Row 2: none.
    class_loss = (sp(-0 * one) + sp(one) + sp(-one) + sp(-one)) / 4
    # The gate learns "abnormal" on all three rows: each finding's 0 is a label, so row 2 is known to lack them.
    gate_loss = (sp(-0.5 * one) + 2 * sp(0.5 * one)) / 3
    torch.testing.assert_close(loss, class_loss + gate_loss)


def test_build_head_hands_the_labels_only_to_heads_that_take_them():
    head = _model({"_target_": HEADS + "two_stage.TwoStageHead", "name": "two_stage"}, labels=["A", "B", "Normal"]).head
    assert head.normal_index == 2 and head.findings.tolist() == [True, True, False]
    assert isinstance(build_head(None, 4, 2, ["A", "B"]), torch.nn.Linear)
    assert build_head({"_target_": HEADS + "moe.MoEHead"}, 4, 2, ["A", "B"]).bias.shape == (2,)


# Mixture of experts and the two-phase switch


def test_moe_phase_one_is_linear_and_phase_two_the_gated_mixture():
    torch.manual_seed(0)
    head = MoEHead(6, 3, experts=4, noise=0.01)
    x = torch.randn(5, 6)
    torch.testing.assert_close(head(x), F.linear(x, head.weight, head.bias))
    head.training_loss(x, torch.ones(5, 3), torch.ones(5, 3, dtype=torch.bool), BCELoss()).backward()
    assert head.expert_weight.grad is None and head.router.weight.grad is None  # AdamW leaves them alone
    phase_one = head(x).detach()
    head.start_phase_two()
    torch.testing.assert_close(head(x), phase_one, atol=1e-3, rtol=0)  # continuous at the switch ...
    assert not torch.equal(head.expert_weight[0], head.expert_weight[1])  # ... with the symmetry broken
    with torch.no_grad():
        head.router.weight.normal_()
    gates = torch.softmax(x @ head.router.weight.T + head.router.bias, dim=1)
    reference = sum(gates[:, [k]] * (x @ head.expert_weight[k].T + head.expert_bias[k]) for k in range(4))
    torch.testing.assert_close(head(x), reference)
    head.zero_grad(set_to_none=True)
    targets, mask = torch.ones(5, 3), torch.ones(5, 3, dtype=torch.bool)
    loss = head.training_loss(x, targets, mask, BCELoss())
    importance = gates.mean(0)
    torch.testing.assert_close(loss, BCELoss()(reference, targets, mask) + 0.01 * (4 * importance.square().sum() - 1))
    loss.backward()
    assert head.weight.grad is None and head.expert_weight.grad.abs().sum() > 0


def test_a_phase_two_checkpoint_loaded_fresh_outputs_the_mixture():
    head = MoEHead(6, 3)
    head.start_phase_two()
    with torch.no_grad():
        head.router.weight.normal_()
    fresh = MoEHead(6, 3)
    assert not fresh.in_phase_two
    fresh.load_state_dict(head.state_dict())
    x = torch.randn(4, 6)
    assert fresh.in_phase_two
    torch.testing.assert_close(fresh(x), head(x))
    assert not torch.allclose(fresh(x), F.linear(x, fresh.weight, fresh.bias))


def _trainer(epoch: int, checkpoint: ModelCheckpoint, max_epochs: int = 4):
    return SimpleNamespace(current_epoch=epoch, max_epochs=max_epochs, checkpoint_callbacks=[checkpoint])


def test_two_phase_switches_freezes_restarts_selection_and_survives_a_resume():
    model = _model({"_target_": HEADS + "moe.MoEHead", "name": "moe"})
    model.set_label_statistics(np.array([50, 30, 2]), 100)
    callback, checkpoint = TwoPhase(switch_epoch=2), ModelCheckpoint(monitor="val/mAP", mode="max")
    checkpoint.best_k_models, checkpoint.best_model_score = {"best.ckpt": torch.tensor(0.9)}, torch.tensor(0.9)
    callback.on_fit_start(_trainer(0, checkpoint), model)
    for epoch in (0, 1):
        callback.on_train_epoch_start(_trainer(epoch, checkpoint), model)
        assert not model.head.in_phase_two and all(p.requires_grad for p in model.backbone.parameters())
    callback.on_train_epoch_start(_trainer(2, checkpoint), model)
    assert model.head.in_phase_two and int(model.head.phase) == 2
    assert not any(p.requires_grad for p in model.backbone.parameters()) and model.backbone_frozen
    assert checkpoint.best_model_score is None and checkpoint.best_k_models == {}  # phase 1 cannot be the best
    # The experts start from the phase-1 head, which carries the loss's prior initialisation.
    torch.testing.assert_close(model.head.expert_bias, model.head.bias.expand(4, 3))

    resumed = _model({"_target_": HEADS + "moe.MoEHead", "name": "moe"})
    resumed.load_state_dict(model.state_dict())
    experts = resumed.head.expert_weight.detach().clone()
    TwoPhase(switch_epoch=2).on_train_epoch_start(_trainer(3, checkpoint), resumed)
    assert resumed.backbone_frozen and torch.equal(resumed.head.expert_weight, experts)  # not re-initialised


def test_two_phase_refuses_a_head_without_phases_and_a_switch_after_the_last_epoch():
    checkpoint = ModelCheckpoint(monitor="val/mAP")
    with pytest.raises(Exception, match="head=moe"):
        TwoPhase(switch_epoch=1).on_fit_start(_trainer(0, checkpoint), _model())
    with pytest.raises(Exception, match="never start"):
        TwoPhase(switch_epoch=4).on_fit_start(
            _trainer(0, checkpoint, max_epochs=4), _model({"_target_": HEADS + "moe.MoEHead"})
        )


def test_the_optimiser_holds_the_experts_from_the_first_step():
    model = _model({"_target_": HEADS + "moe.MoEHead", "name": "moe"})
    model._trainer = SimpleNamespace(estimated_stepping_batches=10, max_epochs=2)
    optimizer = model.configure_optimizers()["optimizer"]
    held = {id(p) for group in optimizer.param_groups for p in group["params"]}
    assert {id(model.head.expert_weight), id(model.head.expert_bias), id(model.head.router.weight)} <= held


def test_benchmarks_feed_a_query_head_its_map_and_the_probe_a_pooled_embedding():
    from apps.benchmarks.framework.heatmaps import _Logits
    from apps.benchmarks.framework.platform_models import head_input

    model = _model({"_target_": HEADS + "ml_decoder.MLDecoderHead", "dim": 16, "heads": 2}).eval()
    images = torch.randn(2, 1, 32, 32)
    with torch.no_grad():
        features, pooled = head_input(model, images)
        assert features.ndim == 4 and pooled.shape == (2, model.backbone.num_features)
        torch.testing.assert_close(model.head(features), model(images))
        torch.testing.assert_close(_Logits(model)(images), model(images))


@pytest.mark.parametrize(
    ("fraction", "max_epochs", "expected"), [(0.7, 20, 14), (0.7, 8, 6), (0.7, 1, 0), (0.99, 4, 3)]
)
def test_two_phase_switch_fraction_scales_with_the_run(fraction, max_epochs, expected):
    """One preset serves a 20-epoch run and a one-epoch smoke run: the switch epoch follows trainer.max_epochs."""
    from types import SimpleNamespace

    from training.models.two_phase import TwoPhase

    callback = TwoPhase(switch_fraction=fraction)
    model = SimpleNamespace(head=SimpleNamespace(start_phase_two=None))
    callback.on_fit_start(SimpleNamespace(max_epochs=max_epochs), model)
    assert callback.switch_epoch == expected


def test_csra_logit_is_the_mean_score_plus_lam_times_the_attended_score_by_hand():
    """One class with weight (3, 4) (unit (0.6, 0.8)) over two locations (1, 0) and (0, 2): scores 0.6 and 1.6, mean
    1.1; softmax weights sigmoid(-1) and sigmoid(1) give 0.6 x 0.268941 + 1.6 x 0.731059 = 1.331059."""
    from training.models.heads.csra import CSRAHead

    head = CSRAHead(2, 1, lam=0.1, temperature=1.0, batch_norm=False)
    with torch.no_grad():
        head.weight.copy_(torch.tensor([[3.0, 4.0]]))
    feature_map = torch.tensor([[1.0, 0.0], [0.0, 2.0]]).reshape(1, 2, 1, 2)  # (B, F, h, w): columns are locations
    assert head(feature_map).item() == pytest.approx(1.1 + 0.1 * 1.331059, abs=1e-6)
    head.temperature = float("inf")  # the attended score is the maximum
    assert head(feature_map).item() == pytest.approx(1.1 + 0.1 * 1.6, abs=1e-6)
    tokens = feature_map.flatten(2).transpose(1, 2)  # the same locations as a transformer's (B, N, F) tokens
    assert head(tokens).item() == pytest.approx(1.26, abs=1e-6)


def test_csra_without_attention_is_a_linear_head_on_the_pooled_feature_with_unit_weights():
    from training.models.heads.csra import CSRAHead

    torch.manual_seed(0)
    head = CSRAHead(8, 3, lam=0.0, batch_norm=False)
    feature_map = torch.randn(4, 8, 5, 5)
    unit = head.weight / head.weight.norm(dim=1, keepdim=True)
    torch.testing.assert_close(head(feature_map), feature_map.mean(dim=(2, 3)) @ unit.T + head.bias)


def test_head_lr_gives_the_heads_their_own_rate_and_the_schedule_scales_both_alike():
    model = _model(aux_weight=0.5)
    model.hparams.model_cfg = {**model.hparams.model_cfg, "lr": 1e-3, "head_lr": 1e-2, "warmup_epochs": 1}
    model._trainer = SimpleNamespace(estimated_stepping_batches=10, max_epochs=2)
    configured = model.configure_optimizers()
    optimizer, scheduler = configured["optimizer"], configured["lr_scheduler"]["scheduler"]
    rate = {id(p): (g["initial_lr"], g["weight_decay"]) for g in optimizer.param_groups for p in g["params"]}
    decay = model.hparams.model_cfg["weight_decay"]
    assert rate[id(model.head.weight)] == rate[id(model.aux_head.weight)] == (1e-2, decay)
    assert rate[id(model.head.bias)] == (1e-2, 0.0)
    backbone = next(p for p in model.backbone.parameters() if p.ndim > 1)
    assert rate[id(backbone)] == (1e-3, decay)
    assert len(rate) == sum(p.requires_grad for p in model.parameters())  # every trained parameter, once
    for _ in range(3):  # the warm-up multiplies every group's rate by the same factor
        optimizer.step()
        scheduler.step()
    assert len({round(g["lr"] / g["initial_lr"], 12) for g in optimizer.param_groups}) == 1
    assert 0 < optimizer.param_groups[0]["lr"] < 1e-3


def test_without_head_lr_the_optimiser_keeps_its_two_groups():
    model = _model()
    model._trainer = SimpleNamespace(estimated_stepping_batches=10, max_epochs=2)
    groups = model.configure_optimizers()["optimizer"].param_groups
    assert [g["weight_decay"] for g in groups] == [model.hparams.model_cfg["weight_decay"], 0.0]
