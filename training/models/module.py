"""The one LightningModule: a backbone, a multi-label head (linear unless ``model.head`` names another), a loss.

Every variant of docs/recipes.md plugs in here, so it trains, checkpoints, resumes, evaluates and serves through
the same code: ``model.head`` (a head with ``uses_feature_map`` gets the unpooled ``(B, F, h, w)`` map, one with
``training_loss`` adds its own terms), ``model.aux_loss`` (a term added during training only) and
``logit_temperature`` (fitted on validation after training; 1 while training, so an older checkpoint behaves as
before).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from functools import partial

import lightning.pytorch as L
import numpy as np
import torch
from lightning.pytorch.trainer.states import TrainerFn
from torch import nn
from torchmetrics import MeanMetric, Metric, MetricCollection
from torchmetrics.classification import BinaryAUROC, BinaryAveragePrecision
from torchmetrics.wrappers.abstract import WrapperMetric

from evaluation.groups import class_groups, group_means
from evaluation.metric_registry import SUITE
from training.checkpoint_io import global_rng_state, restore_global_rng_state
from training.components import build_component
from training.models.backbone import backbone_from_config
from training.models.heads import build_head
from training.models.schedule import HeadOnlyPhase, phased_multiplier, run_epochs
from training.tracking.redaction import redact

# A class without positives in a (small) validation split is expected in the tail; LabelCounts leaves it out of
# the macro means as the challenge does, so torchmetrics' per-epoch warning about it is noise.
warnings.filterwarnings("ignore", message="No positive samples", module="torchmetrics")
# Under DDP every epoch value logged here is already global (torchmetrics syncs its states across ranks in
# ``compute``; the learning rate is the same everywhere), so Lightning's advice to add ``sync_dist=True`` would
# only average identical numbers at the cost of a collective per key.
warnings.filterwarnings("ignore", message=r"It is recommended to use `self.log\(")


class PerLabel(WrapperMetric):
    """One binary metric per class: ``(B, C)`` in, ``(C,)`` out, NaN for a class with no labelled cell.

    torchmetrics' multi-label metrics refuse a single label and fail on a class whose cells are all -1 (an external
    or pseudo-labelled set lacking that finding). The counts sync across processes before any class is computed, so
    every process takes the same branches and the per-class collectives stay matched.
    """

    def __init__(self, metric: Callable[[], Metric], num_labels: int):
        super().__init__()
        self.metrics = nn.ModuleList(metric() for _ in range(num_labels))
        self.counts = LabelCounts(num_labels)

    def update(self, preds: torch.Tensor, target: torch.Tensor) -> None:
        for column, metric in enumerate(self.metrics):
            metric.update(preds[:, column], target[:, column])
        self.counts.update(preds, target)

    def compute(self) -> torch.Tensor:
        positives, negatives = self.counts.compute()
        labelled = torch.atleast_1d(positives + negatives).tolist()  # compute() squeezes a single class
        nan = torch.tensor(float("nan"), device=positives.device)
        return torch.stack([metric.compute() if n else nan for metric, n in zip(self.metrics, labelled, strict=True)])

    def reset(self) -> None:
        for metric in self.metrics:
            metric.reset()
        self.counts.reset()
        super().reset()


# Checkpoint key of the global random states (see MultiLabelClassifier.on_save_checkpoint).
GLOBAL_RNG_KEY = "global_rng_states"

# The suite metrics tracked every validation epoch: their registry entries give the per-class keys and the logged
# names (val/mAP, val/mAUROC). torchmetrics computes them here because its states sync across DDP ranks.
VAL_AP, VAL_AUROC = SUITE.by_key("ap"), SUITE.by_key("auroc")


def per_class_metrics(num_labels: int) -> dict[str, Metric]:
    """Per-class AP and AUROC for any number of labels, ignoring -1 targets."""
    return {
        VAL_AP.key: PerLabel(partial(BinaryAveragePrecision, ignore_index=-1), num_labels),
        VAL_AUROC.key: PerLabel(partial(BinaryAUROC, ignore_index=-1), num_labels),
    }


class MultiLabelClassifier(L.LightningModule):
    """Multi-label chest X-ray classifier.

    Everything needed to rebuild it is kept as plain hyperparameters (model and loss config, label names), so a
    checkpoint alone can be loaded for evaluation, registration or serving.
    """

    #: Set before the optimiser is built by ``two_phase=head_first`` (:class:`training.models.two_phase.HeadFirst`):
    #: the learning-rate schedule then starts with the head alone at its own rate.
    head_only_phase: HeadOnlyPhase | None = None

    def __init__(self, model_cfg: dict, loss_cfg: dict, labels: list[str]):
        super().__init__()
        self.save_hyperparameters()
        self.labels = list(labels)
        self.backbone, self.head = self.build_network(model_cfg)
        aux = {key: value for key, value in (model_cfg.get("aux_loss") or {}).items() if key != "weight"}
        self.aux_weight = float((model_cfg.get("aux_loss") or {}).get("weight", 0.0))
        # An auxiliary node with a `_target_` is its own term on the pooled feature (the multi-label contrastive
        # loss, configs/aux_loss/multi_supcon.yaml); without one it is a linear head trained with the configured loss.
        own_term = self.aux_weight > 0 and "_target_" in aux
        self.aux_term = (
            build_component({**aux, "in_features": self.backbone.num_features, "num_labels": len(self.labels)})
            if own_term
            else None
        )
        self.aux_head = (
            nn.Linear(self.backbone.num_features, len(self.labels)) if self.aux_weight > 0 and not own_term else None
        )
        # Divides the logits; fitted after training (evaluation/temperature.py), stored with the weights, so the
        # checkpoint, `make evaluate`, `make submit` and the served model all apply it.
        self.register_buffer("logit_temperature", torch.ones(len(self.labels)))
        self.register_load_state_dict_pre_hook(_default_temperature)
        self.loss = build_component(loss_cfg)
        # Per-class values (average=None): torchmetrics' macro mean counts a class with no positive as AP 0,
        # the challenge leaves it out. LabelCounts tells which classes are defined; all three sync under DDP.
        self.val_metrics = MetricCollection(
            {**per_class_metrics(len(self.labels)), "counts": LabelCounts(len(self.labels))}
        )
        # Training prevalence travels with the weights, so head-to-tail groups survive checkpoint loading.
        self.register_buffer("train_counts", torch.zeros(len(self.labels)))
        self.register_buffer("train_size", torch.zeros(()))
        self.train_loss = MeanMetric()

    def build_network(self, model_cfg: dict) -> tuple[nn.Module, nn.Module]:
        """The image encoder ``(B, 1, H, W) -> (B, F)`` and the head ``(B, F) -> (B, C)`` with a ``bias`` ``(C,)``.

        A hook for subclasses (the zero-shot adapters replace the head or the whole network); called during
        ``__init__`` after ``self.labels`` and ``self.hparams`` are set.
        """
        backbone = backbone_from_config(model_cfg)
        return backbone, build_head(model_cfg.get("head"), backbone.num_features, len(self.labels), self.labels)

    def features(self, images: torch.Tensor) -> torch.Tensor:
        """What the head reads: pooled ``(B, F)``, or the ``(B, F, h, w)`` map for a head that asks for it."""
        if getattr(self.head, "uses_feature_map", False):
            return self.backbone.forward_features(images)
        return self.backbone(images)

    def pooled(self, features: torch.Tensor) -> torch.Tensor:
        """``(B, F)`` from :meth:`features`' output, pooled as the backbone pools."""
        return self.backbone.forward_head(features) if features.ndim == 4 else features

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """``(B, 1, H, W)`` images to ``(B, C)`` logits (temperature-scaled once a temperature was fitted)."""
        return self.head(self.features(images)) / self.logit_temperature

    def training_loss(self, images: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """The head's loss (its own ``training_loss`` when it has extra terms) plus the weighted auxiliary loss."""
        features = self.features(images)
        head_loss = getattr(self.head, "training_loss", None)
        loss = (
            head_loss(features, targets, mask, self.loss)
            if head_loss
            else self.loss(self.head(features), targets, mask)
        )
        if self.aux_head is not None:
            loss = loss + self.aux_weight * self.loss(self.aux_head(self.pooled(features)), targets, mask)
        if self.aux_term is not None:
            loss = loss + self.aux_weight * self.aux_term(self.pooled(features), targets, mask)
        return loss

    def set_label_statistics(self, class_counts: np.ndarray, n_samples: int) -> None:
        """Hand the training counts to the loss and apply any bias initialisation it asks for.

        Called once before the first step (not on resume-sensitive state: the counts are recomputed from the
        same manifest, so a resumed run gets identical values).
        """
        self.train_counts.copy_(torch.as_tensor(class_counts, dtype=torch.float32))
        self.train_size.fill_(float(n_samples))
        self.loss.set_class_counts(torch.as_tensor(class_counts), n_samples)
        bias = self.loss.init_bias()
        if bias is not None:
            with torch.no_grad():
                self.head.bias.copy_(bias)
                if self.aux_head is not None:
                    self.aux_head.bias.copy_(bias)

    def setup(self, stage: str) -> None:
        datamodule = getattr(self.trainer, "datamodule", None)
        if stage == "fit" and datamodule is not None:
            self.set_label_statistics(datamodule.class_counts, datamodule.n_train)

    def freeze_backbone(self) -> None:
        """Train the head only (cRT): no gradients into the backbone and its normalisation statistics fixed."""
        self.backbone.requires_grad_(False)
        self.backbone_frozen = True

    def unfreeze_backbone(self) -> None:
        """Undo :meth:`freeze_backbone` (the end of ``two_phase=head_first``'s head-only phase)."""
        self.backbone.requires_grad_(True)
        self.backbone_frozen = False

    def on_train_epoch_start(self) -> None:
        if getattr(self, "backbone_frozen", False):
            self.backbone.eval()  # Lightning puts the whole module in train mode each epoch
        self.loss.on_epoch_start(self.current_epoch, run_epochs(self.trainer))  # a schedule may be a share of the run

    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        targets = batch["target"]  # (B, C), -1 = not labelled
        loss = self.training_loss(batch["image"], targets.clamp_min(0), targets >= 0)
        self.log("loss", loss, on_step=True, on_epoch=False, prog_bar=True, logger=False)
        self.train_loss.update(loss.detach(), len(targets))
        return loss

    def on_train_epoch_end(self) -> None:
        """Send the epoch's training metrics to the logger now, before the epoch's checkpoint is written.

        Lightning would log ``on_epoch`` values only after the checkpoint callbacks ran; a process killed in
        between would then resume past an epoch whose training loss never reached MLflow. Logging here, then
        checkpointing (``save_on_train_epoch_end``), makes "checkpoint exists" imply "epoch fully logged".
        """
        metrics = {"train/loss": float(self.train_loss.compute()), "train/lr": self.optimizers().param_groups[0]["lr"]}
        self.train_loss.reset()
        self.log_dict(metrics, logger=False)
        if self.logger is not None:
            self.logger.log_metrics({**metrics, "epoch": self.current_epoch}, step=self.global_step)

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        """Store the global random states, and blank the secrets of the stored hyperparameters (a checkpoint is
        shared like a run: ``+model.hub_token=...`` must not travel inside ``best.ckpt``).

        Lightning does not save the random states, yet dropout and drop path draw from them. The checkpoint is written
        after the epoch's validation and the loaders do not draw from these generators, so the saved state is exactly
        the next epoch's; under DDP every rank draws alike, so rank 0's serves all.
        """
        checkpoint[GLOBAL_RNG_KEY] = global_rng_state()
        if "hyper_parameters" in checkpoint:  # the constructor's configs, as they may be shared with the weights
            checkpoint["hyper_parameters"] = redact(checkpoint["hyper_parameters"])

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        """Restore the global random states, but only for a Trainer resuming a fit.

        Loading weights elsewhere (``load_from_checkpoint``, validation or test with a checkpoint) must not reset
        the caller's random generators as a side effect.
        """
        trainer = getattr(self, "_trainer", None)
        if GLOBAL_RNG_KEY in checkpoint and trainer is not None and trainer.state.fn == TrainerFn.FITTING:
            restore_global_rng_state(checkpoint[GLOBAL_RNG_KEY])

    def validation_step(self, batch: dict, batch_idx: int) -> None:
        probs = torch.sigmoid(self(batch["image"]))
        self.val_metrics.update(probs, batch["target"].long())

    @property
    def groups(self) -> dict[str, list[int]]:
        """Head-to-tail groups of the output classes, from the training prevalence."""
        return class_groups(self.labels, self.train_counts.cpu().numpy(), int(self.train_size.item()))

    def on_validation_epoch_end(self) -> None:
        values = self.val_metrics.compute()
        positives, negatives = values["counts"]
        ap = torch.where(positives > 0, values[VAL_AP.key], torch.nan)  # (C,)
        auroc = torch.where((positives > 0) & (negatives > 0), values[VAL_AUROC.key], torch.nan)
        self.log(f"val/{VAL_AP.name}", ap.nanmean(), prog_bar=True)
        self.log(f"val/{VAL_AUROC.name}", auroc.nanmean(), prog_bar=True)
        for group, value in group_means(ap.cpu().numpy(), self.groups).items():
            self.log(f"val/group/{group}/{VAL_AP.name}", value)
        self.val_metrics.reset()

    def configure_optimizers(self):
        cfg = self.hparams.model_cfg
        # (head?, decayed?) -> parameters. The head may learn faster than a pretrained backbone (``model.head_lr``:
        # the 2026 winner's 1.5e-4 beside 1.5e-5); norms and biases are never decayed.
        # Without one, the groups are the two earlier runs' checkpoints hold, so they still resume.
        head_lr, phase = cfg.get("head_lr"), self.head_only_phase
        split = bool(head_lr) or phase is not None  # a head-only phase needs the head's groups apart
        groups: dict[tuple[bool, bool], list] = {(h, d): [] for h in (False, True) for d in (True, False)}
        for name, param in self.named_parameters():
            if param.requires_grad:
                decayed = not (param.ndim <= 1 or name.endswith(".bias"))
                groups[(split and name.startswith(("head.", "aux_head.")), decayed)].append(param)
        kept = [(head, decayed, params) for (head, decayed), params in groups.items() if params]
        optimizer = torch.optim.AdamW(
            [{"params": params, "lr": (head_lr or cfg["lr"]) if head else cfg["lr"],
              "weight_decay": cfg["weight_decay"] * decayed} for head, decayed, params in kept],
            lr=cfg["lr"],
        )  # fmt: skip
        total = int(self.trainer.estimated_stepping_batches)
        per_epoch = total / max(1, self.trainer.max_epochs)
        schedules = [  # per group: phase one (if any) holds the head at its own rate, the backbone at 0
            partial(
                phased_multiplier, phase_one_steps=int(round(phase.epochs * per_epoch)) if phase else 0,
                phase_one_factor=phase.lr / group["lr"] if phase and head else 0.0, total_steps=total,
                warmup_steps=int(round(cfg.get("warmup_epochs", 0) * per_epoch)),
                min_factor=cfg.get("min_lr_factor", 0.0),
            )
            for group, (head, _, _) in zip(optimizer.param_groups, kept, strict=True)
        ]  # fmt: skip
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedules)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}


def _default_temperature(module, state_dict, prefix, *args) -> None:
    """A checkpoint from before temperature scaling has no ``logit_temperature``: it was unscaled (all ones)."""
    key = f"{prefix}logit_temperature"
    if key not in state_dict and any(name.startswith(prefix) for name in state_dict):
        state_dict[key] = torch.ones_like(module.logit_temperature)


class LabelCounts(Metric):
    """Positives and negatives per class over the epoch (ignoring -1), summed across processes."""

    full_state_update = False

    def __init__(self, num_labels: int):
        super().__init__()
        self.add_state("positives", torch.zeros(num_labels), dist_reduce_fx="sum")
        self.add_state("negatives", torch.zeros(num_labels), dist_reduce_fx="sum")

    def update(self, preds: torch.Tensor, targets: torch.Tensor) -> None:
        self.positives += (targets == 1).sum(dim=0)
        self.negatives += (targets == 0).sum(dim=0)

    def compute(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.positives, self.negatives
