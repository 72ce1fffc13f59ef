"""Heatmaps for grounding: Grad-CAM of platform classifiers on a toy network whose answer is known, patch-text
similarity of open_clip ViTs against a manual computation, the feature-layer probe on real timm backbones, and the
two floors."""

from __future__ import annotations

from collections.abc import Sequence

import cv2
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from apps.benchmarks.framework import heatmaps as hm
from apps.benchmarks.framework.clip_models import ClipEncoder
from apps.benchmarks.framework.encoders import Encoded, Encoder, Target
from apps.benchmarks.framework.extra import INSTALL
from apps.benchmarks.framework.platform_models import PlatformRunEncoder, map_outputs
from tests.benchmark_data import write_tiny_clip
from training.data.transforms import GRAY_MEAN, GRAY_STD
from training.models.backbone import create_backbone

SIZE = 32
BLOB = (slice(3, 7), slice(9, 13))  # rows 3-6, columns 9-12: inside the top-left quadrant, off its diagonal


class QuadrantBackbone(nn.Module):
    """``(B, 1, 32, 32) -> (B, 2)`` pooled features through a ``(B, 2, 16, 16)`` map (``features``), pooling only
    the map's top-left 8x8: each map pixel sees exactly one 2x2 image block, so the features (and the logits)
    depend on the image's top-left quadrant alone. Channel 0 answers brightness, channel 1 darkness."""

    def __init__(self):
        super().__init__()
        conv = nn.Conv2d(1, 2, kernel_size=2, stride=2)
        with torch.no_grad():
            conv.weight[0].fill_(0.25)  # mean of the 2x2 block
            conv.weight[1].fill_(-0.25)
            conv.bias.copy_(torch.tensor([0.0, 1.0]))  # 1 - mean
        self.features = nn.Sequential(conv, nn.ReLU())
        quadrant = torch.zeros(1, 1, 16, 16)
        quadrant[..., :8, :8] = 1.0
        self.register_buffer("quadrant", quadrant)
        self.num_features = 2

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (self.features(x) * self.quadrant).mean(dim=(2, 3))


class QuadrantNetwork(nn.Module):
    """Shaped like the platform's network: ``.backbone`` (pooled features) and a linear ``.head``."""

    LABELS = ("Bright", "Dark", "Contrast")

    def __init__(self):
        super().__init__()
        self.backbone = QuadrantBackbone()
        self.head = nn.Linear(2, 3)
        with torch.no_grad():
            self.head.weight.copy_(torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, -1.0]]))
            self.head.bias.zero_()


class ToyRunEncoder(PlatformRunEncoder):
    """A PlatformRunEncoder built around a given network instead of a finished run (what the heatmapper reads:
    ``model``, ``labels``, ``indices``, ``image_size``)."""

    def __init__(self, model: nn.Module, labels: Sequence[str], targets: Sequence[Target], image_size: int = SIZE):
        Encoder.__init__(self, "toy", targets)
        self.model, self.labels, self.image_size = model, list(labels), image_size
        self.indices = {t.label: map_outputs(self.labels, t) for t in self.targets}


TARGETS = (
    Target("Bright", "bright", "dull"),
    Target("Both", "both", "neither", outputs=("Bright", "Dark")),
    Target("Absent", "absent", "present"),
    Target("BrightContrast", "bc", "none", outputs=("bright", "CONTRAST")),
)


def blob_image(n: int = 1) -> np.ndarray:
    images = np.zeros((n, SIZE, SIZE), dtype=np.uint8)
    images[:, BLOB[0], BLOB[1]] = 255
    return images


