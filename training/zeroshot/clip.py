"""The clip adapter: any open_clip model scoring every class by a positive/negative prompt softmax.

``P(c) = softmax(s z.t+_c, s z.t-_c)[0] = sigmoid(s (z.t+_c - z.t-_c))`` (ensembled prompts, docs/rules.md §8):
the head returns that difference as a logit, so every sigmoid-based part of the platform (loss, metrics, TTA)
applies unchanged. Weights are fetched only when named (``pretrained: null`` is a random model, for offline
tests). ``finetune=head`` trains a zero-initialised residual adapter, so training starts at the zero-shot model;
the text tower is never trained, so class embeddings are computed once and cached.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from training.data.transforms import GRAY_MEAN, GRAY_STD
from training.models.module import MultiLabelClassifier
from training.zeroshot.proxy_ood import ProxyOOD
from training.zeroshot.text_side import text_embeddings

FINETUNE = ("none", "head", "visual")


class ClipImageEncoder(nn.Module):
    """The platform's normalised grey ``(B, 1, H, W)`` batches to unit open_clip image embeddings ``(B, D)``.

    Undoes the platform normalisation, repeats the grey channel into RGB, resizes to the model's input size and
    applies the model's own mean/std, so the same data module feeds timm backbones and CLIP towers.
    """

    def __init__(self, visual: nn.Module, image_size: int, mean, std, dim: int):
        super().__init__()
        self.visual = visual
        self.image_size = int(image_size)
        self.num_features = int(dim)
        self.register_buffer("mean", torch.tensor(mean, dtype=torch.float32).view(1, 3, 1, 1), persistent=False)
        self.register_buffer("std", torch.tensor(std, dtype=torch.float32).view(1, 3, 1, 1), persistent=False)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        x = (images * GRAY_STD + GRAY_MEAN).clamp(0, 1).expand(-1, 3, -1, -1)  # (B, 3, H, W) in [0, 1]
        if x.shape[-1] != self.image_size or x.shape[-2] != self.image_size:
            x = F.interpolate(x, size=(self.image_size, self.image_size), mode="bilinear", align_corners=False)
        return F.normalize(self.visual((x - self.mean) / self.std).float(), dim=-1)  # (B, D)


class PromptPairHead(nn.Module):
    """Unit image embeddings ``(B, D)`` to logits ``s (z.t+ - z.t-) + b`` ``(B, C)`` (the 2-way prompt softmax).

    Args:
        positive, negative: ``(C, D)`` unit text embeddings of the classes this head is trained on.
        scale: the CLIP logit scale ``s`` (fixed).
        residual: add a zero-initialised residual linear adapter on the image embedding (``finetune=head``).
    """

    def __init__(self, positive: torch.Tensor, negative: torch.Tensor, scale: float, residual: bool):
        super().__init__()
        self.register_buffer("positive", positive.float().clone())  # (C, D)
        self.register_buffer("negative", negative.float().clone())  # (C, D)
        self.scale = float(scale)
        dim = positive.shape[1]
        self.adapter = nn.Linear(dim, dim) if residual else None
        if self.adapter is not None:
            nn.init.zeros_(self.adapter.weight)
            nn.init.zeros_(self.adapter.bias)
        self.bias = nn.Parameter(torch.zeros(positive.shape[0]))  # (C,)

    def forward(self, z: torch.Tensor, pair: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        if self.adapter is not None:
            z = F.normalize(z + self.adapter(z), dim=-1)
        if pair is None:
            return self.scale * (z @ self.positive.T - z @ self.negative.T) + self.bias  # (B, C)
        positive, negative = pair
        return self.scale * (z @ positive.T - z @ negative.T) + self.bias.mean()  # (B, U)


class ClipClassifier(MultiLabelClassifier):
    """``MultiLabelClassifier`` on an open_clip model: seen classes from ``forward``, unseen from ``unseen_logits``.

    ``model_cfg`` supplies only the optimiser settings; the network is open_clip's.
    """

    def __init__(self, model_cfg: dict, loss_cfg: dict, labels: list[str], adapter_cfg: dict, unseen=()):
        super().__init__(model_cfg, loss_cfg, labels)
        self.unseen = list(unseen)
        if self.finetune == "none":
            self.backbone.requires_grad_(False)
            self.head.requires_grad_(False)
        elif self.finetune == "head":
            self.freeze_backbone()

    def build_network(self, model_cfg: dict):
        import open_clip  # heavy optional dependency, only for this adapter

        from training.zeroshot.clip_text import ClipTextEncoder  # imports open_clip too

        cfg = self.hparams["adapter_cfg"]
        self.finetune = str(cfg.get("finetune", "none"))
        if self.finetune not in FINETUNE:
            raise ValueError(f"adapter.finetune must be one of {FINETUNE}, got {self.finetune!r}")
        name, pretrained = str(cfg["model"]), cfg.get("pretrained")
        # adapter.image_size: the image tower's input side, its position embeddings resized by open_clip (null: the
        # model's own). The Task 2 preset ties it to data.image_size, so its 64 px smoke run costs 1/15 of 224 px.
        forced = cfg.get("image_size")
        clip = open_clip.create_model(
            name, pretrained=pretrained, device="cpu", force_image_size=int(forced) if forced else None
        )
        named_weights = bool(pretrained) or name.startswith("hf-hub:")
        encoder = ClipTextEncoder(
            clip, open_clip.get_tokenizer(name), f"open_clip:{name}:{pretrained}" if named_weights else None
        )
        names = self.labels + list(self.hparams.get("unseen") or [])
        positive = torch.from_numpy(text_embeddings(cfg, names, "positive", encoder))  # (C + U, D)
        negative = torch.from_numpy(text_embeddings(cfg, names, "negative", encoder))
        n = len(self.labels)
        self.register_buffer("unseen_positive", positive[n:].float().clone())  # (U, D)
        self.register_buffer("unseen_negative", negative[n:].float().clone())
        preprocess = open_clip.get_model_preprocess_cfg(clip)
        size = preprocess.get("size", 224)
        backbone = ClipImageEncoder(
            clip.visual, size if isinstance(size, int) else size[0], preprocess.get("mean", open_clip.OPENAI_DATASET_MEAN),
            preprocess.get("std", open_clip.OPENAI_DATASET_STD), positive.shape[1],
        )  # fmt: skip
        scale = float(clip.logit_scale.exp().clamp(max=100.0))

        def make_head() -> PromptPairHead:
            return PromptPairHead(positive[:n], negative[:n], scale, residual=self.finetune != "none")

        proxy = cfg.get("proxy") or {}
        self.proxy_weight = float(proxy.get("weight", 1.0))
        self.proxy = (
            ProxyOOD(make_head, n, proxy["k"], proxy.get("size", 6), proxy.get("seed", 0)) if proxy.get("k") else None
        )
        return backbone, make_head()  # the text tower is dropped here: only its class embeddings are kept

    def unseen_logits(self, images: torch.Tensor) -> torch.Tensor:
        """``(B, 1, H, W)`` -> ``(B, U)`` zero-shot logits of the unseen classes."""
        return self.head(self.backbone(images), (self.unseen_positive, self.unseen_negative))

    def training_step(self, batch: dict, batch_idx: int):
        if self.finetune == "none":
            return None  # pure zero-shot: nothing to learn, Lightning skips the optimiser step
        features = self.backbone(batch["image"])  # (B, D)
        targets = batch["target"]
        positive, labelled = targets.clamp_min(0), targets >= 0
        loss = self.loss(self.head(features), positive, labelled)
        if self.proxy is not None:
            loss = loss + self.proxy_weight * self.proxy.loss(features.detach(), positive, labelled, self.loss)
        self.log("loss", loss, on_step=True, on_epoch=False, prog_bar=True, logger=False)
        self.train_loss.update(loss.detach(), len(targets))
        return loss

    def on_train_epoch_end(self) -> None:
        if self.finetune != "none":
            super().on_train_epoch_end()

    def validation_step(self, batch: dict, batch_idx: int) -> None:
        features = self.backbone(batch["image"])
        self.val_metrics.update(torch.sigmoid(self.head(features)), batch["target"].long())
        if self.proxy is not None:
            self.proxy.update(features, batch["target"])

    def on_validation_epoch_end(self) -> None:
        super().on_validation_epoch_end()
        if self.proxy is not None:
            self.proxy.log_epoch(self)
