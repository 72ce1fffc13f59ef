"""tau-normalisation of a linear classifier (Kang et al. 2020), tau chosen on validation, written into the head.

A classifier trained on long-tailed data grows larger weight vectors for frequent classes; ``w_c <- w_c /
||w_c||^tau`` evens them out. The bias is kept, so ``tau = 0`` is exactly the trained classifier; the paper's
code scores without a bias, which for a sigmoid head would throw away each class's learned prior. Each class's
new logit is an increasing function of its old one, so AP and AUROC are the same for every ``tau``; only F1,
precision, recall at a threshold and ECE move (tuned by a ranking metric, every ``tau`` ties and 0 is kept).
The chosen ``tau`` is written into ``model.head.weight`` before the test phase, so every later prediction uses
it; ``make evaluate`` tunes again from the stored head, and ``tau = 0`` in the grid keeps it unless another wins.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from hydra.utils import instantiate
from torch import nn

from evaluation.metric_registry import SUITE
from evaluation.suite import compute_suite

log = logging.getLogger(__name__)

ARTIFACT = "postprocess/tau_norm.json"
PREFIX = "val/"
#: Metric values closer than this count as a tie (a ranking metric differs across tau by rounding only).
TIE = 1e-9


def normalised_weight(weight: torch.Tensor, tau: float) -> torch.Tensor:
    """``(C, F)`` rows divided by their L2 norm to the power ``tau``; an all-zero row stays zero."""
    norms = weight.norm(dim=1, keepdim=True).clamp_min(torch.finfo(weight.dtype).tiny)
    return weight / norms**tau


def suite_metric(metric: str):
    """The suite entry ``val/<macro>`` names, or ValueError naming the choices."""
    name = metric.removeprefix(PREFIX)
    usable = {entry.name: entry for entry in SUITE if not entry.needs_val_thresholds}
    if not metric.startswith(PREFIX) or name not in usable:
        choices = ", ".join(f"{PREFIX}{entry}" for entry in usable)
        raise ValueError(f"postprocess.metric {metric!r} is not a validation suite metric; choose one of {choices}")
    return usable[name]


@dataclass(frozen=True)
class TauNormaliser:
    """The ``_target_`` of ``configs/postprocess/tau_norm.yaml``: the grid and the metric ``tau`` is chosen by."""

    metric: str = "val/mAP"
    start: float = 0.0
    stop: float = 2.0
    step: float = 0.1

    def __post_init__(self) -> None:
        suite_metric(self.metric)
        if not (self.step > 0 and 0 <= self.start <= self.stop):
            raise ValueError("postprocess tau grid needs 0 <= start <= stop and step > 0")

    @property
    def taus(self) -> np.ndarray:
        count = int(np.floor((self.stop - self.start) / self.step + 1e-9)) + 1
        return np.round(self.start + self.step * np.arange(count), 10)

    def scores(self, features: np.ndarray, weight: torch.Tensor, bias: torch.Tensor, targets: np.ndarray,
               labels: list[str]) -> np.ndarray:  # fmt: skip
        """The metric of each ``tau`` on ``(N, F)`` validation features with ``(N, C)`` targets."""
        entry, f = suite_metric(self.metric), torch.as_tensor(features, dtype=torch.float64)
        values = []
        for tau in self.taus:
            logits = f @ normalised_weight(weight.double(), float(tau)).T + bias.double()
            probs = torch.sigmoid(logits).numpy()
            values.append(compute_suite(targets, probs, labels, n_boot=0).metrics[entry.name])
        return np.asarray(values, dtype=np.float64)

    def choose(self, values: np.ndarray) -> int:
        """Index of the best ``tau``; the smallest among ties, so a flat metric keeps the trained classifier."""
        oriented = values if suite_metric(self.metric).higher_is_better else -values
        best = np.nanmax(oriented)
        return int(np.flatnonzero(np.isclose(oriented, best, rtol=0, atol=TIE))[0])


@dataclass
class TauNormResult:
    """The grid, its validation values and the chosen ``tau``."""

    metric: str
    taus: np.ndarray
    values: np.ndarray
    chosen: int
    norms: dict[str, float] = field(default_factory=dict)

    @property
    def tau(self) -> float:
        return float(self.taus[self.chosen])

    def logged(self) -> dict[str, float]:
        """``tau_norm/tau`` and the validation metric at ``tau = 0`` and at the chosen ``tau``."""
        name = self.metric.removeprefix(PREFIX)
        out = {"tau_norm/tau": self.tau, f"tau_norm/val_{name}_tau0": float(self.values[0]),
               f"tau_norm/val_{name}_chosen": float(self.values[self.chosen])}  # fmt: skip
        return {key: value for key, value in out.items() if np.isfinite(value)}

    def write(self, path: Path) -> Path:
        """``postprocess/tau_norm.json``: the metric, every grid value and the trained classifier's weight norms."""
        path.parent.mkdir(parents=True, exist_ok=True)
        record = {"metric": self.metric, "tau": self.tau, "grid": {f"{t:g}": float(v) for t, v in
                  zip(self.taus, self.values, strict=True)}, "weight_norms": self.norms}  # fmt: skip
        path.write_text(json.dumps(record, indent=1))
        return path


def linear_head(model) -> nn.Linear:
    """The model's head when it is a plain linear classifier on the pooled feature, else ValueError naming it."""
    head = getattr(model, "head", None)
    if type(head) is not nn.Linear:
        raise ValueError(f"postprocess=tau_norm needs a linear head (head=linear); this model's head is "
                         f"{type(head).__name__}")  # fmt: skip
    return head


def validation_features(model, loader) -> np.ndarray:
    """``(N, F)`` float64 pooled features of a loader's images, in order, as the head reads them."""
    device, chunks = next(model.parameters()).device, []
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            for batch in loader:
                chunks.append(model.features(batch["image"].to(device)).double().cpu())
    finally:
        model.train(was_training)
    return torch.cat(chunks).numpy()


def normalise_classifier(model, datamodule, node) -> TauNormResult | None:
    """Tune ``tau`` on validation and write the normalised weights into ``model.head``; None when not configured."""
    if not node or not node.get("_target_"):
        return None
    normaliser: TauNormaliser = instantiate({k: v for k, v in node.items() if k != "name"}, _convert_="all")
    head = linear_head(model)
    weight, bias = head.weight.detach().cpu(), head.bias.detach().cpu()
    features = validation_features(model, datamodule.eval_dataloader("val"))
    targets = datamodule.datasets["val"].targets.numpy()
    labels = list(model.labels)
    values = normaliser.scores(features, weight, bias, targets, labels)
    norms = {name: float(n) for name, n in zip(labels, weight.double().norm(dim=1).tolist(), strict=True)}
    result = TauNormResult(normaliser.metric, normaliser.taus, values, normaliser.choose(values), norms)
    with torch.no_grad():
        head.weight.copy_(normalised_weight(head.weight, result.tau))
    log.warning("tau-normalised classifier: tau %.2f chosen by %s (%.4f; %.4f at tau 0)", result.tau,
                result.metric, values[result.chosen], values[0])  # fmt: skip
    return result
