"""Test-time augmentation: run a model on several views of each image and merge the predictions.

TTA is reported on its own (``test_tta/...``), never mixed into the plain or perturbed reports (docs/rules.md §4).

Views operate on already normalised ``(B, 1, H, W)`` batches, as the DataLoader yields them, so TTA needs no
second data pipeline. Uncovered area is filled with the *normalised* value of black, ``(0 - mean) / std``, the
border the training affine and the perturbed set use: filling with 0.0 would paint a mid-grey frame the model
never saw. Views and merges are looked up by name in :data:`VIEW_FACTORIES` and :data:`MERGES`; a view factory
returns a *list*, so one entry can expand to several (``multicrop`` with ``flip``: the 10-crop).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from evaluation.normalisation import GRAY_MEAN, GRAY_STD

BLACK = (0.0 - GRAY_MEAN) / GRAY_STD  # a black pixel after normalisation


# ---------------------------------------------------------------------------------------------------- views


class View:
    """One deterministic test-time view: ``(B, 1, H, W)`` normalised tensor in, same shape out."""

    def __call__(self, images: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError


@dataclass(frozen=True)
class Identity(View):
    """The image as is (returns the very same tensor, no copy)."""

    def __call__(self, images: torch.Tensor) -> torch.Tensor:
        return images


@dataclass(frozen=True)
class HFlip(View):
    """Left-right mirror. Note: it puts the heart on the right, which models trained without flips rarely saw."""

    def __call__(self, images: torch.Tensor) -> torch.Tensor:
        return torch.flip(images, dims=(-1,))


def _resample(images: torch.Tensor, scale: float = 1.0, dx: float = 0.0, dy: float = 0.0) -> torch.Tensor:
    """Zoom about the centre by ``scale`` and move content by ``(dx, dy)`` fractions of the size, black outside.

    Output position ``x`` (normalised to [-1, 1] over pixel edges, ``align_corners=False``) shows the input at
    ``(x - 2 d) / scale``: a shift of ``d`` of the width is ``2 d`` in those units.
    """
    b = images.shape[0]
    theta = torch.tensor(
        [[1.0 / scale, 0.0, -2.0 * dx / scale], [0.0, 1.0 / scale, -2.0 * dy / scale]],
        dtype=images.dtype,
        device=images.device,
    ).expand(b, 2, 3)  # (B, 2, 3)
    grid = F.affine_grid(theta, list(images.shape), align_corners=False)  # (B, H, W, 2)
    # grid_sample pads with zeros; sampling (x - black) and adding black back makes the padding black instead.
    shifted = F.grid_sample(images - BLACK, grid, mode="bilinear", padding_mode="zeros", align_corners=False)
    return shifted + BLACK  # (B, 1, H, W)


@dataclass(frozen=True)
class Scale(View):
    """Zoom about the centre, keeping the size: ``factor > 1`` crops the centre in, ``< 1`` pads a black frame."""

    factor: float

    def __call__(self, images: torch.Tensor) -> torch.Tensor:
        return _resample(images, scale=self.factor)


@dataclass(frozen=True)
class Shift(View):
    """Translate content by ``dx`` of the width (positive: right) and ``dy`` of the height (positive: down)."""

    dx: float
    dy: float

    def __call__(self, images: torch.Tensor) -> torch.Tensor:
        return _resample(images, dx=self.dx, dy=self.dy)


@dataclass(frozen=True)
class Rotate(View):
    """Rotate content by ``degrees`` about the centre (positive: counter-clockwise as displayed), black outside."""

    degrees: float

    def __call__(self, images: torch.Tensor) -> torch.Tensor:
        height, width = images.shape[-2:]
        angle = torch.deg2rad(torch.tensor(float(self.degrees), dtype=torch.float64))
        cos, sin = float(torch.cos(angle)), float(torch.sin(angle))
        # Output pixel (x, y) shows the input at the inverse rotation; normalised units differ per axis when the
        # image is not square, so the off-diagonal terms carry the aspect ratio.
        theta = torch.tensor(
            [[cos, -sin * height / width, 0.0], [sin * width / height, cos, 0.0]],
            dtype=images.dtype,
            device=images.device,
        ).expand(images.shape[0], 2, 3)  # (B, 2, 3)
        grid = F.affine_grid(theta, list(images.shape), align_corners=False)  # (B, H, W, 2)
        rotated = F.grid_sample(images - BLACK, grid, mode="bilinear", padding_mode="zeros", align_corners=False)
        return rotated + BLACK  # (B, 1, H, W)


@dataclass(frozen=True)
class Crop(View):
    """A crop of ``size`` (fraction of each side) resized back to full size.

    ``ay``/``ax`` place the crop: 0 = top/left edge, 0.5 = centred, 1 = bottom/right edge.
    """

    size: float
    ay: float
    ax: float

    def box(self, height: int, width: int) -> tuple[int, int, int, int]:
        """``(top, left, crop height, crop width)`` in pixels of an ``height x width`` image."""
        ch, cw = max(1, round(self.size * height)), max(1, round(self.size * width))
        return round(self.ay * (height - ch)), round(self.ax * (width - cw)), ch, cw

    def __call__(self, images: torch.Tensor) -> torch.Tensor:
        height, width = images.shape[-2:]
        top, left, ch, cw = self.box(height, width)
        crop = images[..., top : top + ch, left : left + cw]  # (B, 1, ch, cw)
        return F.interpolate(crop, size=(height, width), mode="bilinear", align_corners=False)  # (B, 1, H, W)


@dataclass(frozen=True)
class Mirrored(View):
    """Another view, then a left-right mirror: the flipped half of a 10-crop."""

    view: View

    def __call__(self, images: torch.Tensor) -> torch.Tensor:
        return torch.flip(self.view(images), dims=(-1,))


def _floats(value) -> list[float]:
    """A scalar or a sequence (list, tuple, OmegaConf ListConfig) as a list of floats."""
    return [float(value)] if isinstance(value, int | float) else [float(v) for v in value]


def identity_views() -> list[View]:
    return [Identity()]


def hflip_views() -> list[View]:
    return [HFlip()]


def scale_views(factors: float | Sequence[float] = (0.9, 1.1)) -> list[View]:
    """One zoom per factor; the default pair zooms out and in symmetrically so neither direction dominates."""
    return [Scale(f) for f in _floats(factors)]


def shift_views(fraction: float = 0.05, offsets: Sequence[Sequence[float]] | None = None) -> list[View]:
    """Explicit ``offsets`` ``[[dx, dy], ...]``, or by default ``fraction`` left, right, up and down.

    The default is symmetric so the merged prediction is not biased towards one direction.
    """
    if offsets is None:
        offsets = [(fraction, 0.0), (-fraction, 0.0), (0.0, fraction), (0.0, -fraction)]
    return [Shift(*_floats(offset)) for offset in offsets]


def rotate_views(degrees: float | Sequence[float] = (-5.0, 5.0)) -> list[View]:
    """One rotation per angle; the default pair turns both ways by a few degrees, as a patient's tilt would."""
    return [Rotate(d) for d in _floats(degrees)]


