"""Proxy-OOD validation: how well the zero-shot branch scores classes whose labels it never trained on.

The six Task 2 classes have no labels to validate on, so the zero-shot branch is checked on the seen classes
instead: ``k`` splits of the seen classes into pseudo-seen and pseudo-unseen (``size`` each time, disjoint
across splits while ``k * size`` fits). Per split, a **proxy head** (the adapter's own zero-shot head type:
projection into the text space, learned temperature, cosine to the class text embeddings) is trained next to the
main head with the loss masked to its pseudo-seen classes; at validation it scores its pseudo-unseen classes from
their text embeddings alone, and ``val/proxy_ood_mAP`` is their mean AP over all splits.

Why proxy heads on detached features rather than ``k`` separate trainings or masking classes out of the main
head across steps: ``k`` full trainings cost ``k`` times the run; masking subsets in turn lets every class reach
the loss in other steps, so nothing is unseen by validation time. A proxy head costs one linear layer and never
sees a pseudo-unseen label: its loss mask and targets exclude them (a test flips those labels and checks the loss
and its gradients do not move). What it cannot do is hide those classes from the shared backbone, which is
trained on every seen class: the proxy measures the transfer of the text alignment (projection, temperature,
templates, descriptions, text encoder), on features that may know the class. It is therefore optimistic in
absolute value and meant for comparing zero-shot settings (a tuning objective), not as an estimate of unseen mAP.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
from torch import nn
from torchmetrics.classification import MultilabelAveragePrecision


def conse_weights(query: torch.Tensor, support: torch.Tensor, k: int) -> torch.Tensor:
    """ConSE weights (Norouzi et al. 2014): each query class as a convex combination of its ``k`` nearest support
    classes by text cosine, ``(U, D) x (C, D) -> (U, C)``, rows summing to 1 (negative similarities get 0)."""
    sims = query @ support.T  # (U, C)
    top = sims.topk(min(k, sims.shape[1]), dim=1)
    weights = torch.zeros_like(sims).scatter_(1, top.indices, top.values.clamp_min(0))
    return weights / weights.sum(dim=1, keepdim=True).clamp_min(1e-12)


def proxy_splits(n_classes: int, k: int, size: int, seed: int = 0) -> list[list[int]]:
    """``k`` pseudo-unseen class subsets of ``size`` indices each, from a seeded permutation.

    Disjoint while ``k * size <= n_classes`` (5 splits of 6 cover 30 seen classes exactly once); beyond that each
    split is a fresh seeded draw. At least one class stays pseudo-seen in every split.
    """
    if not 0 < size < n_classes:
        raise ValueError(f"proxy split size must be in [1, {n_classes - 1}] for {n_classes} seen classes, got {size}")
    rng = np.random.default_rng(seed)
    if k * size <= n_classes:
        order = rng.permutation(n_classes)
        return [sorted(order[i * size : (i + 1) * size].tolist()) for i in range(k)]
    return [sorted(rng.choice(n_classes, size, replace=False).tolist()) for _ in range(k)]


class ProxyOOD(nn.Module):
    """``k`` proxy heads, their masked training loss and the pseudo-unseen validation AP.

    Args:
        head_factory: builds one zero-shot head ``head(features) -> (B, C)`` logits over the seen classes.
        n_classes: number of seen classes ``C``.
        k: number of splits.
        size: pseudo-unseen classes per split.
        seed: seed of the splits.
        conse_k: score pseudo-unseen classes as the adapter's ``transfer: conse`` does (a convex combination of
            the ``conse_k`` nearest *pseudo-seen* classes' logits by ``class_text`` cosine); None scores them
            directly against their own text (``transfer: direct``).
        class_text: ``(C, D)`` seen-class text embeddings (needed with ``conse_k``).
    """

    def __init__(self, head_factory: Callable[[], nn.Module], n_classes: int, k: int = 5, size: int = 6,
                 seed: int = 0, conse_k: int | None = None, class_text: torch.Tensor | None = None):  # fmt: skip
        super().__init__()
        self.splits = proxy_splits(n_classes, k, size, seed)
        self.heads = nn.ModuleList(head_factory() for _ in self.splits)
        pseudo_seen = torch.ones(len(self.splits), n_classes, dtype=torch.bool)
        for i, unseen in enumerate(self.splits):
            pseudo_seen[i, unseen] = False
        self.register_buffer("pseudo_seen", pseudo_seen, persistent=False)  # (k, C)
        transfer = None
        if conse_k:
            transfer = torch.zeros(len(self.splits), size, n_classes)  # (k, size, C): weights on pseudo-seen only
            for i, unseen in enumerate(self.splits):
                seen = pseudo_seen[i].nonzero().squeeze(1)
                transfer[i][:, seen] = conse_weights(class_text[unseen], class_text[seen], conse_k)
        self.register_buffer("transfer", transfer, persistent=False)
        self.ap = nn.ModuleList(MultilabelAveragePrecision(size, average=None, ignore_index=-1) for _ in self.splits)
        self.register_buffer("positives", torch.zeros(len(self.splits), size), persistent=False)

    def loss(self, features: torch.Tensor, targets: torch.Tensor, labelled: torch.Tensor, loss_fn) -> torch.Tensor:
        """Sum over splits of ``loss_fn`` on each head's pseudo-seen classes; ``features`` come in detached.

        Args:
            features: ``(B, F)`` image features, detached so proxy heads never train the shared backbone.
            targets: ``(B, C)`` in {0, 1}; labelled: ``(B, C)`` bool.
            loss_fn: the run's loss (``MultiLabelLoss``): pseudo-unseen entries are masked out *and* their targets
                replaced by a constant, so their labels cannot influence the value or its gradient.
        """
        total = features.new_zeros(())
        for head, seen in zip(self.heads, self.pseudo_seen, strict=True):
            keep = labelled & seen  # (B, C)
            total = total + loss_fn(head(features), targets * seen, keep)
        return total

    @torch.no_grad()
    def update(self, features: torch.Tensor, targets: torch.Tensor) -> None:
        """Accumulate pseudo-unseen probabilities ``(B, size)`` and targets (-1 = not labelled) per split."""
        for i, (head, unseen) in enumerate(zip(self.heads, self.splits, strict=True)):
            logits = head(features)  # (B, C)
            scores = logits[:, unseen] if self.transfer is None else logits @ self.transfer[i].T  # (B, size)
            probs = torch.sigmoid(scores)
            truth = targets[:, unseen].long()
            self.ap[i].update(probs, truth)
            self.positives[i] += (truth == 1).sum(dim=0)

    def compute(self) -> dict[str, torch.Tensor]:
        """``{"mAP": mean over splits of each split's pseudo-unseen mAP, "split<i>/mAP": ...}``; then reset."""
        out = {}
        for i, metric in enumerate(self.ap):
            ap = torch.where(self.positives[i] > 0, metric.compute(), torch.nan)
            out[f"split{i}/mAP"] = ap.nanmean()
            metric.reset()
        self.positives.zero_()
        values = torch.stack(list(out.values()))
        out["mAP"] = values.nanmean()
        return out

    def log_epoch(self, module) -> None:
        """Compute, reset and log on a LightningModule: ``val/proxy_ood_mAP`` plus ``val/proxy_ood/split<i>/mAP``.

        One place for the metric names, so every adapter reports the tuning objective under the same key.
        """
        values = self.compute()
        module.log("val/proxy_ood_mAP", values.pop("mAP"), prog_bar=True)
        for key, value in values.items():
            module.log(f"val/proxy_ood/{key}", value)
