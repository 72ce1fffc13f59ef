"""An open_clip text tower as a ``TextEncoder``, run over each prompt's real tokens only.

Prompts are padded to 77 positions but hold about 12 real tokens. A causal tower pooled at the end-of-text token
cannot be changed by later positions, so cutting a batch after its longest prompt (prompts sorted by length)
gives the same embeddings for about a sixth of the work. A tower that attends both ways or pools another position
(BiomedCLIP's BERT, SigLIP) is run at full length.
"""

from __future__ import annotations

import open_clip
import torch
import torch.nn.functional as F

from training.zeroshot.text_encoders import TextEncoder


def pooled_positions(model, ids: torch.Tensor) -> torch.Tensor | None:
    """``(N,)`` index of the token each row's embedding is read at, when nothing after it can influence it (a
    causal open_clip CLIP tower with ``argmax`` pooling); None for any other tower."""
    causal = isinstance(model, open_clip.CLIP) and model.attn_mask is not None
    return ids.argmax(dim=-1) if causal and model.text_pool_type == "argmax" else None


def encode_text(model, ids: torch.Tensor) -> torch.Tensor:
    """``model.encode_text(ids, normalize=True)``, computed on the positions up to the batch's last pooled token."""
    last = pooled_positions(model, ids)
    if last is None:
        return model.encode_text(ids, normalize=True)
    n = int(last.max()) + 1
    dtype = model.transformer.get_cast_dtype()
    x = model.token_embedding(ids[:, :n]).to(dtype) + model.positional_embedding[:n].to(dtype)
    x = model.ln_final(model.transformer(x, attn_mask=model.attn_mask[:n, :n]))[torch.arange(len(ids)), last]
    projection = model.text_projection
    x = x if projection is None else projection(x) if isinstance(projection, torch.nn.Linear) else x @ projection
    return F.normalize(x, dim=-1)


class ClipTextEncoder(TextEncoder):
    """An open_clip text tower as a ``TextEncoder``; cacheable only when its weights are named."""

    def __init__(self, model, tokenizer, identity: str | None, batch_size: int = 128):
        self.model, self.tokenizer, self.identity, self.batch_size = model, tokenizer, identity, batch_size

    @property
    def cache_key(self) -> str | None:
        return self.identity

    @torch.no_grad()
    def encode(self, texts):
        """Each distinct text once, in batches of similar length; rows in the order of ``texts``."""
        unique = list(dict.fromkeys(texts))
        ids = self.tokenizer(unique)
        order = (ids != 0).sum(dim=-1).argsort()  # by length: 0 pads open_clip's and BERT's ids (order only)
        rows = torch.cat([encode_text(self.model, ids[chunk]).float() for chunk in order.split(self.batch_size)])
        at = dict(zip((unique[i] for i in order.tolist()), range(len(unique)), strict=True))
        return rows[[at[text] for text in texts]].numpy()  # (N, D)
