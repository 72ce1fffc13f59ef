"""Temperature scaling fitted on validation, written into the model so every later prediction carries it.

A network trained with BCE on long-tailed labels is usually over-confident, and mECE is a tie-break; dividing
the logits by a positive temperature changes no ranking, so AP and AUROC stay exactly as they were. The fit
minimises the BCE of ``sigmoid(z / T)`` over labelled validation entries by L-BFGS on ``log T`` in float64, so
``T`` stays positive and the result is reproducible. ``per_class`` keeps the global ``T`` for a class whose
labelled entries are all of one kind: its likelihood keeps improving as ``T`` goes to 0 or infinity, which says
nothing about calibration. The values go into ``model.logit_temperature``, so every later prediction (stored
checkpoint, evaluate, submit, serving) uses them. With ``calibration=none`` a global ``T`` is only reported.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from hydra.utils import instantiate

from evaluation.calibration import ece, pooled_ece
from evaluation.tta import TTAPredictor

log = logging.getLogger(__name__)

MODES = ("global", "per_class")
ARTIFACT = "calibration/temperature.json"


@dataclass(frozen=True)
class TemperatureFitter:
    """The ``_target_`` of ``configs/calibration/{global,per_class}.yaml``.

    Args:
        mode: ``global`` (one ``T``) or ``per_class`` (one ``T`` per class, the global one where undetermined).
        max_iter: L-BFGS iterations; the problem is convex in ``log T``, so a few dozen suffice.
        min_temperature, max_temperature: the clamp, so a degenerate validation set cannot zero or explode logits.
        name: the config's public name; unused here.
    """

    mode: str = "global"
    max_iter: int = 100
    min_temperature: float = 0.05
    max_temperature: float = 20.0
    name: str | None = None

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"calibration mode must be one of {MODES}, got {self.mode!r}")
        if not 0 < self.min_temperature <= 1 <= self.max_temperature:
            raise ValueError("need 0 < min_temperature <= 1 <= max_temperature")

    def fit(self, logits: np.ndarray, targets: np.ndarray) -> np.ndarray:
        """``(C,)`` temperatures from unscaled ``(N, C)`` logits and ``(N, C)`` targets in {-1, 0, 1}."""
        z = torch.as_tensor(np.asarray(logits), dtype=torch.float64)
        y = torch.as_tensor(np.asarray(targets), dtype=torch.float64)
        mask = y >= 0
        if z.shape != y.shape or z.ndim != 2:
            raise ValueError(f"logits {tuple(z.shape)} and targets {tuple(y.shape)} must be the same (N, C)")
        n_classes = z.shape[1]
        if not mask.any():
            return np.ones(n_classes)
        global_t = float(self._fit(z[mask][None], y[mask][None], mask[mask][None])[0])
        if self.mode == "global":
            return np.full(n_classes, global_t)
        positives, negatives = (mask & (y > 0)).sum(0), (mask & (y == 0)).sum(0)
        determined = (positives > 0) & (negatives > 0)
        out = np.full(n_classes, global_t)
        if determined.any():
            columns = determined.nonzero().flatten()
            out[columns.numpy()] = self._fit(z[:, columns].T, y[:, columns].T, mask[:, columns].T)
        return out

    def _fit(self, z: torch.Tensor, y: torch.Tensor, mask: torch.Tensor) -> np.ndarray:
        """One temperature per row of ``(K, N)`` logits; each row's loss is its own masked mean BCE."""
        log_t = torch.zeros(z.shape[0], dtype=torch.float64, requires_grad=True)
        weight = mask.to(torch.float64) / mask.sum(1, keepdim=True).clamp_min(1)
        optimiser = torch.optim.LBFGS([log_t], lr=1.0, max_iter=self.max_iter, line_search_fn="strong_wolfe",
                                      tolerance_grad=1e-10, tolerance_change=1e-12)  # fmt: skip

        def closure() -> torch.Tensor:
            optimiser.zero_grad()
            scaled = z / log_t.exp()[:, None]
            loss = (torch.nn.functional.binary_cross_entropy_with_logits(scaled, y.clamp(0, 1), reduction="none")
                    * weight).sum()  # fmt: skip
            loss.backward()
            return loss

        optimiser.step(closure)
        return log_t.detach().exp().clamp(self.min_temperature, self.max_temperature).numpy()