MULTICROP_ANCHORS = {"top_left": (0.0, 0.0), "top_right": (0.0, 1.0), "bottom_left": (1.0, 0.0),
                     "bottom_right": (1.0, 1.0), "centre": (0.5, 0.5)}  # fmt: skip


def multicrop_views(
    size: float = 0.9, anchors: Sequence[str] = tuple(MULTICROP_ANCHORS), flip: bool = False
) -> list[View]:
    """Crops of ``size`` at the 4 corners and the centre (by default), each resized back to full size.

    ``flip`` adds each crop's mirror image after the crops: the classic 10-crop (4 corners and the centre, each
    also flipped), the test-time augmentation of the CXR-LT 2026 Task 1 entry of overview Table 2 row D.
    """
    if not 0.0 < size <= 1.0:
        raise ValueError(f"multicrop size must be in (0, 1], got {size}")
    crops: list[View] = [Crop(float(size), *MULTICROP_ANCHORS[anchor]) for anchor in anchors]
    return crops + [Mirrored(crop) for crop in crops] if flip else crops


VIEW_FACTORIES: dict[str, Callable[..., list[View]]] = {
    "identity": identity_views,
    "hflip": hflip_views,
    "scale": scale_views,
    "shift": shift_views,
    "rotate": rotate_views,
    "multicrop": multicrop_views,
}


def build_views(specs: Sequence[str | Mapping]) -> list[View]:
    """Expand view specs into views.

    Args:
        specs: each a registered name (``"hflip"``) or a mapping with ``name`` plus the factory's keyword
            arguments (``{"name": "scale", "factors": [1.1]}``).
    """
    views: list[View] = []
    for spec in specs:
        kwargs = {"name": spec} if isinstance(spec, str) else dict(spec)
        name = kwargs.pop("name", None)
        if name not in VIEW_FACTORIES:
            raise KeyError(f"unknown TTA view {name!r}; known: {sorted(VIEW_FACTORIES)}")
        try:
            views += VIEW_FACTORIES[name](**kwargs)
        except TypeError as error:
            raise TypeError(f"bad arguments for TTA view {name!r}: {kwargs} ({error})") from error
    if not views:
        raise ValueError("TTA needs at least one view")
    return views


# --------------------------------------------------------------------------------------------------- merges
# Each merge takes the logits of all views, (V, N, C), and returns probabilities (N, C). Logits are the common
# input because logit_mean needs them and every other rule can derive probabilities from them exactly.


def merge_mean(logits: torch.Tensor) -> torch.Tensor:
    """Arithmetic mean of the views' probabilities."""
    return torch.sigmoid(logits).mean(dim=0)


def merge_max(logits: torch.Tensor) -> torch.Tensor:
    """Largest probability over views: favours recall, since a finding seen in any view counts."""
    return torch.sigmoid(logits).amax(dim=0)