def manual_gradcam(network: QuadrantNetwork, images: np.ndarray, columns: list[int]) -> np.ndarray:
    """Grad-CAM by hand: channel weights = spatial mean of d(sum of the columns' logits)/d(map), ReLU of the
    weighted sum, min-max per image, bilinear (half-pixel) upsampling, min-max again."""
    x = ((torch.from_numpy(images).float() / 255.0 - GRAY_MEAN) / GRAY_STD).unsqueeze(1)
    fmap = network.backbone.features(x)
    logits = network.head((fmap * network.backbone.quadrant).mean(dim=(2, 3)))
    (grads,) = torch.autograd.grad(logits[:, columns].sum(), fmap)
    cam = torch.relu((grads.mean(dim=(2, 3), keepdim=True) * fmap).sum(dim=1)).detach().numpy()
    out = []
    for c in cam:
        c = c - c.min()
        c = c / (1e-7 + c.max())
        c = cv2.resize(c.astype(np.float32), (SIZE, SIZE), interpolation=cv2.INTER_LINEAR)
        c = c - c.min()  # and again at full size, as pytorch-grad-cam does (upsampling lowers a one-pixel peak)
        out.append(c / (1e-7 + c.max()))
    return np.stack(out)


@pytest.fixture
def toy():
    pytest.importorskip("pytorch_grad_cam", reason=INSTALL)
    torch.manual_seed(0)
    network = QuadrantNetwork()
    return network, ToyRunEncoder(network, QuadrantNetwork.LABELS, TARGETS)


def test_gradcam_layer_is_the_last_spatial_map(toy):
    network, encoder = toy
    layer = hm.gradcam_layer(network.backbone, SIZE)
    assert (layer.name, layer.grid, layer.usable) == ("features", (16, 16), True)
    assert layer.module is network.backbone.features
    assert "Grad-CAM on backbone.features (a 16x16 map)" in hm.heatmap_note(encoder)


def test_gradcam_points_at_the_quadrant_the_logit_reads(toy):
    network, encoder = toy
    maps = hm.heatmaps(encoder, blob_image(2), ["Bright"])
    assert maps.shape == (2, 1, SIZE, SIZE) and maps.dtype == np.float32
    cam = maps[0, 0]
    assert np.isfinite(cam).all() and cam.min() >= 0
    half = SIZE // 2
    assert cam[:half, :half].sum() / cam.sum() > 0.95  # the mass is in the top-left quadrant
    row, col = np.unravel_index(np.argmax(cam), cam.shape)
    assert BLOB[0].start <= row < BLOB[0].stop and BLOB[1].start <= col < BLOB[1].stop  # at the blob, not transposed


def test_gradcam_explains_the_sum_of_the_mapped_logits(toy):
    network, encoder = toy
    images = blob_image(1)
    images[0, 20:, 20:] = 200  # something outside the read quadrant, so maps of different targets differ
    maps = hm.heatmaps(encoder, images, ["Both", "Bright", "BrightContrast"])
    for j, columns in enumerate(([0, 1], [0], [0, 2])):
        np.testing.assert_allclose(maps[:, j], manual_gradcam(network, images, columns), atol=1e-5)
    # Not one of the outputs alone, nor their maximum: a summed target has its own map.
    assert not np.allclose(maps[:, 0], manual_gradcam(network, images, [0]), atol=1e-2)
    assert not np.allclose(maps[:, 0], manual_gradcam(network, images, [1]), atol=1e-2)
    assert not np.allclose(maps[:, 2], maps[:, 1], atol=1e-2)


def test_gradcam_unmapped_target_is_nan_and_order_follows_labels(toy):
    _, encoder = toy
    maps = hm.heatmaps(encoder, blob_image(1), ["Absent", "Bright"])
    assert np.isnan(maps[0, 0]).all() and np.isfinite(maps[0, 1]).all()
    only_absent = hm.heatmaps(encoder, blob_image(1), ["Absent"])
    assert np.isnan(only_absent).all()
    with pytest.raises(KeyError, match="not a target"):
        hm.heatmaps(encoder, blob_image(1), ["Pneumonia"])


def test_gradcam_leaves_the_model_as_it_found_it(toy):
    network, encoder = toy
    network.train()
    network.backbone.features.eval()  # mixed modes (a frozen backbone) come back mixed
    network.head.weight.requires_grad_(False)
    network.head.bias.grad = torch.full((3,), 7.0)  # a caller's gradient survives
    modes = {name: m.training for name, m in network.named_modules()}
    with torch.inference_mode():  # callers may be inside inference mode (encode is)
        maps = hm.heatmaps(encoder, blob_image(1), ["Both"])
    assert np.isfinite(maps).all()
    assert {name: m.training for name, m in network.named_modules()} == modes
    assert not network.head.weight.requires_grad and network.head.bias.requires_grad
    assert network.head.weight.grad is None and network.backbone.features[0].weight.grad is None
    torch.testing.assert_close(network.head.bias.grad, torch.full((3,), 7.0))
    assert not network.backbone.features._forward_hooks  # Grad-CAM's hooks are gone


