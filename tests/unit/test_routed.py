"""View routing: images reach the expert the router (inference) or the manifest view (training) names, and no other;
manifest view spellings fold onto the configured views."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from training.data.datamodule import CXRDataModule
from training.data.dataset import canonical_view, view_indices
from training.data.sources import ManifestSource
from training.models import routed
from training.models.factory import build_model
from training.models.routed import ViewRoutedClassifier
from training.samplers.random import RandomSampling

LABELS = ["a", "b", "c"]
BCE = {"_target_": "training.losses.bce.BCELoss"}
DB = {"_target_": "training.losses.db.DistributionBalancedLoss"}


def _cfg(**overrides) -> dict:
    cfg = {
        "module": "training.models.routed.ViewRoutedClassifier",
        "backbone": "resnet10t",
        "views": ["PA", "AP", "LATERAL"],
        "router": {"backbone": "resnet10t"},
        "router_weight": 0.5,
        "lr": 1e-3,
        "weight_decay": 0.0,
    }
    return {**cfg, **overrides}


def _model(loss=BCE, **overrides) -> ViewRoutedClassifier:
    torch.manual_seed(0)
    model = build_model(_cfg(**overrides), loss, LABELS)
    assert isinstance(model, ViewRoutedClassifier)
    return model


def _images(n: int = 6) -> torch.Tensor:
    return torch.randn(n, 1, 32, 32, generator=torch.Generator().manual_seed(1))


def _force_router(model, routes: list[int]) -> torch.Tensor:
    """Make the router answer ``routes`` whatever the images: logits 5 on the chosen view, 0 elsewhere."""
    logits = torch.nn.functional.one_hot(torch.tensor(routes), len(model.views)).float() * 5.0
    model.route = lambda images: logits
    return logits


@pytest.mark.parametrize(
    ("value", "view"),
    [("PA", "PA"), ("pa", "PA"), (" P-A ", "PA"), ("PA LLD", "PA"), ("Posteroanterior", "PA"),
     ("AP", "AP"), ("AP Supine", "AP"), ("ap_horizontal", "AP"), ("AP AXIAL", "AP"),
     ("LL", "LATERAL"), ("LATERAL", "LATERAL"), ("Lateral", "LATERAL"), ("XTABLE LATERAL", "LATERAL"),
     ("Left lateral", "LATERAL"), ("LAO", "LAO"), ("", None), ("nan", None), (float("nan"), None), (None, None)],
)  # fmt: skip
def test_manifest_view_spellings_fold_onto_one_name(value, view):
    assert canonical_view(value) == view


def test_view_indices_are_positions_in_the_configured_list_and_minus_one_otherwise():
    values = ["pa", "AP Supine", "LL", "LAO", "", float("nan"), "PA"]
    assert view_indices(values, ["AP", "pa", "Lateral"]).tolist() == [1, 0, 2, -1, -1, -1, 1]


def test_hard_routing_returns_each_rows_chosen_expert_output():
    model = _model().eval()
    images, routes = _images(), [2, 0, 1, 0, 2, 1]
    _force_router(model, routes)
    with torch.no_grad():
        out = model(images)
        experts = list(model.experts.values())
        expected = torch.stack([experts[r](images[b : b + 1])[0] for b, r in enumerate(routes)])
        others = torch.stack([experts[(r + 1) % 3](images[b : b + 1])[0] for b, r in enumerate(routes)])
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(out, others, atol=1e-3)  # the experts differ, so the check above has teeth


def test_soft_routing_mixes_expert_probabilities_by_router_probabilities():
    model = _model(routing="soft").eval()
    images = _images(4)
    router_logits = _force_router(model, [0, 1, 2, 1])
    with torch.no_grad():
        weights = router_logits.softmax(dim=1)
        probs = sum(weights[:, i, None] * torch.sigmoid(e(images)) for i, e in enumerate(model.experts.values()))
        torch.testing.assert_close(torch.sigmoid(model(images)), probs, atol=1e-5, rtol=1e-4)


def test_temperature_divides_the_routed_logits():
    model = _model().eval()
    images = _images(3)
    _force_router(model, [0, 1, 0])
    with torch.no_grad():
        plain = model(images)
        model.logit_temperature.fill_(2.0)
        torch.testing.assert_close(model(images), plain / 2.0)


def _grad_norm(module) -> float:
    return sum(float(p.grad.abs().sum()) for p in module.parameters() if p.grad is not None)


def test_training_loss_reaches_only_the_experts_of_the_batchs_views_and_the_router():
    model = _model().train()
    images = _images(6)
    targets = torch.randint(0, 2, (6, 3)).float()
    views = torch.tensor([0, 0, 1, 1, 0, 1])  # PA and AP only: no lateral image
    model.training_loss(images, targets, torch.ones_like(targets, dtype=torch.bool), views).backward()
    assert _grad_norm(model.experts["PA"]) > 0 and _grad_norm(model.experts["AP"]) > 0
    assert _grad_norm(model.experts["LATERAL"]) == 0
    assert _grad_norm(model.router) > 0


def test_training_loss_is_the_view_experts_loss_plus_weighted_router_cross_entropy():
    model = _model().eval()  # eval: batch-norm alike for the whole batch and its parts
    images = _images(4)
    targets = torch.randint(0, 2, (4, 3)).float()
    mask = torch.ones_like(targets, dtype=torch.bool)
    views = torch.tensor([1, 1, 1, 1])
    with torch.no_grad():
        loss = model.training_loss(images, targets, mask, views)
        expected = model.loss(model.experts["AP"](images), targets, mask) + 0.5 * torch.nn.functional.cross_entropy(
            model.router(images), views
        )
    torch.testing.assert_close(loss, expected)


def test_unknown_views_train_the_fallback_expert_and_not_the_router():
    model = _model(fallback_view="ap").train()
    images = _images(4)
    targets = torch.randint(0, 2, (4, 3)).float()
    model.training_loss(images, targets, torch.ones_like(targets, dtype=torch.bool), torch.full((4,), -1)).backward()
    assert _grad_norm(model.experts["AP"]) > 0
    assert _grad_norm(model.experts["PA"]) == 0 and _grad_norm(model.experts["LATERAL"]) == 0
    assert _grad_norm(model.router) == 0  # no known view: no cross-entropy term


def test_unknown_views_without_fallback_go_where_the_router_sends_them():
    model = _model()
    routes = model.training_routes(torch.tensor([2, -1, -1]), torch.tensor([[9.0, 0, 0], [0, 9.0, 0], [0, 0, 9.0]]))
    assert routes.tolist() == [2, 1, 2]


def test_training_without_views_in_the_batch_says_how_to_get_them():
    model = _model()
    targets = torch.zeros(2, 3)
    with pytest.raises(ValueError, match="views=model.views"):
        model.training_loss(_images(2), targets, targets >= 0)


def test_prior_bias_reaches_every_expert_head():
    model = _model(loss=DB)
    model.set_label_statistics(np.array([5, 50, 200]), 400)
    bias = model.loss.init_bias()
    assert bias is not None and not torch.allclose(bias, torch.zeros(3))
    for expert in model.experts.values():
        torch.testing.assert_close(expert.head.bias.detach(), bias.float())


def test_each_weight_is_stored_once_and_a_rebuilt_model_gives_identical_outputs():
    model = _model().eval()
    state = model.state_dict()
    assert not any(key.startswith(("backbone.", "head.")) for key in state)
    assert model.backbone is model.experts["PA"].backbone and model.head is model.experts["PA"].head
    rebuilt = build_model(_cfg(), BCE, LABELS)
    rebuilt.load_state_dict(state)
    with torch.no_grad():
        torch.testing.assert_close(rebuilt.eval()(_images()), model(_images()))


@pytest.mark.parametrize(
    ("overrides", "message"),
    [({"views": ["PA"]}, "two or more"), ({"views": ["PA", "pa"]}, "distinct"), ({"routing": "vote"}, "routing"),
     ({"fallback_view": "LAO"}, "fallback_view"), ({"aux_loss": {"weight": 0.3}}, "aux_loss")],
)  # fmt: skip
def test_bad_routing_configs_are_refused_by_name(overrides, message):
    with pytest.raises(ValueError, match=message):
        _model(**overrides)


def _datamodule(path, labels, views):
    return CXRDataModule(ManifestSource(str(path)), labels, image_size=24, batch_size=4, sampler=RandomSampling(),
                         views=views)  # fmt: skip


def test_batches_carry_the_view_index_only_when_asked(make_manifest, task1_labels):
    path = make_manifest(n=12)
    table = pd.read_csv(path)
    table["view"] = ["PA", "ap supine", "LL", "LAO"] * 3
    table.to_csv(path, index=False)
    routed = _datamodule(path, task1_labels, ["PA", "AP", "LATERAL"])
    routed.setup()
    frame = routed.split_frame("train")
    expected = view_indices(frame["view"], ["PA", "AP", "LATERAL"]).tolist()
    assert [int(routed.datasets["train"][i]["view"]) for i in range(len(frame))] == expected
    assert sorted(set(expected)) == [-1, 0, 1, 2]
    batch = next(iter(routed.eval_dataloader("train")))
    assert batch["view"].dtype == torch.int64 and batch["view"].tolist() == expected[:4]
    plain = _datamodule(path, task1_labels, None)
    plain.setup()
    assert "view" not in plain.datasets["train"][0]


def test_a_manifest_without_a_view_column_gives_unknown_views(make_manifest, task1_labels):
    path = make_manifest(n=9)
    pd.read_csv(path).drop(columns="view").to_csv(path, index=False)
    routed = _datamodule(path, task1_labels, ["PA", "AP"])
    routed.setup()
    assert [int(routed.datasets["val"][i]["view"]) for i in range(3)] == [-1, -1, -1]


def test_a_head_with_its_own_loss_trains_per_expert_on_that_experts_images_only():
    model = _model(head={"_target_": "training.models.heads.moe.MoEHead"}).train()
    images = _images(4)
    targets = torch.randint(0, 2, (4, 3)).float()
    loss = model.training_loss(images, targets, torch.ones_like(targets, dtype=torch.bool), torch.tensor([0, 2, 0, 2]))
    loss.backward()
    assert torch.isfinite(loss)
    assert _grad_norm(model.experts["PA"].head) > 0 and _grad_norm(model.experts["LATERAL"].head) > 0
    assert _grad_norm(model.experts["AP"]) == 0


@pytest.mark.parametrize(
    ("model_pretrained", "router_pretrained", "downloads"),
    [(False, True, False), (True, True, True), (True, False, False)],
)
def test_the_router_downloads_weights_only_under_model_pretrained(monkeypatch, model_pretrained, router_pretrained,
                                                                  downloads):  # fmt: skip
    """A reloaded run clears model.pretrained alone; the router must not fetch weights the checkpoint holds."""
    asked = []
    real = routed.create_backbone

    def spy(name, pretrained=False, **kwargs):
        asked.append(pretrained)
        return real(name, pretrained=False, **kwargs)

    monkeypatch.setattr(routed, "create_backbone", spy)
    monkeypatch.setattr(ViewRoutedClassifier, "_expert", lambda self, cfg: routed.Expert(torch.nn.Identity(),
                                                                                         torch.nn.Linear(1, 3)))  # fmt: skip
    _model(router={"backbone": "resnet10t", "pretrained": router_pretrained}, pretrained=model_pretrained)
    assert asked == [downloads]