def merge_geometric_mean(logits: torch.Tensor) -> torch.Tensor:
    """Geometric mean of probabilities, through ``logsigmoid`` so a very negative logit does not underflow to 0."""
    return torch.exp(F.logsigmoid(logits).mean(dim=0))


def merge_logit_mean(logits: torch.Tensor) -> torch.Tensor:
    """Sigmoid of the mean logit."""
    return torch.sigmoid(logits.mean(dim=0))


MERGES: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "mean": merge_mean,
    "max": merge_max,
    "geometric_mean": merge_geometric_mean,
    "logit_mean": merge_logit_mean,
}


# ------------------------------------------------------------------------------------------------ predictor


def normalise_uint8(images: np.ndarray | torch.Tensor) -> torch.Tensor:
    """``(B, H, W)`` uint8 -> ``(B, 1, H, W)`` float32, the same values as ``build_transform(None)`` gives.

    Lets cached uint8 sets (e.g. the perturbed set, a memory map) be fed batch by batch without a Dataset.
    """
    images = images if isinstance(images, torch.Tensor) else torch.as_tensor(np.asarray(images))
    return ((images.float() / 255.0 - GRAY_MEAN) / GRAY_STD).unsqueeze(1)


class TTAPredictor:
    """Runs a model on every view of every batch and merges the per-view logits.

    ``batch_size`` applies when images are given as one array rather than a loader.
    """

    def __init__(self, views: Sequence[str | Mapping] = ("identity",), merge: str = "mean", batch_size: int = 32):
        if merge not in MERGES:
            raise KeyError(f"unknown TTA merge {merge!r}; known: {sorted(MERGES)}")
        self.views = build_views(views)
        self.merge_name = merge
        self.batch_size = batch_size

    @classmethod
    def from_config(cls, cfg: Mapping) -> TTAPredictor:
        """Build from a ``configs/tta/*.yaml`` node (plain dict or OmegaConf); ignores ``name`` and ``enabled``."""
        if hasattr(cfg, "_get_node"):  # an OmegaConf container: plain Python values for the factories
            from omegaconf import OmegaConf

            cfg = OmegaConf.to_container(cfg, resolve=True)
        return cls(views=cfg.get("views", ["identity"]), merge=cfg.get("merge", "mean"),
                   batch_size=cfg.get("batch_size", 32))  # fmt: skip

    def describe(self) -> list[str]:
        """One readable line per expanded view, e.g. for logging as a run parameter."""
        return [repr(view) for view in self.views]

    def _batches(self, source) -> Iterator[torch.Tensor]:
        """Normalised ``(B, 1, H, W)`` batches from an array/tensor of images or from a loader."""
        if isinstance(source, np.ndarray | torch.Tensor):
            for start in range(0, len(source), self.batch_size):
                chunk = source[start : start + self.batch_size]
                # np.array copies: a read-only memory map (the cached perturbed set) cannot back a tensor.
                chunk = torch.from_numpy(np.array(chunk)) if isinstance(chunk, np.ndarray) else chunk
                if chunk.ndim == 3 and chunk.dtype == torch.uint8:  # (B, H, W) raw pixels
                    yield normalise_uint8(chunk)
                else:  # (B, 1, H, W) already normalised
                    yield chunk
            return
        for batch in source:
            yield batch["image"] if isinstance(batch, Mapping) else batch

    @torch.no_grad()
    def predict_logits(self, model: torch.nn.Module, source: Iterable, device=None) -> np.ndarray:
        """Per-view logits ``(V, N, C)``, rows in the order of ``source``.

        Kept separate from merging so several merge rules can be compared without rerunning the model. ``source`` is
        ``(N, H, W)`` uint8 or ``(N, 1, H, W)`` normalised images, or an iterable of batches (dicts with ``"image"``,
        or plain tensors); the model is put in eval mode for the call and restored after.
        """
        if device is None:
            device = next(model.parameters(), torch.empty(0)).device
        device = torch.device(device)
        model.to(device)
        was_training = model.training
        model.eval()
        try:
            chunks = []
            for images in self._batches(source):
                images = images.to(device, non_blocking=True).float()  # (B, 1, H, W)
                per_view = [model(view(images)).float() for view in self.views]  # V x (B, C)
                chunks.append(torch.stack(per_view).cpu())  # (V, B, C)
        finally:
            model.train(was_training)
        if not chunks:
            raise ValueError("no images to predict")
        return torch.cat(chunks, dim=1).numpy()  # (V, N, C)

    def merge(self, logits: np.ndarray | torch.Tensor) -> np.ndarray:
        """Merge ``(V, N, C)`` per-view logits into ``(N, C)`` float32 probabilities with this predictor's rule."""
        return MERGES[self.merge_name](torch.as_tensor(logits, dtype=torch.float32)).numpy()

    def predict(self, model: torch.nn.Module, loader_or_images: Iterable, device=None) -> np.ndarray:
        """Merged probabilities ``(N, C)`` float32 (see :meth:`predict_logits` for the arguments)."""
        return self.merge(self.predict_logits(model, loader_or_images, device))
