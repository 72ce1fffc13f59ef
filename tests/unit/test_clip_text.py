"""CLIP prompt encoding over real tokens only: the same embeddings as open_clip's full-length ``encode_text``."""

from __future__ import annotations

import open_clip
import pytest
import torch

from training.zeroshot.clip_text import ClipTextEncoder, encode_text, pooled_positions

TEXT_CFG = {"context_length": 77, "vocab_size": 49408, "width": 32, "heads": 2, "layers": 2}
VISION_CFG = {"image_size": 32, "layers": 1, "width": 32, "head_width": 16, "patch_size": 8}
PROMPTS = ["a chest x-ray showing bulla", "no finding", "a chest x-ray showing no subcutaneous emphysema, seen as air "
           "under the skin of the chest wall and neck", "goiter"]  # fmt: skip


def tiny_tower(**text_cfg) -> open_clip.CLIP:
    torch.manual_seed(0)
    return open_clip.CLIP(embed_dim=16, vision_cfg=VISION_CFG, text_cfg={**TEXT_CFG, **text_cfg}).eval()


@pytest.fixture(scope="module")
def tokenizer():
    return open_clip.get_tokenizer("ViT-B-32")


@torch.no_grad()
def test_trimmed_embeddings_equal_the_full_length_ones(tokenizer):
    model, ids = tiny_tower(), tokenizer(PROMPTS)
    assert pooled_positions(model, ids).max() < 40  # the batch is cut well before the 77 padded positions
    torch.testing.assert_close(encode_text(model, ids), model.encode_text(ids, normalize=True), rtol=0, atol=1e-6)


@torch.no_grad()
def test_a_prompt_of_maximum_length_encodes_whole(tokenizer):
    model, ids = tiny_tower(), tokenizer(["effusion " * 100, "no finding"])
    assert ids[0, -1] == ids.max() and pooled_positions(model, ids).tolist() == [76, 3]  # EOT at the last position
    torch.testing.assert_close(encode_text(model, ids), model.encode_text(ids, normalize=True), rtol=0, atol=1e-6)


def test_a_tower_without_causal_mask_or_end_of_text_pooling_runs_at_full_length(tokenizer):
    ids = tokenizer(PROMPTS)
    assert pooled_positions(tiny_tower(no_causal_mask=True), ids) is None
    assert pooled_positions(tiny_tower(pool_type="last"), ids) is None


@torch.no_grad()
def test_the_encoder_encodes_each_distinct_prompt_once_and_keeps_the_order(tokenizer):
    model, seen = tiny_tower(), []

    def counting(texts):
        seen.extend(texts)
        return tokenizer(texts)

    texts = [PROMPTS[2], PROMPTS[0], PROMPTS[2], PROMPTS[1], PROMPTS[3], PROMPTS[0]]
    rows = ClipTextEncoder(model, counting, None, batch_size=2).encode(texts)
    assert sorted(seen) == sorted(PROMPTS)
    torch.testing.assert_close(torch.from_numpy(rows), model.encode_text(tokenizer(texts), normalize=True),
                               rtol=0, atol=1e-6)  # fmt: skip