@pytest.mark.parametrize(
    ("name", "layer"), [("resnet18", "layer4"), ("convnext_atto", "stages"), ("efficientnet_b0", "bn2")]
)
def test_gradcam_layer_of_timm_backbones(name, layer):
    backbone = create_backbone(name)
    backbone.train()
    found = hm.gradcam_layer(backbone, 64)
    assert (found.name, found.grid, found.usable) == (layer, (2, 2), True)
    assert backbone.training  # the probe runs in eval mode and gives the mode back


def test_gradcam_on_a_timm_backbone_end_to_end():
    pytest.importorskip("pytorch_grad_cam", reason=INSTALL)
    torch.manual_seed(0)
    network = nn.Module()
    network.backbone = create_backbone("resnet18")
    network.head = nn.Linear(network.backbone.num_features, 2)
    encoder = ToyRunEncoder(network, ["Effusion", "Edema"], [Target("Effusion", "e", "n")], image_size=64)
    images = np.random.default_rng(0).integers(0, 256, (2, 64, 64), dtype=np.uint8)
    maps = hm.heatmaps(encoder, images, ["Effusion"])
    assert maps.shape == (2, 1, 64, 64) and np.isfinite(maps).all() and maps.min() >= 0 and maps.max() <= 1 + 1e-6
    assert all(p.grad is None for p in network.parameters())


def test_transformer_backbone_has_no_gradcam():
    network = nn.Module()
    network.backbone = create_backbone("vit_tiny_patch16_224", img_size=32)
    network.head = nn.Linear(network.backbone.num_features, 1)
    encoder = ToyRunEncoder(network, ["Effusion"], [Target("Effusion", "e", "n")])
    layer = hm.gradcam_layer(network.backbone, SIZE)
    assert layer.name == "patch_embed.proj" and not layer.usable
    assert hm.heatmaps(encoder, blob_image(1), ["Effusion"]) is None
    assert "transformer" in hm.heatmap_note(encoder)


# --- open_clip patch-text similarity -----------------------------------------------------------------------------

CLIP_TARGETS = (
    Target("Effusion", "a chest x-ray with a pleural effusion", "a normal chest x-ray"),
    Target("Edema", "a chest x-ray with pulmonary edema", "a normal chest x-ray"),
)


@pytest.fixture(scope="module")
def tiny_clip(tmp_path_factory):
    return ClipEncoder(write_tiny_clip(tmp_path_factory.mktemp("clip") / "tiny"), CLIP_TARGETS, seed=3)


def manual_patch_similarity(encoder: ClipEncoder, image: np.ndarray, prompt: str) -> np.ndarray:
    """open_clip's own token output (``output_tokens=True``: final-norm'd patch tokens), projected and normalised,
    against the prompt's unit text embedding; a 4x4 grid upsampled to 32x32."""
    model = encoder.model
    x = torch.from_numpy(image).float().div(255.0)[None, None].expand(-1, 3, -1, -1)
    x = (x - encoder.mean) / encoder.std
    model.visual.output_tokens = True
    try:
        with torch.no_grad():
            pooled, tokens = model.visual(x)
            text = model.encode_text(encoder.tokenizer([prompt]), normalize=True)[0]
    finally:
        model.visual.output_tokens = False
    with torch.no_grad():  # the tokens are the pooled embedding's siblings: the same final norm, the same projection
        torch.testing.assert_close(F.normalize(pooled, dim=-1), model.encode_image(x, normalize=True))
        similarity = F.normalize(tokens @ model.visual.proj, dim=-1) @ text  # (1, 16)
    grid = similarity.reshape(1, 1, 4, 4)
    return F.interpolate(grid, size=(SIZE, SIZE), mode="bilinear", align_corners=False)[0, 0].numpy()


