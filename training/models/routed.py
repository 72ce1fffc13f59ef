"""View routing: a projection classifier sends each image to a network trained on that projection only.

PA, AP and lateral films differ in geometry, so one network per projection need not learn all three. The router
is part of the module, still called as ``model(images)``: evaluation, TTA, ``make submit``, serving and a
reloaded run all route through the learned router, with no view column needed at inference. Config keys
(``configs/model/routed_*.yaml``): docs/recipes.md, "View routing". ``fallback_view`` is where an image without
a known manifest view trains (null: where the router sends it).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torchmetrics import Metric

from training.data.dataset import canonical_view
from training.models.backbone import create_backbone
from training.models.module import MultiLabelClassifier

ROUTINGS = ("hard", "soft")


class Expert(nn.Module):
    """One projection's backbone and head, computing logits and loss as :class:`MultiLabelClassifier` does."""

    def __init__(self, backbone: nn.Module, head: nn.Module):
        super().__init__()
        self.backbone, self.head = backbone, head

    def features(self, images: torch.Tensor) -> torch.Tensor:
        if getattr(self.head, "uses_feature_map", False):
            return self.backbone.forward_features(images)
        return self.backbone(images)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(images))

    def head_loss(self, images, targets, mask, loss) -> torch.Tensor | None:
        """The head's own loss (a head with extra terms), or None when the plain loss on the logits is the loss."""
        head_loss = getattr(self.head, "training_loss", None)
        return head_loss(self.features(images), targets, mask, loss) if head_loss else None


class RouterAccuracy(Metric):
    """Share of images with a known view that the router sends to that view's expert, summed across processes."""

    full_state_update = False

    def __init__(self):
        super().__init__()
        self.add_state("correct", torch.zeros(()), dist_reduce_fx="sum")
        self.add_state("known", torch.zeros(()), dist_reduce_fx="sum")

    def update(self, router_logits: torch.Tensor, views: torch.Tensor) -> None:
        known = views >= 0
        self.correct += (router_logits.argmax(dim=1)[known] == views[known]).sum()
        self.known += known.sum()

    def compute(self) -> torch.Tensor:
        return self.correct / self.known.clamp_min(1)


