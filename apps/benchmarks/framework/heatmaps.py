"""One heatmap per (image, finding) from any benchmark encoder that can make one, and the floors every grounding
report compares them with.

The method is chosen by the encoder's class through :data:`HEATMAPPERS` (a subclass uses its nearest
registered base), so a new kind is one entry there: Grad-CAM for platform classifiers (on the sum of the logits
a target maps to, so a finding that is several outputs is explained as all of them; no mapped output: a NaN
map), patch-text similarity for open_clip ViT towers. Kinds without a convolutional map or patch grid
(transformer backbones, non-ViT CLIP towers) make none. See docs/benchmarks.md, "NIH grounding". Floors:
:func:`centre_prior` (what "findings are central" alone scores) and :func:`random_heatmaps` (chance level).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from apps.benchmarks.framework.clip_models import ClipEncoder
from apps.benchmarks.framework.encoders import Encoder
from apps.benchmarks.framework.extra import require
from apps.benchmarks.framework.platform_models import PlatformRunEncoder, head_input

__all__ = [
    "FLOOR_NOTES",
    "HEATMAPPERS",
    "FeatureLayer",
    "Heatmapper",
    "LogitSum",
    "centre_prior",
    "gradcam_layer",
    "heatmap_note",
    "heatmapper",
    "heatmaps",
    "random_heatmaps",
]

FLOOR_NOTES = {
    "centre prior": "an isotropic Gaussian on the image centre (sigma = a quarter of the side), the same for every "
    "image and finding",
    "random": "uniform noise, seeded, a fresh map per image and finding",
}
"""One line per floor, for the report."""


# --- floors ------------------------------------------------------------------------------------------------------


def centre_prior(size: int) -> np.ndarray:
    """``(size, size)`` float32 isotropic Gaussian centred on the image, sigma ``size / 4``, peak 1.

    Pixel ``j`` sits at its centre ``j + 0.5``, so the map is symmetric under flips and transposition (an even side
    has its four central pixels tied for the peak).
    """
    if size < 1:
        raise ValueError(f"size must be positive, got {size}")
    offset = (np.arange(size, dtype=np.float64) + 0.5 - size / 2) / (size / 4)
    return np.exp(-0.5 * (offset[:, None] ** 2 + offset[None, :] ** 2)).astype(np.float32)


def random_heatmaps(n: int, t: int, size: int, seed: int) -> np.ndarray:
    """``(n, t, size, size)`` float32 uniform noise in [0, 1) from a generator made from ``seed`` for this call, so
    the same arguments give the same maps wherever they are asked for."""
    return np.random.default_rng(seed).random((n, t, size, size), dtype=np.float32)


# --- dispatch ----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Heatmapper:
    """How one encoder kind makes heatmaps.

    Attributes:
        make: ``(encoder, images (B, S, S) uint8, target labels) -> (B, T, S, S)`` float32, or ``None`` when this
            particular model cannot (a transformer backbone, a non-ViT CLIP tower).
        describe: ``encoder -> one line`` for the report, naming the layer or grid used (or why there is none).
    """

    make: Callable[[Encoder, np.ndarray, Sequence[str]], np.ndarray | None]
    describe: Callable[[Encoder], str]


def heatmapper(encoder: Encoder) -> Heatmapper | None:
    """The :data:`HEATMAPPERS` entry of the encoder's class or its nearest registered base; ``None`` if none."""
    for cls in type(encoder).__mro__:
        if cls in HEATMAPPERS:
            return HEATMAPPERS[cls]
    return None


def heatmaps(encoder: Encoder, images: np.ndarray, labels: Sequence[str]) -> np.ndarray | None:
    """``(B, T, S, S)`` float32 heatmaps of ``(B, S, S)`` uint8 images for the target ``labels`` (of
    ``encoder.targets``, in the order asked), at the images' size; ``None`` when the encoder cannot make them.

    Raises:
        KeyError: a label that is not one of the encoder's targets.
        ValueError: images that are not a batch of square grey images.
    """
    images = np.asarray(images)
    if images.ndim != 3 or images.shape[1] != images.shape[2]:
        raise ValueError(f"images must be (B, S, S) square grey images, got {images.shape}")
    labels = list(labels)
    for label in labels:
        encoder.column(label)  # an unknown label is a bug, not a missing map
    method = heatmapper(encoder)
    if method is None:
        return None
    out = method.make(encoder, images, labels)
    if out is not None:
        expected = (len(images), len(labels), images.shape[1], images.shape[2])
        assert out.shape == expected, f"heatmaps {out.shape}, expected {expected}"
    return out


def heatmap_note(encoder: Encoder) -> str:
    """One line saying how ``encoder``'s heatmaps are made (or that it has none), for the report."""
    method = heatmapper(encoder)
    return f"no heatmaps for {type(encoder).__name__} models" if method is None else method.describe(encoder)