def test_clip_patch_similarity_matches_a_manual_computation(tiny_clip):
    images = np.random.default_rng(1).integers(0, 256, (3, SIZE, SIZE), dtype=np.uint8)
    maps = hm.heatmaps(tiny_clip, images, ["Edema", "Effusion"])
    assert maps.shape == (3, 2, SIZE, SIZE) and maps.dtype == np.float32
    assert np.isfinite(maps).all() and np.abs(maps).max() <= 1 + 1e-5  # cosines
    for j, target in enumerate((CLIP_TARGETS[1], CLIP_TARGETS[0])):  # in the order asked, not the targets' order
        expected = manual_patch_similarity(tiny_clip, images[1], target.positive_prompt)
        np.testing.assert_allclose(maps[1, j], expected, atol=1e-5)
    assert not np.allclose(maps[:, 0], maps[:, 1], atol=1e-4)  # different prompts, different maps
    assert not np.allclose(maps[0], maps[1], atol=1e-4)  # different images, different maps
    assert maps[0, 0].std() > 0
    assert hm.heatmap_note(tiny_clip).startswith("patch-text similarity of the 4x4 ViT patch grid")


def test_clip_maps_do_not_depend_on_the_batch(tiny_clip):
    images = np.random.default_rng(2).integers(0, 256, (3, SIZE, SIZE), dtype=np.uint8)
    together = hm.heatmaps(tiny_clip, images, ["Effusion"])
    alone = hm.heatmaps(tiny_clip, images[2:], ["Effusion"])
    np.testing.assert_allclose(together[2:], alone, atol=1e-5)


# --- dispatch and floors -----------------------------------------------------------------------------------------


class NoMapEncoder(Encoder):
    image_size = SIZE

    @property
    def identity(self) -> str:
        return "none"

    def encode(self, images: np.ndarray) -> Encoded:
        return Encoded(np.zeros((len(images), 1), dtype=np.float32))


def test_dispatch_by_class():
    assert (
        hm.heatmapper(ToyRunEncoder(QuadrantNetwork(), QuadrantNetwork.LABELS, TARGETS))
        is hm.HEATMAPPERS[PlatformRunEncoder]
    )
    encoder = NoMapEncoder("none", TARGETS)
    assert hm.heatmaps(encoder, blob_image(1), ["Bright"]) is None
    assert hm.heatmap_note(encoder) == "no heatmaps for NoMapEncoder models"
    with pytest.raises(ValueError, match="square"):
        hm.heatmaps(encoder, np.zeros((1, 4, 5), dtype=np.uint8), ["Bright"])


@pytest.mark.parametrize("size", [7, 8, 33])
def test_centre_prior_peaks_at_the_centre_and_is_symmetric(size):
    prior = hm.centre_prior(size)
    assert prior.shape == (size, size) and prior.dtype == np.float32
    peaks = np.argwhere(prior == prior.max())
    assert np.all(np.abs(peaks + 0.5 - size / 2) <= 0.5)  # the central pixel(s)
    np.testing.assert_array_equal(prior, prior[::-1])
    np.testing.assert_array_equal(prior, prior[:, ::-1])
    np.testing.assert_array_equal(prior, prior.T)
    # sigma = size / 4: one sigma from the centre (along a row through it) the value is exp(-1/2) of the peak
    if size % 2:
        centre = size // 2
        profile = prior[centre]
        distances = np.arange(size) - centre
        np.testing.assert_allclose(profile, np.exp(-0.5 * (distances / (size / 4)) ** 2), rtol=1e-6)
    assert prior.max() <= 1 and prior.min() > 0


def test_random_heatmaps_are_seeded():
    first = hm.random_heatmaps(3, 2, 16, seed=5)
    assert first.shape == (3, 2, 16, 16) and first.dtype == np.float32
    assert first.min() >= 0 and first.max() < 1
    np.testing.assert_array_equal(first, hm.random_heatmaps(3, 2, 16, seed=5))
    np.random.seed(123)  # the global generator plays no part
    np.testing.assert_array_equal(first, hm.random_heatmaps(3, 2, 16, seed=5))
    assert not np.allclose(first, hm.random_heatmaps(3, 2, 16, seed=6))
    assert not np.allclose(first[0, 0], first[1, 0])  # a fresh map per image and finding
    assert not np.allclose(first[0, 0], first[0, 1])