def scaled_probs(logits: np.ndarray, temperature: np.ndarray) -> np.ndarray:
    """``sigmoid(z / T)`` in float64: the probabilities the model gives once ``T`` is in its buffer."""
    return 1.0 / (1.0 + np.exp(-np.asarray(logits, dtype=np.float64) / np.asarray(temperature, dtype=np.float64)))


def calibration_errors(targets: np.ndarray, probs: np.ndarray) -> dict[str, float]:
    """``mECE`` and ``ECE_pooled`` as the suite computes them: per-class ECE averaged over the classes with a
    positive (the challenge's rule for every macro), and the pooled ECE over all labelled pairs."""
    targets, probs = np.asarray(targets), np.asarray(probs, dtype=np.float64)
    per_class = [ece(targets[:, c], probs[:, c]) for c in range(targets.shape[1]) if (targets[:, c] == 1).any()]
    return {"mECE": float(np.mean(per_class)) if per_class else float("nan"),
            "ECE_pooled": float(pooled_ece(targets, probs))}  # fmt: skip


def mean_nll(targets: np.ndarray, probs: np.ndarray) -> float:
    """Mean BCE over labelled entries: the quantity the fit minimises, logged so a reader can see it fall."""
    y, p = np.asarray(targets, dtype=np.float64), np.clip(np.asarray(probs, dtype=np.float64), 1e-12, 1 - 1e-12)
    mask = y >= 0
    return float(-(y * np.log(p) + (1 - y) * np.log1p(-p))[mask].mean()) if mask.any() else float("nan")


@dataclass
class TemperatureResult:
    """What the test phase fitted on validation, whether it applied it, and val ECE/NLL before and after."""

    mode: str
    applied: bool
    temperature: np.ndarray
    labels: list[str]
    metrics: dict[str, float] = field(default_factory=dict)
    #: classes whose temperature fell back to the global one (no validation positive or no negative)
    fallback: list[str] = field(default_factory=list)
    #: ``(N, C)`` float32 validation logits of the unscaled model, as the fit read them: the test phase's
    #: validation predictions when the temperature is not applied (the model is then exactly that model)
    val_logits: np.ndarray | None = field(default=None, repr=False)

    def add_test(self, targets: np.ndarray, applied_probs: np.ndarray) -> None:
        """Test ECE before and after from the probabilities the test phase scored (those of the applied buffer).

        The other side is recomputed from them by inverting the applied temperature, so no second test pass is
        needed; the side that was scored matches the suite's ``test/mECE`` exactly.
        """
        applied_t = self.temperature if self.applied else np.ones_like(self.temperature)
        p = np.clip(np.asarray(applied_probs, dtype=np.float64), 1e-12, 1 - 1e-12)
        logits = np.log(p) - np.log1p(-p)  # = z / applied_t
        unscaled = logits * applied_t
        before = p if not self.applied else scaled_probs(unscaled, np.ones_like(applied_t))
        after = p if self.applied else scaled_probs(unscaled, self.temperature)
        self.record("test", targets, before, after)

    def record(self, split: str, targets: np.ndarray, before: np.ndarray, after: np.ndarray) -> None:
        for when, probs in (("before", before), ("after", after)):
            for name, value in calibration_errors(targets, probs).items():
                self.metrics[f"{split}/calibration/{name}_{when}"] = value
            self.metrics[f"{split}/calibration/nll_{when}"] = mean_nll(targets, probs)

    def logged(self) -> dict[str, float]:
        """Finite metrics, with the global (or mean per-class) temperature and whether it was applied."""
        out = {**self.metrics, "calibration/applied": float(self.applied)}
        key = "calibration/temperature" if self.mode == "global" else "calibration/temperature_mean"
        out[key] = float(np.mean(self.temperature))
        return {k: v for k, v in out.items() if np.isfinite(v)}

    def write(self, path: Path) -> Path:
        """``calibration/temperature.json``: mode, applied, the temperature per class and the before/after figures."""
        path.parent.mkdir(parents=True, exist_ok=True)
        record = {"mode": self.mode, "applied": self.applied, "fallback_to_global": self.fallback,
                  "temperature": {name: float(t) for name, t in zip(self.labels, self.temperature, strict=True)},
                  "metrics": {k: v for k, v in self.metrics.items() if np.isfinite(v)}}  # fmt: skip
        path.write_text(json.dumps(record, indent=1))
        return path


