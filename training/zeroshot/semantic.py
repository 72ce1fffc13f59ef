"""The semantic adapter: image features projected into a text-embedding space, scored against class texts.

The logit of class ``c`` is ``s * cos(P f, t_c) + b``, ``P`` a learned projection, ``t_c`` the class's fixed text
embedding, ``s`` a learned temperature, so any class with a text can be scored, labelled in training or not: the
unseen classes reuse ``P`` and ``s``. An optional dual branch adds a linear head for the seen classes (the 2026
winners' contrastive + classification recipe). ``transfer: auto`` picks the unseen-class transfer with the best
proxy-OOD mAP at every validation (:mod:`training.zeroshot.transfer`).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from training.models.module import MultiLabelClassifier
from training.zeroshot.proxy_ood import ProxyOOD
from training.zeroshot.text_side import text_embeddings
from training.zeroshot.transfer import parse_transfers, support_mask, transfer_scores, transfer_weights


class SemanticHead(nn.Module):
    """``(B, F)`` features to ``(B, C)`` logits ``s * cos(P f, t_c) + b_c`` against fixed class embeddings.

    ``hidden``: width of a two-layer projection, None for a linear one. ``init_scale``: initial ``s``, learned in
    log space and capped at 100 as in CLIP.
    """

    def __init__(self, in_features: int, class_text: torch.Tensor, hidden: int | None = None, init_scale: float = 10.0):
        super().__init__()
        dim = class_text.shape[1]
        self.projection = (
            nn.Linear(in_features, dim)
            if not hidden
            else nn.Sequential(nn.Linear(in_features, hidden), nn.GELU(), nn.Linear(hidden, dim))
        )
        self.register_buffer("text", class_text.float().clone())  # (C, D), saved: a checkpoint scores as trained
        self.log_scale = nn.Parameter(torch.tensor(math.log(init_scale)))
        self.bias = nn.Parameter(torch.zeros(class_text.shape[0]))  # (C,)

    @property
    def scale(self) -> torch.Tensor:
        return self.log_scale.exp().clamp(max=100.0)

    def embed(self, features: torch.Tensor) -> torch.Tensor:
        return F.normalize(self.projection(features), dim=-1)  # (B, D)

    def forward(self, features: torch.Tensor, text: torch.Tensor | None = None) -> torch.Tensor:
        """Logits against the head's own classes, or against ``text`` ``(U, D)`` (bias: the mean seen bias)."""
        if text is None:
            return self.scale * self.embed(features) @ self.text.T + self.bias  # (B, C)
        return self.scale * self.embed(features) @ text.T + self.bias.mean()  # (B, U)


class SemanticClassifier(MultiLabelClassifier):
    """``MultiLabelClassifier`` whose head scores in text space, so unseen classes can be scored too.

    ``forward`` gives the seen-class logits, so the ordinary pipeline works unchanged; ``unseen_logits`` the unseen
    classes' (their labels never reach this module).
    """

    def __init__(self, model_cfg: dict, loss_cfg: dict, labels: list[str], adapter_cfg: dict, unseen=()):
        super().__init__(model_cfg, loss_cfg, labels)
        self.unseen = list(unseen)

    def build_network(self, model_cfg: dict):
        cfg = self.hparams["adapter_cfg"]
        unseen = list(self.hparams.get("unseen") or [])
        backbone, _ = super().build_network(model_cfg)
        text = torch.from_numpy(text_embeddings(cfg, self.labels + unseen))  # (C + U, D)
        seen_text, unseen_text = text[: len(self.labels)], text[len(self.labels) :]
        self.register_buffer("unseen_text", unseen_text.float().clone())  # (U, D)
        self.auto_transfer = str(cfg.get("transfer", "direct")) == "auto"
        self.transfers = parse_transfers(str(cfg.get("transfer", "direct")), cfg.get("transfer_candidates"))
        allowed = support_mask(self.labels)
        # (T, U, C) ConSE weights per candidate, and the index of the one in use (saved: checkpoints keep it).
        self.register_buffer("unseen_weights", transfer_weights(self.transfers, unseen_text, seen_text, allowed))
        self.register_buffer("transfer_choice", torch.zeros((), dtype=torch.long))

        def make_head() -> SemanticHead:
            return SemanticHead(backbone.num_features, seen_text, cfg.get("hidden"), cfg.get("init_scale", 10.0))

        self.dual_weight = float(cfg.get("dual_weight", 1.0))
        self.classifier = nn.Linear(backbone.num_features, len(self.labels)) if cfg.get("dual") else None
        proxy = cfg.get("proxy") or {}
        self.proxy_weight = float(proxy.get("weight", 1.0))
        self.proxy = (
            ProxyOOD(
                make_head,
                len(self.labels),
                proxy["k"],
                proxy.get("size", 6),
                proxy.get("seed", 0),
                transfers=self.transfers,
                class_text=seen_text,
                allowed=allowed,
            )  # fmt: skip
            if proxy.get("k")
            else None
        )
        if self.auto_transfer and self.proxy is None:
            raise ValueError("adapter.transfer=auto chooses on proxy-OOD validation: set adapter.proxy.k > 0")
        return backbone, make_head()

    def _seen_logits(self, features: torch.Tensor) -> torch.Tensor:
        logits = self.head(features)  # (B, C)
        if self.classifier is not None:  # dual branch: the two heads' logits averaged for the seen classes
            logits = 0.5 * (logits + self.classifier(features))
        return logits

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """``(B, 1, H, W)`` -> ``(B, C)`` seen-class logits."""
        return self._seen_logits(self.backbone(images))

    @property
    def transfer(self) -> str:
        """Name of the transfer in use (``direct`` or ``conse<k>``)."""
        return self.transfers[int(self.transfer_choice)].name

    def unseen_logits(self, images: torch.Tensor) -> torch.Tensor:
        """``(B, 1, H, W)`` -> ``(B, U)`` zero-shot logits of the unseen classes (see ``transfer``)."""
        features = self.backbone(images)
        choice = int(self.transfer_choice)
        return transfer_scores(self.transfers[choice], self.unseen_weights[choice], self._seen_logits(features),
                               lambda: self.head(features, self.unseen_text))  # fmt: skip

    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        features = self.backbone(batch["image"])  # (B, F)
        targets = batch["target"]  # (B, C), -1 = not labelled
        positive, labelled = targets.clamp_min(0), targets >= 0
        loss = self.loss(self.head(features), positive, labelled)
        if self.classifier is not None:
            loss = loss + self.dual_weight * self.loss(self.classifier(features), positive, labelled)
        if self.proxy is not None:
            loss = loss + self.proxy_weight * self.proxy.loss(features.detach(), positive, labelled, self.loss)
        self.log("loss", loss, on_step=True, on_epoch=False, prog_bar=True, logger=False)
        self.train_loss.update(loss.detach(), len(targets))
        return loss

    def validation_step(self, batch: dict, batch_idx: int) -> None:
        features = self.backbone(batch["image"])
        self.val_metrics.update(torch.sigmoid(self._seen_logits(features)), batch["target"].long())
        if self.proxy is not None:
            self.proxy.update(features, batch["target"])

    def on_validation_epoch_end(self) -> None:
        super().on_validation_epoch_end()
        if self.proxy is not None:
            choice = self.proxy.log_epoch(self, choose=self.auto_transfer)
            if self.auto_transfer:
                self.transfer_choice.fill_(choice)
