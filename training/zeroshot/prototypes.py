"""Prototype prompting: unseen-class prompts refined with the images the text is most confident about.

Why: a text prompt places an unseen class where the language side puts it, while its radiographs may sit elsewhere
(the modality gap of CLIP-style models). Each unseen class's positive prompt becomes
``normalise((1 - weight) * t+_c + weight * normalise(p_c))``, ``p_c`` the mean of the images text alone scores
most confidently; no label is read. Built on the validation split at every validation, so each checkpoint carries
its own epoch's prompts. Under the Task 2 training rule validation holds no known unseen-finding image, so there
the prototypes carry no class evidence; what it can and cannot do: docs/zero-shot.md, "Proxy-OOD folds and
prototype prompting".
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from training.zeroshot.clip import ClipClassifier


def select_confident(probs: torch.Tensor, threshold: float, max_samples: int) -> torch.Tensor:
    """``(N, U)`` bool: per class the images with ``probs >= threshold``, at most the ``max_samples`` highest.

    Ties at the cut keep the earlier image (a stable sort), so the selection is deterministic.
    """
    order = torch.sort(probs, dim=0, descending=True, stable=True).indices  # (N, U)
    rank = torch.empty_like(order)
    rank.scatter_(0, order, torch.arange(len(probs), device=probs.device).unsqueeze(1).expand_as(order))
    return (probs >= threshold) & (rank < max_samples)


def class_prototypes(embeddings: torch.Tensor, selected: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean of the selected unit embeddings per class, re-normalised: ``(U, D)`` prototypes and ``(U,)`` counts.

    A class with no selected image gets a zero prototype and count 0.
    """
    unit = F.normalize(embeddings.float(), dim=-1)  # (N, D)
    weights = selected.float()  # (N, U)
    counts = weights.sum(dim=0)  # (U,)
    mean = weights.T @ unit / counts.clamp_min(1).unsqueeze(1)  # (U, D)
    return F.normalize(mean, dim=-1), counts


def prototype_prompts(text: torch.Tensor, prototypes: torch.Tensor, counts: torch.Tensor,
                      weight: float) -> torch.Tensor:  # fmt: skip
    """``(U, D)`` prompts ``normalise((1 - weight) t + weight p)``; a class with count 0 keeps its text ``t``."""
    mixed = F.normalize((1.0 - weight) * text + weight * prototypes, dim=-1)
    return torch.where((counts > 0).unsqueeze(1), mixed, text)


class PrototypeClipClassifier(ClipClassifier):
    """The clip adapter whose unseen classes are scored with prototype prompts (``adapter.prototypes``).

    ``adapter.prototypes``: ``threshold`` (text probability an image needs to be selected), ``max_samples`` (per
    class), ``weight`` (0 = text only, 1 = prototype only). The seen classes, the loss and proxy-OOD validation are
    the clip adapter's, unchanged.
    """

    def build_network(self, model_cfg: dict):
        backbone, head = super().build_network(model_cfg)
        spec = dict(self.hparams["adapter_cfg"].get("prototypes") or {})
        self.prototype_threshold = float(spec.get("threshold", 0.5))
        self.prototype_max = int(spec.get("max_samples", 16))
        self.prototype_weight = float(spec.get("weight", 0.5))
        if not 0.0 <= self.prototype_weight <= 1.0 or self.prototype_max < 1:
            raise ValueError(f"adapter.prototypes: weight must be in [0, 1] and max_samples >= 1, got {spec}")
        # The prompts in use and how many images built each (saved: a checkpoint scores with its own epoch's).
        self.register_buffer("prototype_positive", self.unseen_positive.clone())  # (U, D)
        self.register_buffer("prototype_counts", torch.zeros(len(self.unseen_positive)))  # (U,)
        self._pool: list[tuple[torch.Tensor, torch.Tensor]] = []
        return backbone, head

    def head_space(self, z: torch.Tensor) -> torch.Tensor:
        """``(B, D)`` image-tower embeddings -> where the head compares them with prompts (after its adapter)."""
        return F.normalize(z + self.head.adapter(z), dim=-1) if self.head.adapter is not None else z

    def embed(self, images: torch.Tensor) -> torch.Tensor:
        """``(B, 1, H, W)`` -> ``(B, D)`` unit embeddings in the head's space."""
        return self.head_space(self.backbone(images))

    def text_only_unseen_logits(self, z: torch.Tensor) -> torch.Tensor:
        """``(B, D)`` head-space embeddings -> ``(B, U)`` logits from the text prompts alone (the selection)."""
        pair = self.head.scale * (z @ self.unseen_positive.T - z @ self.unseen_negative.T)
        return pair + self.head.bias.mean()

    def unseen_logits(self, images: torch.Tensor) -> torch.Tensor:
        """``(B, 1, H, W)`` -> ``(B, U)``: ``s (z.t'_c - z.t-_c) + mean seen bias`` with the prototype prompts."""
        z = self.embed(images)
        return self.head.scale * (z @ self.prototype_positive.T - z @ self.unseen_negative.T) + self.head.bias.mean()

    @torch.no_grad()
    def add_to_pool(self, features: torch.Tensor) -> None:
        """Keep a batch's embeddings (``(B, D)`` from the image tower) and text-only unseen probabilities for the
        next :meth:`build_prototypes`."""
        z = self.head_space(features)
        self._pool.append((z.detach(), torch.sigmoid(self.text_only_unseen_logits(z)).detach()))

    @torch.no_grad()
    def build_prototypes(self) -> None:
        """Replace the prompts with ones built from the pool gathered since the last call, then empty it."""
        if not self._pool:
            return
        z, probs = (torch.cat(part) for part in zip(*self._pool, strict=True))  # (N, D), (N, U)
        self._pool = []
        if self._trainer is not None and self.trainer.world_size > 1:  # every rank builds from the whole pool
            z, probs = (self.all_gather(t).flatten(0, 1) for t in (z, probs))
        prototypes, counts = class_prototypes(z, select_confident(probs, self.prototype_threshold, self.prototype_max))
        self.prototype_positive.copy_(
            prototype_prompts(self.unseen_positive, prototypes, counts, self.prototype_weight)
        )
        self.prototype_counts.copy_(counts)

    @torch.no_grad()
    def fit_prototypes(self, loader) -> None:
        """Build the prototypes from every image of ``loader`` (batches with an ``image`` entry)."""
        for batch in loader:
            self.add_to_pool(self.backbone(batch["image"].to(self.prototype_positive.device)))
        self.build_prototypes()

    def validation_step(self, batch: dict, batch_idx: int) -> None:
        # The clip adapter's validation step, with the image tower run once for the metrics, proxy and pool.
        features = self.backbone(batch["image"])  # (B, D)
        self.val_metrics.update(torch.sigmoid(self.head(features)), batch["target"].long())
        if self.proxy is not None:
            self.proxy.update(features, batch["target"])
        self.add_to_pool(features)

    def on_validation_epoch_end(self) -> None:
        super().on_validation_epoch_end()
        self.build_prototypes()
        self.log("val/prototypes/mean_selected", self.prototype_counts.mean())
