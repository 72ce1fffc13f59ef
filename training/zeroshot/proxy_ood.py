"""Proxy-OOD validation: how well the zero-shot branch scores classes whose labels it never trained on.

The six Task 2 classes have no labels to validate on, so ``k`` splits of the seen classes into pseudo-seen and
pseudo-unseen each get a **proxy head** (the adapter's own zero-shot head type) trained beside the main head on
detached features with the loss masked to its pseudo-seen classes; ``val/proxy_ood_mAP`` is the mean AP of the
pseudo-unseen classes scored from text alone (docs/zero-shot.md).

Why proxy heads: ``k`` full trainings cost ``k`` runs, and masking classes of the main head in turn lets every
class reach the loss in other steps. A proxy head never sees a pseudo-unseen label, but the shared backbone does,
so the proxy measures the transfer of the text alignment on features that may know the class: optimistic in
absolute value, meant for comparing zero-shot settings, not as an estimate of unseen mAP.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import torch
from torch import nn
from torchmetrics.classification import MultilabelAveragePrecision

from training.zeroshot.transfer import Transfer, transfer_scores, transfer_weights


def proxy_splits(n_classes: int, k: int, size: int | None, seed: int = 0) -> list[list[int]]:
    """``k`` pseudo-unseen class subsets from a seeded permutation of the ``n_classes`` seen classes.

    With a ``size``: disjoint while ``k * size <= n_classes``, fresh seeded draws beyond. With ``size=None``: ``k``
    folds differing in size by at most one, covering every class once. At least one class stays pseudo-seen.
    """
    rng = np.random.default_rng(seed)
    if size is None:
        if not 2 <= k <= n_classes:
            raise ValueError(f"proxy.size=null partitions the {n_classes} seen classes into k folds: k must be in "
                             f"[2, {n_classes}], got {k}")  # fmt: skip
        return [sorted(fold.tolist()) for fold in np.array_split(rng.permutation(n_classes), k)]
    if not 0 < size < n_classes:
        raise ValueError(f"proxy split size must be in [1, {n_classes - 1}] for {n_classes} seen classes, got {size}")
    if k * size <= n_classes:
        order = rng.permutation(n_classes)
        return [sorted(order[i * size : (i + 1) * size].tolist()) for i in range(k)]
    return [sorted(rng.choice(n_classes, size, replace=False).tolist()) for _ in range(k)]


class ProxyOOD(nn.Module):
    """``k`` proxy heads, their masked training loss and the pseudo-unseen validation AP per transfer.

    Args:
        head_factory: builds one zero-shot head ``head(features) -> (B, C)`` logits over the seen classes.
        size: pseudo-unseen classes per split; None partitions the seen classes into ``k`` folds.
        transfers: ways of scoring the pseudo-unseen classes (:mod:`training.zeroshot.transfer`); ``direct`` only
            by default.
        class_text: ``(C, D)`` seen-class text embeddings (needed by ConSE transfers).
        allowed: ``(C,)`` bool, classes allowed to support a ConSE combination (absence classes excluded).
    """

    def __init__(self, head_factory: Callable[[], nn.Module], n_classes: int, k: int = 5, size: int | None = 6,
                 seed: int = 0, transfers: Sequence[Transfer] | None = None, class_text: torch.Tensor | None = None,
                 allowed: torch.Tensor | None = None):  # fmt: skip
        super().__init__()
        self.splits = proxy_splits(n_classes, k, size, seed)
        self.transfers = list(transfers or [Transfer("direct")])
        self.heads = nn.ModuleList(head_factory() for _ in self.splits)
        pseudo_seen = torch.ones(len(self.splits), n_classes, dtype=torch.bool)
        for i, unseen in enumerate(self.splits):
            pseudo_seen[i, unseen] = False
        self.register_buffer("pseudo_seen", pseudo_seen, persistent=False)  # (k, C)
        allowed = torch.ones(n_classes, dtype=torch.bool) if allowed is None else allowed
        widest = max(len(unseen) for unseen in self.splits)  # folds may differ by one: rows past a split's size unused
        weights = torch.zeros(len(self.splits), len(self.transfers), widest, n_classes)  # on pseudo-seen classes only
        if any(t.k is not None for t in self.transfers):
            for i, unseen in enumerate(self.splits):
                seen = pseudo_seen[i].nonzero().squeeze(1)
                weights[i][:, : len(unseen), seen] = transfer_weights(self.transfers, class_text[unseen],
                                                                      class_text[seen], allowed[seen])  # fmt: skip
        self.register_buffer("weights", weights, persistent=False)  # (k, T, widest, C)
        self.ap = nn.ModuleList(
            nn.ModuleList(
                MultilabelAveragePrecision(len(unseen), average=None, ignore_index=-1) for _ in self.transfers
            )  # fmt: skip
            for unseen in self.splits
        )
        self.register_buffer("positives", torch.zeros(len(self.splits), widest), persistent=False)

    def loss(self, features: torch.Tensor, targets: torch.Tensor, labelled: torch.Tensor, loss_fn) -> torch.Tensor:
        """Sum over splits of ``loss_fn`` on each head's pseudo-seen classes; ``features`` come in detached.

        Pseudo-unseen entries are masked out *and* their targets replaced by a constant, so their labels cannot
        influence the value or its gradient; detached features keep proxy heads from training the shared backbone.
        """
        total = features.new_zeros(())
        for head, seen in zip(self.heads, self.pseudo_seen, strict=True):
            keep = labelled & seen  # (B, C)
            total = total + loss_fn(head(features), targets * seen, keep)
        return total

    @torch.no_grad()
    def update(self, features: torch.Tensor, targets: torch.Tensor) -> None:
        """Accumulate each transfer's pseudo-unseen probabilities ``(B, size)`` and targets (-1 = not labelled)."""
        for i, (head, unseen) in enumerate(zip(self.heads, self.splits, strict=True)):
            logits = head(features)  # (B, C)
            truth = targets[:, unseen].long()
            for t, transfer in enumerate(self.transfers):
                own = logits[:, unseen]  # direct: the head's logit of the class, i.e. cosine to its own text
                scores = transfer_scores(transfer, self.weights[i, t, : len(unseen)], logits, lambda own=own: own)
                self.ap[i][t].update(torch.sigmoid(scores), truth)
            self.positives[i, : len(unseen)] += (truth == 1).sum(dim=0)

    def compute(self) -> dict[str, torch.Tensor]:
        """Per transfer ``<name>/mAP`` (mean over splits of each split's pseudo-unseen mAP) and
        ``<name>/split<i>/mAP``; ``mAP`` is the first transfer's. Then reset."""
        out = {}
        for t, transfer in enumerate(self.transfers):
            per_split = []
            for i in range(len(self.splits)):
                metric = self.ap[i][t]
                has_positives = self.positives[i, : len(self.splits[i])] > 0
                per_split.append(torch.where(has_positives, metric.compute(), torch.nan).nanmean())
                out[f"{transfer.name}/split{i}/mAP"] = per_split[-1]
                metric.reset()
            out[f"{transfer.name}/mAP"] = torch.stack(per_split).nanmean()
        self.positives.zero_()
        out["mAP"] = out[f"{self.transfers[0].name}/mAP"]
        return out

    def log_epoch(self, module, choose: bool = False) -> int:
        """Compute, reset and log on a LightningModule; returns the index of the transfer reported.

        ``val/proxy_ood_mAP`` (the tuning objective) is the reported transfer's value: the first one, or with
        ``choose`` the best one this epoch. Every transfer's mean is logged as ``val/proxy_ood/<name>/mAP`` and the
        reported one's splits as ``val/proxy_ood/split<i>/mAP``.
        """
        values = self.compute()
        means = torch.stack([values[f"{t.name}/mAP"] for t in self.transfers])
        best = int(torch.nan_to_num(means, nan=-1.0).argmax()) if choose else 0
        name = self.transfers[best].name
        module.log("val/proxy_ood_mAP", means[best], prog_bar=True)
        for transfer, mean in zip(self.transfers, means, strict=True):
            if len(self.transfers) > 1:
                module.log(f"val/proxy_ood/{transfer.name}/mAP", mean)
        for i in range(len(self.splits)):
            module.log(f"val/proxy_ood/split{i}/mAP", values[f"{name}/split{i}/mAP"])
        return best
