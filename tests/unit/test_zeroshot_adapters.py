"""Task 2 adapters: prompt-pair softmax, semantic scoring, leak guard, proxy-OOD masking, tiny open_clip."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import torch
from sklearn.metrics import average_precision_score

from training.data.datamodule import CXRDataModule
from training.data.findings import CXRLT_FINDINGS, TASK1_LABELS, TASK2_LABELS
from training.data.sources import ManifestSource
from training.losses.bce import BCELoss
from training.zeroshot.clip import ClipClassifier, PromptPairHead
from training.zeroshot.leak_guard import SeenOnlySource
from training.zeroshot.proxy_ood import ProxyOOD, proxy_splits
from training.zeroshot.semantic import SemanticClassifier, SemanticHead
from training.zeroshot.transfer import Transfer, conse_weights, parse_transfers

MODEL_CFG = {"backbone": "resnet18", "pretrained": False, "lr": 1e-3, "weight_decay": 0.0}
LOSS_CFG = {"_target_": "training.losses.bce.BCELoss"}
HASHING = {"_target_": "training.zeroshot.text_encoders.HashingEncoder", "dim": 64}


def _unit(x):
    x = torch.as_tensor(x, dtype=torch.float32)
    return x / x.norm(dim=-1, keepdim=True)


def test_prompt_pair_probability_is_the_two_way_softmax_by_hand():
    positive, negative = _unit([[1.0, 0.0, 0.0], [0.0, 1.0, 1.0]]), _unit([[0.0, 1.0, 0.0], [1.0, 0.0, 1.0]])
    z = _unit([[0.6, 0.8, 0.0], [0.0, 0.3, 0.95]])
    head = PromptPairHead(positive, negative, scale=20.0, residual=False)
    probs = torch.sigmoid(head(z)).detach().numpy()
    zp, zn, pp, nn_ = z.numpy(), z.numpy(), positive.numpy(), negative.numpy()
    for i in range(2):
        for c in range(2):
            a, b = 20.0 * zp[i] @ pp[c], 20.0 * zn[i] @ nn_[c]
            assert probs[i, c] == pytest.approx(np.exp(a) / (np.exp(a) + np.exp(b)), abs=1e-6)
    # z[0] sits at cos 0.6 to "finding" and 0.8 to "no finding" of class 0: below one half, as it should.
    assert probs[0, 0] < 0.5
    # The residual adapter starts at zero: fine-tuning begins exactly at the zero-shot model.
    tuned = PromptPairHead(positive, negative, scale=20.0, residual=True)
    torch.testing.assert_close(tuned(z), head(z))


def test_semantic_head_is_scaled_cosine_plus_bias_and_unseen_use_the_mean_bias():
    text = _unit([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    head = SemanticHead(3, text, init_scale=5.0)
    with torch.no_grad():
        head.projection.weight.copy_(torch.tensor([[1.0, 0.0, 0.0], [0.0, 2.0, 0.0]]))
        head.projection.bias.zero_()
        head.bias.copy_(torch.tensor([0.1, 0.2, 0.6]))
    f = torch.tensor([[3.0, 0.0, 7.0], [1.0, 0.5, 0.0]])  # projections (3, 0) and (1, 1)
    z = _unit([[3.0, 0.0], [1.0, 1.0]])
    torch.testing.assert_close(head(f), 5.0 * z @ text.T + torch.tensor([0.1, 0.2, 0.6]))
    unseen = _unit([[1.0, -1.0]])
    torch.testing.assert_close(head(f, unseen), 5.0 * z @ unseen.T + 0.3)


def _semantic(labels, unseen, tmp_path, **adapter):
    cfg = {"text_encoder": HASHING, "cache_dir": str(tmp_path / "emb"), "dual": True, "proxy": {"k": 2, "size": 3},
           **adapter}  # fmt: skip
    return SemanticClassifier(MODEL_CFG, LOSS_CFG, list(labels), adapter_cfg=cfg, unseen=list(unseen))


def test_leak_guard_drops_unseen_columns_and_no_unseen_label_reaches_the_loss(make_manifest, tmp_path):
    path = make_manifest(n=36, labels=list(CXRLT_FINDINGS))
    flipped = pd.read_csv(path)
    test = flipped["split"] == "test"  # train/val images of an unseen finding leave training (docs/rules.md §11)
    flipped.loc[test, list(TASK2_LABELS)] = 1 - flipped.loc[test, list(TASK2_LABELS)]  # opposite test labels
    flipped_path = tmp_path / "flipped.csv"
    flipped.to_csv(flipped_path, index=False)
    recorded = {}
    for name, manifest in (("original", path), ("flipped", flipped_path)):
        source = SeenOnlySource(ManifestSource(str(manifest), root=str(tmp_path)), TASK2_LABELS, tmp_path / f"g-{name}")
        guarded = source.prepare()
        columns = set(pd.read_csv(guarded).columns)
        assert not columns & set(TASK2_LABELS) and set(TASK1_LABELS) <= columns
        assert source.dropped == TASK2_LABELS
        assert source.run_tags["cxrlt.leak_guard.dropped_columns"] == ",".join(TASK2_LABELS)
        assert source.root == tmp_path and source.name == "manifest"  # passed through to the data module
        datamodule = CXRDataModule(source, TASK1_LABELS, image_size=32, batch_size=12, subset=None)
        datamodule.setup("fit")
        torch.manual_seed(0)
        model = _semantic(TASK1_LABELS, TASK2_LABELS, tmp_path)
        seen_by_loss = []

        def spy(logits, targets, mask=None, calls=seen_by_loss, forward=model.loss.forward):
            calls.append((logits.shape[1], targets.clone(), None if mask is None else mask.clone()))
            return forward(logits, targets, mask)

        model.loss.forward = spy
        batch = next(iter(datamodule.eval_dataloader("train")))
        loss = model.training_step(batch, 0)
        assert all(width == len(TASK1_LABELS) for width, _, _ in seen_by_loss)  # only seen columns ever
        recorded[name] = (float(loss.detach()), [t for _, t, _ in seen_by_loss], (guarded.read_bytes()))
    # Flipping the test split's unseen labels changes nothing the training can see: the guarded file, targets, loss.
    assert recorded["original"][2] == recorded["flipped"][2]
    assert recorded["original"][0] == pytest.approx(recorded["flipped"][0])
    for a, b in zip(recorded["original"][1], recorded["flipped"][1], strict=True):
        assert torch.equal(a, b)


def test_leak_guard_is_a_pass_through_without_unseen_columns(make_manifest, tmp_path):
    path = make_manifest(n=9, labels=list(TASK1_LABELS))
    source = SeenOnlySource(ManifestSource(str(path)), TASK2_LABELS, tmp_path / "g")
    assert source.prepare() == path and source.dropped == ()
    assert source.run_tags["cxrlt.leak_guard.dropped_columns"] == "(none present)"


def test_proxy_splits_are_disjoint_and_cover_the_seen_classes():
    splits = proxy_splits(30, k=5, size=6, seed=3)
    flat = [c for s in splits for c in s]
    assert len(splits) == 5 and all(len(s) == 6 for s in splits) and sorted(flat) == list(range(30))
    assert splits == proxy_splits(30, k=5, size=6, seed=3) != proxy_splits(30, k=5, size=6, seed=4)
    more = proxy_splits(12, k=4, size=6, seed=0)  # 4 x 6 > 12: independent draws, still 6 each
    assert all(len(set(s)) == 6 for s in more)
    with pytest.raises(ValueError):
        proxy_splits(6, k=1, size=6)


def test_proxy_ood_never_puts_a_pseudo_unseen_class_into_the_loss():
    torch.manual_seed(0)
    n_classes, n_features = 10, 16
    text = _unit(torch.randn(n_classes, 8))
    proxy = ProxyOOD(lambda: SemanticHead(n_features, text), n_classes, k=3, size=3, seed=1)
    loss_fn = BCELoss()
    features = torch.randn(20, n_features)
    targets = (torch.rand(20, n_classes) < 0.3).float()
    labelled = torch.ones_like(targets, dtype=torch.bool)

    masks = []
    spy = lambda logits, t, mask: masks.append(mask.clone()) or loss_fn(logits, t, mask)  # noqa: E731
    proxy.loss(features, targets, labelled, spy)
    for mask, unseen in zip(masks, proxy.splits, strict=True):
        assert not mask[:, unseen].any() and mask[:, [c for c in range(n_classes) if c not in unseen]].all()

    def value_and_grads(t):
        proxy.zero_grad()
        value = proxy.loss(features, t, labelled, loss_fn)
        value.backward()
        return float(value.detach()), [p.grad.clone() for p in proxy.parameters()]

    base, base_grads = value_and_grads(targets)
    for i, unseen in enumerate(proxy.splits):
        # Flip the pseudo-unseen labels of split i: head i's loss and gradients must not move.
        flipped = targets.clone()
        flipped[:, unseen] = 1 - flipped[:, unseen]
        proxy.zero_grad()
        head_loss = lambda t, h=proxy.heads[i], s=proxy.pseudo_seen[i]: loss_fn(h(features), t * s, labelled & s)  # noqa: E731
        a, b = head_loss(targets), head_loss(flipped)
        assert float(a.detach()) == pytest.approx(float(b.detach()))
        ga = torch.autograd.grad(a, list(proxy.heads[i].parameters()))
        gb = torch.autograd.grad(b, list(proxy.heads[i].parameters()))
        assert all(torch.equal(x, y) for x, y in zip(ga, gb, strict=True))
    seen_flip = targets.clone()
    seen_flip[:, 0] = 1 - seen_flip[:, 0]  # a class pseudo-seen in some split does move the total
    assert value_and_grads(seen_flip)[0] != pytest.approx(base)


def test_proxy_ood_map_is_the_mean_pseudo_unseen_ap_over_splits():
    torch.manual_seed(1)
    n_classes = 8
    proxy = ProxyOOD(lambda: SemanticHead(4, _unit(torch.randn(n_classes, 5))), n_classes, k=2, size=3, seed=0)
    features = torch.randn(40, 4)
    targets = (torch.rand(40, n_classes) < 0.4).float()
    proxy.update(features[:25], targets[:25])
    proxy.update(features[25:], targets[25:])
    values = proxy.compute()
    expected = []
    for head, unseen in zip(proxy.heads, proxy.splits, strict=True):
        scores = head(features).detach()[:, unseen].numpy()
        expected.append(np.mean([average_precision_score(targets[:, c].numpy(), scores[:, j])
                                 for j, c in enumerate(unseen)]))  # fmt: skip
    for i, value in enumerate(expected):
        assert float(values[f"direct/split{i}/mAP"]) == pytest.approx(value, abs=1e-5)
    assert float(values["mAP"]) == pytest.approx(np.mean(expected), abs=1e-5)


def test_semantic_classifier_scores_seen_and_unseen_and_saves_its_text(tmp_path):
    model = _semantic(["Kyphosis", "Mass", "Nodule", "Emphysema", "Normal", "Fracture"], TASK2_LABELS, tmp_path)
    images = torch.randn(3, 1, 32, 32)
    model.eval()
    assert model(images).shape == (3, 6) and model.unseen_logits(images).shape == (3, 6)
    assert model.hparams["unseen"] == list(TASK2_LABELS)  # rebuilt from a checkpoint with its unseen classes
    state = model.state_dict()
    assert state["unseen_text"].shape == (6, 64) and state["head.text"].shape == (6, 64)
    clone = _semantic(["Kyphosis", "Mass", "Nodule", "Emphysema", "Normal", "Fracture"], TASK2_LABELS, tmp_path)
    clone.load_state_dict(state)
    clone.eval()
    torch.testing.assert_close(clone.unseen_logits(images), model.unseen_logits(images))


@pytest.fixture
def tiny_clip(tmp_path):
    from tests.benchmark_data import TINY_CLIP

    folder = tmp_path / "tiny_clip"
    folder.mkdir()
    (folder / "open_clip_config.json").write_text(json.dumps(TINY_CLIP))
    return f"local-dir:{folder}"


def test_clip_adapter_runs_offline_on_a_random_tiny_model(tiny_clip, tmp_path):
    cache = tmp_path / "emb"
    cfg = {
        "model": tiny_clip,
        "pretrained": None,
        "finetune": "none",
        "cache_dir": str(cache),
        "proxy": {"k": 2, "size": 3},
    }
    torch.manual_seed(0)
    model = ClipClassifier(MODEL_CFG, LOSS_CFG, list(TASK1_LABELS[:8]), adapter_cfg=cfg, unseen=list(TASK2_LABELS))
    model.eval()
    images = torch.randn(4, 1, 48, 48)  # any size: resized to the tower's 32 px
    seen, unseen = model(images), model.unseen_logits(images)
    assert seen.shape == (4, 8) and unseen.shape == (4, 6)
    # Hand check on the image embedding: the unseen logit is s * (z.t+ - z.t-) for the tiny model's scale.
    z = model.backbone(images)
    hand = model.head.scale * (z @ model.unseen_positive.T - z @ model.unseen_negative.T)
    torch.testing.assert_close(unseen, hand)
    assert not torch.allclose(model.unseen_positive, model.unseen_negative)
    assert model.training_step({"image": images, "target": torch.zeros(4, 8)}, 0) is None  # zero-shot: no step
    assert not cache.exists()  # a random tower's text embeddings are never cached
    tuned = ClipClassifier(MODEL_CFG, LOSS_CFG, list(TASK1_LABELS[:8]), adapter_cfg={**cfg, "finetune": "head"},
                           unseen=list(TASK2_LABELS))  # fmt: skip
    trainable = {n.split(".")[0] for n, p in tuned.named_parameters() if p.requires_grad}
    assert trainable == {"head", "proxy"}  # the image tower stays frozen


@pytest.mark.parametrize("kind", ["clip", "semantic"])
def test_a_network_rebuilt_for_its_checkpoint_encodes_one_prompt_not_the_bank_and_scores_as_trained(
    kind, tiny_clip, tmp_path, monkeypatch
):
    """What ``load_finished`` builds (``text_from_checkpoint``): the checkpoint's class embeddings, not the bank's."""
    from training.zeroshot import clip_text, text_encoders
    from training.zeroshot.text_side import FROM_CHECKPOINT

    encoder = clip_text.ClipTextEncoder if kind == "clip" else text_encoders.HashingEncoder
    encoded: list[int] = []
    original = encoder.encode
    monkeypatch.setattr(encoder, "encode", lambda self, texts: encoded.append(len(texts)) or original(self, texts))
    seen = list(TASK1_LABELS[:8])

    def build(extra: dict):
        if kind == "clip":
            cfg = {"model": tiny_clip, "pretrained": None, "finetune": "head", "proxy": {"k": 2, "size": 3}, **extra}
            return ClipClassifier(MODEL_CFG, LOSS_CFG, seen, adapter_cfg=cfg, unseen=list(TASK2_LABELS))
        cfg = {
            "text_encoder": HASHING,
            "cache_dir": None,
            "transfer": "auto",
            "transfer_candidates": ["direct", "conse3"],
            "proxy": {"k": 2, "size": 3},
            **extra,
        }
        return SemanticClassifier(MODEL_CFG, LOSS_CFG, seen, adapter_cfg=cfg, unseen=list(TASK2_LABELS))

    torch.manual_seed(0)
    trained = build({}).eval()
    assert sum(encoded) > 100  # the bank: every class's templates and phrasings
    encoded.clear()
    rebuilt = build({FROM_CHECKPOINT: True})
    assert encoded == [1] * (2 if kind == "clip" else 1)  # one prompt per side, for the embedding width
    rebuilt.load_state_dict(trained.state_dict())
    rebuilt.eval()
    images = torch.randn(3, 1, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(rebuilt(images), trained(images))
        torch.testing.assert_close(rebuilt.unseen_logits(images), trained.unseen_logits(images))


def test_conse_weights_are_a_convex_combination_of_the_nearest_classes():
    support = _unit(torch.eye(4))
    query = _unit([[0.9, 0.5, 0.1, -0.3]])
    weights = conse_weights(query, support, k=2)
    torch.testing.assert_close(weights, torch.tensor([[0.9, 0.5, 0.0, 0.0]]) / 1.4)
    assert conse_weights(query, support, k=4)[0, 3] == 0  # negative similarity: no weight
    # A disallowed (absence) class never supports, even when nearest: the next ones take its place.
    allowed = torch.tensor([False, True, True, True])
    torch.testing.assert_close(conse_weights(query, support, k=2, allowed=allowed),
                               torch.tensor([[0.0, 0.5, 0.1, 0.0]]) / 0.6)  # fmt: skip


def test_transfer_names_parse_and_bad_ones_are_refused():
    assert Transfer.parse("direct") == Transfer("direct") and Transfer.parse("conse3") == Transfer("conse3", 3)
    assert [t.name for t in parse_transfers("auto", ["direct", "conse1", "direct"])] == ["direct", "conse1"]
    for bad in ("conse", "conse0", "cosine", "conse-3"):
        with pytest.raises(ValueError, match="transfer"):
            Transfer.parse(bad)
    with pytest.raises(ValueError, match="transfer_candidates"):
        parse_transfers("auto", [])


def test_conse_transfer_scores_unseen_from_seen_logits_without_normal_and_proxy_weights_skip_pseudo_unseen(tmp_path):
    labels = ["Kyphosis", "Mass", "Nodule", "Emphysema", "Normal", "Fracture", "Cardiomegaly", "Hernia"]
    model = _semantic(labels, TASK2_LABELS, tmp_path, transfer="conse3")
    model.eval()
    images = torch.randn(3, 1, 32, 32)
    weights = model.unseen_weights[0]  # (U, C)
    assert weights.shape == (6, 8) and torch.allclose(weights.sum(dim=1), torch.ones(6))
    assert ((weights > 0).sum(dim=1) <= 3).all()
    assert (weights[:, labels.index("Normal")] == 0).all()  # an absence class never supports a finding
    torch.testing.assert_close(model.unseen_logits(images), model(images) @ weights.T)
    for i, unseen in enumerate(model.proxy.splits):  # a pseudo-unseen class is never scored from its own logit
        w = model.proxy.weights[i, 0]  # (size, C)
        assert (w[:, unseen] == 0).all() and (w[:, labels.index("Normal")] == 0).all()
        torch.testing.assert_close(w.sum(dim=1), torch.ones(len(unseen)))


def test_auto_transfer_picks_the_candidate_with_the_best_pseudo_unseen_map_and_the_checkpoint_keeps_it(tmp_path):
    labels = ["Kyphosis", "Mass", "Nodule", "Emphysema", "Normal", "Fracture", "Cardiomegaly", "Hernia"]
    model = _semantic(
        labels, TASK2_LABELS, tmp_path, transfer="auto", transfer_candidates=["direct", "conse1", "conse3"]
    )
    assert [t.name for t in model.transfers] == ["direct", "conse1", "conse3"]
    torch.manual_seed(0)
    features = torch.randn(60, model.backbone.num_features)
    targets = (torch.rand(60, len(labels)) < 0.3).float()
    model.proxy.update(features, targets)
    # The reference: each candidate's pseudo-unseen mAP by sklearn, from the proxy heads' own logits.
    expected = []
    for t, transfer in enumerate(model.proxy.transfers):
        per_split = []
        for i, (head, unseen) in enumerate(zip(model.proxy.heads, model.proxy.splits, strict=True)):
            logits = head(features).detach()
            scores = logits[:, unseen] if transfer.k is None else logits @ model.proxy.weights[i, t].T
            per_split.append(np.mean([average_precision_score(targets[:, c], scores[:, j])
                                      for j, c in enumerate(unseen)]))  # fmt: skip
        expected.append(np.mean(per_split))
    logged = {}
    model.log = lambda name, value, **kw: logged.__setitem__(name, float(value))
    choice = model.proxy.log_epoch(model, choose=True)
    assert choice == int(np.argmax(expected))
    assert logged["val/proxy_ood_mAP"] == pytest.approx(max(expected), abs=1e-5)
    for name, value in zip(["direct", "conse1", "conse3"], expected, strict=True):
        assert logged[f"val/proxy_ood/{name}/mAP"] == pytest.approx(value, abs=1e-5)
    model.transfer_choice.fill_(2)
    clone = _semantic(
        labels, TASK2_LABELS, tmp_path, transfer="auto", transfer_candidates=["direct", "conse1", "conse3"]
    )
    clone.load_state_dict(model.state_dict())
    assert clone.transfer == "conse3" and int(clone.transfer_choice) == 2
    with pytest.raises(ValueError, match="proxy.k"):
        _semantic(labels, TASK2_LABELS, tmp_path, transfer="auto", transfer_candidates=["direct"], proxy={"k": 0})