# --- platform classifiers: Grad-CAM ------------------------------------------------------------------------------


@dataclass(frozen=True)
class FeatureLayer:
    """Where Grad-CAM looks in a backbone.

    ``grid`` is the map's ``(h, w)`` at the probed input size; ``tokens_after``: a 3-D (token) output was computed
    after it, so the map is a transformer's patch embedding.
    """

    name: str
    module: nn.Module
    grid: tuple[int, int]
    tokens_after: bool

    @property
    def usable(self) -> bool:
        return not self.tokens_after


_LAYERS: weakref.WeakKeyDictionary[nn.Module, dict[int, FeatureLayer | None]] = weakref.WeakKeyDictionary()


def gradcam_layer(backbone: nn.Module, size: int) -> FeatureLayer | None:
    """The backbone's last spatial feature map, found by a probe: one forward pass of a ``(1, 1, size, size)``
    zero image with a forward hook on every module, recording the modules in the order they *finish*.

    The last module to finish with a 4-D output wins, skipping ``1 x 1`` maps (global pooling is where the map
    ends) and pass-through modules (so the name is the module that computed the map). A container finishes after
    its children, so the name is the outermost module producing the map (``layer4`` of a ResNet). Architecture
    names are never matched, so any timm convnet works. ``None``: no spatial map at this size. Cached weakly per
    backbone and size, so the cache does not keep a model alive.
    """
    cached = _LAYERS.setdefault(backbone, {})
    if size not in cached:
        cached[size] = _probe_layer(backbone, size)
    return cached[size]


def _probe_layer(backbone: nn.Module, size: int) -> FeatureLayer | None:
    finished: list[tuple[str, nn.Module, tuple[int, ...], bool]] = []  # name, module, output shape, pass-through

    def hook_for(name: str):
        def hook(module, inputs, output):
            if isinstance(output, torch.Tensor):
                through = any(output is x for x in inputs)
                finished.append((name, module, tuple(output.shape), through))

        return hook

    handles = [module.register_forward_hook(hook_for(name)) for name, module in backbone.named_modules()]
    try:
        with _frozen(backbone), torch.no_grad():
            device = next(iter(backbone.parameters()), torch.empty(0)).device
            backbone(torch.zeros(1, 1, size, size, device=device))
    finally:
        for handle in handles:
            handle.remove()
    chosen = None
    for position, (name, _, shape, through) in enumerate(finished):
        if len(shape) == 4 and shape[2] * shape[3] > 1 and not through and name:
            chosen = position
    if chosen is None:
        return None
    name, module, shape, _ = finished[chosen]
    tokens_after = any(len(later[2]) == 3 for later in finished[chosen + 1 :])
    return FeatureLayer(name, module, (shape[2], shape[3]), tokens_after)


@contextmanager
def _frozen(model: nn.Module) -> Iterator[None]:
    """Eval mode, parameters not requiring gradients, gradients computable (even inside ``inference_mode``); on
    exit every module's mode, every parameter's ``requires_grad`` and its ``.grad`` are as they were.

    With the parameters frozen, a backward pass to an input that requires gradients accumulates nothing in the
    model; restoring ``.grad`` also undoes pytorch-grad-cam's ``model.zero_grad()``.
    """
    modes = [(module, module.training) for module in model.modules()]
    params = list(model.parameters())
    state = [(p, p.requires_grad, p.grad) for p in params]
    try:
        model.eval()
        for p in params:
            p.requires_grad_(False)
        with torch.inference_mode(False), torch.enable_grad():
            yield
    finally:
        for module, training in modes:
            module.training = training
        for p, requires_grad, grad in state:
            p.requires_grad_(requires_grad)
            p.grad = grad


class LogitSum:
    """A pytorch-grad-cam target: the sum of the logits at ``indices`` (``ClassifierOutputTarget`` for several
    outputs). Called with one image's ``(L,)`` logits, or a batch's ``(B, L)``."""

    def __init__(self, indices: Sequence[int]):
        if not indices:
            raise ValueError("a Grad-CAM target needs at least one output")
        self.indices = list(indices)

    def __call__(self, logits: torch.Tensor) -> torch.Tensor:
        return logits[..., self.indices].sum(dim=-1)