class ViewRoutedClassifier(MultiLabelClassifier):
    """A router over per-projection experts (see the module docstring).

    ``self.backbone`` and ``self.head`` are the first view's expert, not registered a second time (the checkpoint
    holds each weight once, under ``experts.<view>``). Code that reads them directly (the embedding benchmarks,
    Grad-CAM) therefore sees that expert alone, without the router; everything that calls ``model(images)`` routes.
    """

    def __init__(self, model_cfg: dict, loss_cfg: dict, labels: list[str]):
        super().__init__(model_cfg, loss_cfg, labels)
        for name in ("backbone", "head"):  # aliases of experts[0], kept out of the state dict
            object.__setattr__(self, name, self._modules.pop(name))
        self.router_accuracy = RouterAccuracy()

    def build_network(self, model_cfg: dict) -> tuple[nn.Module, nn.Module]:
        views = [canonical_view(view) for view in model_cfg.get("views") or ()]
        if len(views) < 2 or None in views or len(set(views)) != len(views):
            raise ValueError(f"model.views must name two or more distinct projections, got {model_cfg.get('views')}")
        if float((model_cfg.get("aux_loss") or {}).get("weight", 0.0)) > 0:
            raise ValueError("model.aux_loss is not supported by the view-routed model; leave aux_loss=none")
        self.routing = str(model_cfg.get("routing", "hard"))
        if self.routing not in ROUTINGS:
            raise ValueError(f"model.routing must be one of {ROUTINGS}, got {self.routing!r}")
        fallback = model_cfg.get("fallback_view")
        if fallback is not None and canonical_view(fallback) not in views:
            raise ValueError(f"model.fallback_view {fallback!r} is not one of model.views {views}")
        self.fallback = None if fallback is None else views.index(canonical_view(fallback))
        self.views = views
        self.router_weight = float(model_cfg.get("router_weight", 1.0))
        self.experts = nn.ModuleDict({view: self._expert(model_cfg) for view in views})
        router_cfg = model_cfg.get("router") or {}
        # ImageNet weights only under model.pretrained, which a reloaded run clears (training.runs): the router's
        # weights then come from the checkpoint, never a download. router.pretrained: false opts the router out.
        pretrained = bool(model_cfg.get("pretrained", False)) and bool(router_cfg.get("pretrained", True))
        router = create_backbone(
            router_cfg.get("backbone", "regnetx_002"), pretrained=pretrained, **router_cfg.get("timm_kwargs", {})
        )
        self.router = nn.Sequential(router, nn.Linear(router.num_features, len(views)))
        first = self.experts[views[0]]
        return first.backbone, first.head

    def _expert(self, model_cfg: dict) -> Expert:
        """The plain classifier's network, so ``model.head``, ``model.weights`` and the like apply to each expert."""
        return Expert(*super().build_network(model_cfg))

    def route(self, images: torch.Tensor) -> torch.Tensor:
        """``(B, V)`` router logits."""
        return self.router(images)

    def routed_logits(self, images: torch.Tensor, router_logits: torch.Tensor) -> torch.Tensor:
        """``(B, C)`` unscaled logits: each image's chosen expert (hard), or the probability mixture (soft)."""
        if self.routing == "hard":
            return self.expert_logits(images, router_logits.argmax(dim=1))
        weights = router_logits.softmax(dim=1)  # (B, V)
        probs = sum(
            weights[:, i, None] * torch.sigmoid(expert(images)) for i, expert in enumerate(self.experts.values())
        )
        return torch.logit(probs, eps=1e-7)

    def expert_logits(self, images: torch.Tensor, routes: torch.Tensor) -> torch.Tensor:
        """``(B, C)`` logits with row ``b`` from expert ``routes[b]``; each expert sees only its own images, so
        gradients reach no other expert and its batch-norm statistics come from its own projection."""
        logits = None
        for i, expert in enumerate(self.experts.values()):
            rows = (routes == i).nonzero(as_tuple=True)[0]
            if len(rows) == 0:
                continue
            part = expert(images[rows])
            if logits is None:
                logits = part.new_zeros((len(images), part.shape[1]))
            logits = logits.index_copy(0, rows, part)
        return logits if logits is not None else images.new_zeros((0, len(self.labels)))

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """``(B, 1, H, W)`` images to ``(B, C)`` logits through the learned router, temperature-scaled."""
        return self.routed_logits(images, self.route(images)) / self.logit_temperature

    def training_routes(self, views: torch.Tensor, router_logits: torch.Tensor) -> torch.Tensor:
        """The manifest view where known; else the fallback view, or the router's choice when there is none."""
        unknown = self.fallback if self.fallback is not None else router_logits.detach().argmax(dim=1)
        return torch.where(views >= 0, views, unknown)

    def routed_training_loss(self, images, targets, mask, views) -> torch.Tensor:
        """Expert loss (each image through its projection's expert) + ``router_weight`` x the router's cross-entropy
        on the known views."""
        router_logits = self.route(images)
        routes = self.training_routes(views, router_logits)
        if any(hasattr(expert.head, "training_loss") for expert in self.experts.values()):
            # A head with its own loss terms gets its expert's images only; each part is weighted by its share of
            # the batch so the total is on the scale of one loss over the batch.
            loss = images.new_zeros(())
            for i, expert in enumerate(self.experts.values()):
                rows = (routes == i).nonzero(as_tuple=True)[0]
                if len(rows):
                    part = expert.head_loss(images[rows], targets[rows], mask[rows], self.loss)
                    loss = loss + part * len(rows) / len(images)
        else:
            loss = self.loss(self.expert_logits(images, routes), targets, mask)
        known = views >= 0
        if self.router_weight > 0 and bool(known.any()):
            loss = loss + self.router_weight * F.cross_entropy(router_logits[known], views[known])
        return loss

    def training_loss(self, images, targets, mask, views: torch.Tensor | None = None) -> torch.Tensor:
        if views is None:
            raise ValueError(
                "the view-routed model trains on each image's manifest view: build the data module with "
                "views=model.views (training.pipeline.build_datamodule does)"
            )
        return self.routed_training_loss(images, targets, mask, views)

    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        targets = batch["target"]
        loss = self.training_loss(batch["image"], targets.clamp_min(0), targets >= 0, batch.get("view"))
        self.log("loss", loss, on_step=True, on_epoch=False, prog_bar=True, logger=False)
        self.train_loss.update(loss.detach(), len(targets))
        return loss

    def validation_step(self, batch: dict, batch_idx: int) -> None:
        router_logits = self.route(batch["image"])
        logits = self.routed_logits(batch["image"], router_logits) / self.logit_temperature
        self.val_metrics.update(torch.sigmoid(logits), batch["target"].long())
        if "view" in batch:
            self.router_accuracy.update(router_logits, batch["view"])

    def on_validation_epoch_end(self) -> None:
        super().on_validation_epoch_end()
        if float(self.router_accuracy.known) > 0 or self.trainer.world_size > 1:
            self.log("val/router_accuracy", self.router_accuracy.compute())
        self.router_accuracy.reset()

    def set_label_statistics(self, class_counts, n_samples: int) -> None:
        """The loss's prior bias goes into every expert's head (the base class sets the first one's only)."""
        super().set_label_statistics(class_counts, n_samples)
        bias = self.loss.init_bias()
        if bias is not None:
            with torch.no_grad():
                for expert in self.experts.values():
                    expert.head.bias.copy_(bias)

    def freeze_backbone(self) -> None:
        """cRT on a routed model: every expert's backbone and the router stay fixed, the heads train."""
        for expert in self.experts.values():
            expert.backbone.requires_grad_(False)
        self.router.requires_grad_(False)
        self.backbone_frozen = True

    def on_train_epoch_start(self) -> None:
        super().on_train_epoch_start()
        if getattr(self, "backbone_frozen", False):
            for expert in self.experts.values():
                expert.backbone.eval()
            self.router.eval()
