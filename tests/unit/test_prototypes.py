"""Prototype prompting (training/zeroshot/prototypes.py) on hand-sized embeddings, and on the clip adapter."""

from __future__ import annotations

import json
import math

import pytest
import torch

from training.data.findings import TASK1_LABELS, TASK2_LABELS
from training.zeroshot.prototypes import (
    PrototypeClipClassifier,
    class_prototypes,
    prototype_prompts,
    select_confident,
)

MODEL_CFG = {"backbone": "resnet18", "pretrained": False, "lr": 1e-3, "weight_decay": 0.0}
LOSS_CFG = {"_target_": "training.losses.bce.BCELoss"}


def test_two_class_toy_set_by_hand():
    """Four unit image embeddings in 2-D, two unseen classes, threshold 0.6, at most 2 images per class."""
    z = torch.tensor([[1.0, 0.0], [0.6, 0.8], [0.0, 1.0], [-1.0, 0.0]])
    probs = torch.tensor([[0.9, 0.1], [0.8, 0.2], [0.3, 0.3], [0.7, 0.4]])
    selected = select_confident(probs, threshold=0.6, max_samples=2)
    # class 0: images 0, 1, 3 pass 0.6; the two most confident are 0 (0.9) and 1 (0.8). Class 1: none passes.
    assert selected.tolist() == [[True, False], [True, False], [False, False], [False, False]]
    prototypes, counts = class_prototypes(z, selected)
    # mean of [1, 0] and [0.6, 0.8] is [0.8, 0.4], of norm sqrt(0.8)
    assert counts.tolist() == [2.0, 0.0]
    assert prototypes[0].tolist() == pytest.approx([0.8 / math.sqrt(0.8), 0.4 / math.sqrt(0.8)], abs=1e-6)
    text = torch.tensor([[0.0, 1.0], [1.0, 0.0]])
    prompts = prototype_prompts(text, prototypes, counts, weight=0.5)
    # 0.5 [0, 1] + 0.5 [0.894427, 0.447214] = [0.447214, 0.723607], norm 0.850651 -> [0.525731, 0.850651]
    assert prompts[0].tolist() == pytest.approx([0.525731, 0.850651], abs=1e-6)
    assert prompts[1].tolist() == [1.0, 0.0]  # no confident image: the text prompt stays
    # Final score of image 1 for class 0 with negative prompt [-1, 0] and scale 10:
    # 10 * (0.6 * 0.525731 + 0.8 * 0.850651 - (0.6 * -1)) = 10 * (0.315439 + 0.680521 + 0.6) = 15.95960
    negative = torch.tensor([-1.0, 0.0])
    assert float(10 * (z[1] @ prompts[0] - z[1] @ negative)) == pytest.approx(15.95960, abs=1e-4)
    assert prototype_prompts(text, prototypes, counts, weight=0.0).tolist() == text.tolist()


@pytest.fixture
def tiny_clip(tmp_path):
    from tests.benchmark_data import TINY_CLIP

    folder = tmp_path / "tiny_clip"
    folder.mkdir()
    (folder / "open_clip_config.json").write_text(json.dumps(TINY_CLIP))
    return f"local-dir:{folder}"


def test_clip_adapter_scores_unseen_classes_with_prototype_prompts_and_keeps_them(tiny_clip, tmp_path):
    cfg = {"model": tiny_clip, "pretrained": None, "finetune": "head", "cache_dir": str(tmp_path / "emb"),
           "proxy": {"k": 0}, "prototypes": {"threshold": 0.0, "max_samples": 3, "weight": 0.25}}  # fmt: skip
    labels, unseen = list(TASK1_LABELS[:8]), list(TASK2_LABELS)
    torch.manual_seed(0)
    model = PrototypeClipClassifier(MODEL_CFG, LOSS_CFG, labels, adapter_cfg=cfg, unseen=unseen).eval()
    with torch.no_grad():
        model.head.adapter.weight.normal_(0, 0.1)  # a trained adapter: prototypes live after it, in the head's space
    images = torch.randn(7, 1, 32, 32)
    text_only = model.unseen_logits(images)  # before any pool: the clip adapter's text prompts
    model.fit_prototypes([{"image": images[:4]}, {"image": images[4:]}])
    with torch.no_grad():
        z = model.backbone(images)
        z = torch.nn.functional.normalize(z + model.head.adapter(z), dim=-1)  # (7, D)
        scale, bias = model.head.scale, model.head.bias.mean()
        logits = scale * (z @ model.unseen_positive.T - z @ model.unseen_negative.T) + bias  # text only (7, U)
    torch.testing.assert_close(text_only, logits)
    for u in range(len(unseen)):
        top = sorted(range(7), key=lambda i: -float(logits[i, u]))[:3]  # threshold 0: the 3 most confident
        p = z[top].mean(0)
        prompt = 0.75 * model.unseen_positive[u] + 0.25 * p / p.norm()
        prompt = prompt / prompt.norm()
        hand = scale * (z @ prompt - z @ model.unseen_negative[u]) + bias
        torch.testing.assert_close(model.unseen_logits(images)[:, u], hand, atol=1e-5, rtol=1e-5)
    assert model.prototype_counts.tolist() == [3.0] * len(unseen)
    reloaded = PrototypeClipClassifier(MODEL_CFG, LOSS_CFG, labels, adapter_cfg=cfg, unseen=unseen).eval()
    reloaded.load_state_dict(model.state_dict())  # the prompts are buffers: a checkpoint scores as it was tested
    torch.testing.assert_close(reloaded.unseen_logits(images), model.unseen_logits(images))
