"""Two-stage head: a normal-vs-abnormal gate, then findings given that the image is abnormal.

Most chest X-rays in CXR-LT carry no finding, so a flat multi-label head spends most of its negatives telling
normal images apart from every class at once. Here one gate logit ``g`` models P(abnormal) and the class logits
``c_k`` model P(finding k | abnormal); the class logits are trained on abnormal images only, where the tail
findings are far less rare. The output probability is the product

    p_k = sigmoid(g) * sigmoid(c_k),

returned as its logit so that every loss, metric and calibration step downstream keeps working on logits.

The ``Normal`` column, when the label set has one, is a label of its own (docs/rules.md §12): its output is its
own class logit, ungated, trained on the ``Normal`` label wherever that is known. It is *not* ``1 - sigmoid(g)``:
"no listed finding" and "called normal" differ (an image may show a finding outside the list, and an all-zero
row is unlabelled, not a confirmed normal), so tying the two would teach the gate a label nobody gave.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn


def product_logit(gate: torch.Tensor, classes: torch.Tensor) -> torch.Tensor:
    """``logit(sigmoid(gate) * sigmoid(classes))`` without forming the product (it underflows to 0 or rounds to 1).

    ``log p = logsigmoid(g) + logsigmoid(c)`` and ``1 - p = sigmoid(-g) + sigmoid(g) * sigmoid(-c)``, so
    ``log(1 - p)`` is a ``logaddexp`` of two finite log terms for any logits.
    """
    log_p = F.logsigmoid(gate) + F.logsigmoid(classes)
    log_not_p = torch.logaddexp(F.logsigmoid(-gate), F.logsigmoid(gate) + F.logsigmoid(-classes))
    return log_p - log_not_p


class TwoStageHead(nn.Module):
    """Pooled ``(B, F)`` features to ``(B, C)`` logits of ``sigmoid(gate) * sigmoid(class)``.

    Args:
        in_features: backbone feature size ``F``.
        num_labels: output classes ``C``.
        labels: the label names (passed by :func:`training.models.heads.build_head`); used to find ``normal_label``.
        normal_label: the ``Normal`` label: not a finding of the gate, answered by its own ungated logit.
        gate_weight: weight of the gate's binary cross-entropy beside the class loss.
    """

    def __init__(
        self,
        in_features: int,
        num_labels: int,
        labels: Sequence[str] | None = None,
        normal_label: str = "Normal",
        gate_weight: float = 1.0,
    ):
        super().__init__()
        labels = list(labels or [])
        self.normal_index = labels.index(normal_label) if normal_label in labels else None
        findings = torch.ones(num_labels, dtype=torch.bool)
        if self.normal_index is not None:
            findings[self.normal_index] = False
        self.register_buffer("findings", findings, persistent=False)  # the columns that make an image abnormal
        self.gate_weight = float(gate_weight)
        self.gate = nn.Linear(in_features, 1)
        self.weight = nn.Parameter(torch.empty(num_labels, in_features))
        self.bias = nn.Parameter(torch.empty(num_labels))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        nn.init.normal_(self.weight, std=0.01)
        nn.init.zeros_(self.bias)
        nn.init.normal_(self.gate.weight, std=0.01)
        nn.init.zeros_(self.gate.bias)

    def parts(self, features: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The gate logit ``(B, 1)`` and the class logits ``(B, C)``."""
        return self.gate(features), F.linear(features, self.weight, self.bias)

    def combine(self, gate: torch.Tensor, classes: torch.Tensor) -> torch.Tensor:
        return torch.where(self.findings, product_logit(gate, classes), classes)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return self.combine(*self.parts(features))

    def gate_target(self, targets: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(abnormal, known)``, both ``(B,)`` bool: whether an image has a finding, and whether that is known.

        Abnormal means a labelled positive finding. Without one, the image is known to be normal only if every
        finding is labelled or its ``Normal`` label says so; otherwise it is left out of the gate's loss.
        """
        positive = (targets > 0) & mask
        abnormal = (positive & self.findings).any(dim=1)
        known = abnormal | (mask | ~self.findings).all(dim=1)
        if self.normal_index is not None:
            known = known | positive[:, self.normal_index]
        return abnormal, known

    def training_loss(self, features, targets, mask, loss) -> torch.Tensor:
        """The configured loss on the class logits, plus the gate's weighted BCE.

        A finding's logit learns on abnormal images only: for the others P(finding | abnormal) is undefined, and
        teaching ``c`` that they are negatives would just re-learn the gate inside every class. ``Normal``'s logit
        learns on every image whose ``Normal`` label is known (``mask``: the data module masks all-zero rows).
        """
        gate, classes = self.parts(features)
        abnormal, known = self.gate_target(targets, mask)
        gate_bce = F.binary_cross_entropy_with_logits(gate.squeeze(1), abnormal.to(gate.dtype), reduction="none")
        gate_loss = (gate_bce * known).sum() / known.sum().clamp_min(1)
        class_loss = loss(classes, targets, mask & ((abnormal[:, None] & self.findings) | ~self.findings))
        return class_loss + self.gate_weight * gate_loss
