"""ML-Decoder-style query head (Ridnik et al., 2023): class queries cross-attend over the spatial feature map.

Global average pooling dilutes a small finding (a nodule, a line tip) with the rest of the image; a class query
attends over the locations and picks the regions that matter to it. As in ML-Decoder there is no self-attention
between queries (``O(Q^2)``, and the paper found it unnecessary). ``groups`` below ``C`` decodes fewer queries,
each expanded by its own linear map, to bound the cost of a large label set.
"""

from __future__ import annotations

import math

import torch
from torch import nn


class _CrossAttentionLayer(nn.Module):
    def __init__(self, dim: int, heads: int, dropout: float):
        super().__init__()
        self.attention = nn.MultiheadAttention(dim, heads, dropout=dropout, batch_first=True)
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.feed_forward = nn.Sequential(
            nn.Linear(dim, 2 * dim), nn.GELU(), nn.Dropout(dropout), nn.Linear(2 * dim, dim)
        )
        self.dropout = nn.Dropout(dropout)

    def forward(self, queries: torch.Tensor, memory: torch.Tensor) -> torch.Tensor:
        attended, _ = self.attention(queries, memory, memory, need_weights=False)
        queries = self.norm1(queries + self.dropout(attended))
        return self.norm2(queries + self.dropout(self.feed_forward(queries)))


class MLDecoderHead(nn.Module):
    """``(B, F, h, w)`` feature map (or ``(B, N, F)`` tokens) to ``(B, C)`` logits through learned queries.

    ``heads`` must divide ``dim``; ``groups`` ``None`` (or ``>= C``) is one query per class.
    """

    uses_feature_map = True

    def __init__(
        self,
        in_features: int,
        num_labels: int,
        dim: int = 256,
        heads: int = 4,
        layers: int = 1,
        dropout: float = 0.1,
        groups: int | None = None,
    ):
        super().__init__()
        self.num_labels = num_labels
        self.groups = num_labels if groups is None or groups >= num_labels else int(groups)
        self.per_group = math.ceil(num_labels / self.groups)
        self.project = nn.Linear(in_features, dim)
        self.queries = nn.Parameter(torch.empty(self.groups, dim))
        self.layers = nn.ModuleList(_CrossAttentionLayer(dim, heads, dropout) for _ in range(layers))
        # Group fully-connected decoding: query g produces logits g * per_group ... (g + 1) * per_group - 1.
        self.weight = nn.Parameter(torch.empty(self.groups, dim, self.per_group))
        self.bias = nn.Parameter(torch.zeros(num_labels))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Everything from scratch: cRT re-learns the whole head, attention included, on the frozen backbone."""
        self.project.reset_parameters()
        nn.init.normal_(self.queries, std=0.02)
        for layer in self.layers:
            for module in layer.modules():  # MultiheadAttention names its reset _reset_parameters
                reset = getattr(module, "reset_parameters", None) or getattr(module, "_reset_parameters", None)
                if module is not layer and reset is not None:
                    reset()
        nn.init.normal_(self.weight, std=0.01)
        nn.init.zeros_(self.bias)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        # A CNN's (B, F, h, w) map as h*w tokens; a transformer's forward_features is already (B, N, F) tokens.
        tokens = features.flatten(2).transpose(1, 2) if features.ndim == 4 else features
        memory = self.project(tokens)  # (B, tokens, dim)
        queries = self.queries.unsqueeze(0).expand(len(memory), -1, -1)  # (B, Q, dim)
        for layer in self.layers:
            queries = layer(queries, memory)
        logits = torch.einsum("bqd,qdk->bqk", queries, self.weight).flatten(1)  # (B, Q * per_group)
        return logits[:, : self.num_labels] + self.bias