def fitter_from_config(node) -> TemperatureFitter | None:
    """The configured fitter, or None for ``calibration=none`` (a node without ``_target_``) or no node at all."""
    if not node or not node.get("_target_"):
        return None
    return instantiate(node, _convert_="all")


def honours_temperature(model, images: torch.Tensor) -> bool:
    """Whether ``model.forward`` divides by ``logit_temperature``: a zero-shot adapter's forward may not, and
    writing a temperature it ignores would report a calibration the predictions do not have."""
    buffer = model.logit_temperature
    saved = buffer.detach().clone()
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            images = images.to(buffer.device).float()
            buffer.fill_(1.0)
            plain = model(images).float()
            buffer.fill_(2.0)
            halved = model(images).float()
    finally:
        buffer.copy_(saved)
        model.train(was_training)
    return bool(torch.allclose(halved, plain / 2, rtol=1e-4, atol=1e-5))


def calibrate(model, datamodule, calibration_cfg) -> TemperatureResult | None:
    """Fit a temperature on validation with the model unscaled, and write it into the model when configured.

    Always fits (a global ``T`` when ``calibration=none``) so every report can show ECE before and after; applies
    it only when ``calibration`` names a fitter. Returns None for a model without a ``logit_temperature`` buffer,
    or one whose forward ignores it.
    """
    if not isinstance(getattr(model, "logit_temperature", None), torch.Tensor):
        return None
    configured = fitter_from_config(calibration_cfg)
    fitter = configured or TemperatureFitter(mode="global")
    loader = datamodule.eval_dataloader("val")
    first = next(iter(TTAPredictor(["identity"])._batches(loader)))[:4]
    if not honours_temperature(model, first):
        log.warning("%s ignores logit_temperature: temperature scaling skipped", type(model).__name__)
        return None
    with torch.no_grad():
        model.logit_temperature.fill_(1.0)  # fit on the unscaled logits, whatever a reloaded checkpoint held
    raw = TTAPredictor(["identity"]).predict_logits(model, loader)[0]  # (N, C) float32
    logits = raw.astype(np.float64)
    targets = datamodule.datasets["val"].targets.numpy()
    temperature = fitter.fit(logits, targets)
    labels = list(model.labels)
    undetermined = ~(((targets == 1).any(0)) & ((targets == 0).any(0)))
    fallback = [name for name, flag in zip(labels, undetermined, strict=True) if flag and fitter.mode == "per_class"]
    result = TemperatureResult(fitter.mode, configured is not None, temperature, labels, fallback=fallback,
                               val_logits=raw)  # fmt: skip
    result.record("val", targets, scaled_probs(logits, np.ones_like(temperature)), scaled_probs(logits, temperature))
    if result.applied:
        with torch.no_grad():
            model.logit_temperature.copy_(torch.as_tensor(temperature, dtype=model.logit_temperature.dtype))
    shown = f"{temperature[0]:.3f}" if fitter.mode == "global" else f"{temperature.min():.3f}..{temperature.max():.3f}"
    state = "applied" if result.applied else "diagnostic only, not applied"
    before, after = (result.metrics[f"val/calibration/mECE_{when}"] for when in ("before", "after"))
    log.warning("temperature scaling (%s, %s): T %s; val mECE %.4f -> %.4f", fitter.mode, state, shown, before, after)
    return result