class _Logits(nn.Module):
    """``head(features(x))``: the logits exactly as :meth:`PlatformRunEncoder.encode` computes them (a head that
    reads the unpooled map gets it, as in training)."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model.head(head_input(self.model, x)[0])


def gradcam_heatmaps(encoder: PlatformRunEncoder, images: np.ndarray, labels: Sequence[str]) -> np.ndarray | None:
    """Grad-CAM maps of a platform classifier (see the module docstring); ``None`` for a transformer backbone."""
    model = encoder.model
    n, size = len(images), images.shape[-1]
    layer = gradcam_layer(model.backbone, size)
    if layer is None or not layer.usable:
        return None
    out = np.full((n, len(labels), size, size), np.nan, dtype=np.float32)
    wanted = [(j, encoder.indices[label]) for j, label in enumerate(labels) if encoder.indices[label]]
    if not wanted or n == 0:
        return out
    with _frozen(model):
        x = encoder.to_tensor(images).requires_grad_(True)  # the graph reaches the map through the input alone
        cam = require("pytorch_grad_cam").GradCAM(_Logits(model), [layer.module])
        try:
            for j, columns in wanted:
                out[:, j] = cam(x, [LogitSum(columns)] * n)
        finally:
            cam.activations_and_grads.release()  # not `with`: its __exit__ swallows IndexError
            cam.outputs = None
    return out


def gradcam_note(encoder: PlatformRunEncoder) -> str:
    layer = gradcam_layer(encoder.model.backbone, encoder.image_size)
    if layer is None:
        return f"no heatmaps: the backbone has no spatial feature map at {encoder.image_size} px"
    if not layer.usable:
        return (f"no heatmaps: the backbone's last 4-D map (backbone.{layer.name}) is a transformer's patch "
                "embedding, not a convolutional feature map")  # fmt: skip
    h, w = layer.grid
    return (f"Grad-CAM on backbone.{layer.name} (a {h}x{w} map) for the sum of the mapped logits, "
            "ReLU'd and min-max scaled per image; NaN for a finding without a mapped output")  # fmt: skip


# --- open_clip image-text models: patch-text similarity ----------------------------------------------------------


def _clip_vit(encoder: ClipEncoder) -> nn.Module | None:
    """The open_clip ``VisionTransformer`` whose patch tokens can be projected like its pooled embedding; ``None``
    for other towers and for attention-pooled ViTs (CoCa), whose tokens never pass through ``proj``."""
    from open_clip.transformer import VisionTransformer

    visual = getattr(encoder.model, "visual", None)
    if not isinstance(visual, VisionTransformer) or visual.attn_pool is not None:
        return None
    if visual.pool_type not in ("tok", "avg") or visual.proj is None:
        return None
    return visual


@torch.inference_mode()
def patch_text_heatmaps(encoder: ClipEncoder, images: np.ndarray, labels: Sequence[str]) -> np.ndarray | None:
    """Cosine similarity of each projected patch token with each target's positive prompt, upsampled bilinearly
    to the images' size; ``None`` for a non-ViT tower."""
    visual = _clip_vit(encoder)
    if visual is None:
        return None
    n, size = len(images), images.shape[-1]
    if not labels or n == 0:
        return np.zeros((n, len(labels), size, size), dtype=np.float32)
    prompts = [encoder.targets[encoder.column(label)].positive_prompt for label in labels]
    text = torch.from_numpy(encoder.embed_texts(prompts))  # (T, D), normalised

    captured: list[torch.Tensor] = []
    handle = visual.transformer.register_forward_hook(lambda module, inputs, output: captured.append(output))
    try:
        encoder.model.encode_image(encoder.to_tensor(images))
    finally:
        handle.remove()
    (tokens,) = captured  # (B, 1 + g*g, width)
    if not getattr(visual.transformer, "batch_first", True):
        tokens = tokens.transpose(0, 1)
    gh, gw = visual.grid_size
    if tokens.shape[1] != 1 + gh * gw:
        raise ValueError(f"expected 1 class token and {gh}x{gw} patch tokens, got {tokens.shape[1]} tokens")
    patches = visual.ln_post(tokens[:, 1:]) @ visual.proj  # the pooled embedding's final norm and projection
    patches = F.normalize(patches.float(), dim=-1)  # (B, g*g, D)
    grid = (patches @ text.T).transpose(1, 2).reshape(n, len(labels), gh, gw)  # row-major patches, like conv1
    maps = F.interpolate(grid, size=(size, size), mode="bilinear", align_corners=False)
    return maps.numpy().astype(np.float32)


def patch_text_note(encoder: ClipEncoder) -> str:
    visual = _clip_vit(encoder)
    if visual is None:
        return ("no heatmaps: only open_clip ViT towers without attention pooling have patch tokens in the "
                "embedding space")  # fmt: skip
    gh, gw = visual.grid_size
    return (f"patch-text similarity of the {gh}x{gw} ViT patch grid: cosine of each patch token (final norm and "
            "projection of the pooled embedding) with the finding's positive prompt")  # fmt: skip


HEATMAPPERS: dict[type[Encoder], Heatmapper] = {
    PlatformRunEncoder: Heatmapper(gradcam_heatmaps, gradcam_note),
    ClipEncoder: Heatmapper(patch_text_heatmaps, patch_text_note),
}
"""Encoder class -> how it makes heatmaps. A kind not listed (nor a subclass of one listed) has none."""
