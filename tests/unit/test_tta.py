"""Test-time augmentation: views, merge rules, predictor."""

import math
from pathlib import Path

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from evaluation.tta import (
    BLACK,
    MERGES,
    VIEW_FACTORIES,
    Crop,
    HFlip,
    Identity,
    Mirrored,
    Scale,
    Shift,
    TTAPredictor,
    build_views,
    normalise_uint8,
)
from training.data.transforms import build_transform

CONFIGS = Path(__file__).resolve().parents[2] / "configs" / "tta"


@pytest.fixture
def images():
    return torch.randn(3, 1, 20, 24, generator=torch.Generator().manual_seed(0))  # (B, 1, H, W)


def test_identity_returns_input_unchanged(images):
    assert torch.equal(Identity()(images), images)


def test_hflip_mirrors_and_twice_is_identity(images):
    flipped = HFlip()(images)
    assert torch.equal(flipped[..., 0], images[..., -1])
    assert not torch.equal(flipped, images)
    assert torch.equal(HFlip()(flipped), images)


def test_neutral_scale_and_shift_are_identity(images):
    assert torch.allclose(Scale(1.0)(images), images, atol=1e-5)
    assert torch.allclose(Shift(0.0, 0.0)(images), images, atol=1e-5)


def test_shift_moves_content_and_fills_black(images):
    out = Shift(dx=2 / 24, dy=0.0)(images)  # 2 pixels right
    assert torch.allclose(out[..., 2:], images[..., :-2], atol=1e-5)
    assert torch.allclose(out[..., :2], torch.full_like(out[..., :2], BLACK), atol=1e-6)
    down = Shift(dx=0.0, dy=-0.1)(images)  # 2 pixels up
    assert torch.allclose(down[..., :-2, :], images[..., 2:, :], atol=1e-5)


def test_scale_keeps_size_zoom_out_pads_black_zoom_in_does_not(images):
    out = Scale(0.5)(images)
    assert out.shape == images.shape
    assert torch.allclose(out[..., :4, :], torch.full_like(out[..., :4, :], BLACK), atol=1e-6)
    zoomed = Scale(1.1)(images)
    assert zoomed.shape == images.shape and (zoomed - BLACK).abs().amin() > 0  # no black frame (random input)
    assert math.isclose(BLACK, -0.449 / 0.226)


def test_multicrop_expands_to_five_full_size_views(images):
    views = build_views([{"name": "multicrop", "size": 0.9}])
    assert len(views) == 5 and all(isinstance(view, Crop) for view in views)
    outs = [view(images) for view in views]
    assert all(out.shape == images.shape for out in outs)
    assert len({out.sum().item() for out in outs}) == 5  # five different crops
    assert torch.allclose(Crop(1.0, 0.0, 0.0)(images), images, atol=1e-6)  # a full-size crop is the image
    # A 4x4 ramp: its top-left quarter is [[0, 1], [4, 5]], its bottom-right [[10, 11], [14, 15]].
    ramp = torch.arange(16.0).reshape(1, 1, 4, 4)
    assert Crop(0.5, 0.0, 0.0)(ramp).mean().item() == pytest.approx(2.5)  # 2x bilinear upsampling keeps the mean
    assert Crop(0.5, 1.0, 1.0)(ramp).mean().item() == pytest.approx(12.5)
    assert len(build_views(["identity", "multicrop", "hflip", "scale", "shift"])) == 1 + 5 + 1 + 2 + 4


def test_ten_crop_boxes_on_a_six_by_six_image():
    """The 10-crop: 4 corners and the centre at half the side (3x3 boxes of a 6x6 image), then each mirrored."""
    views = build_views([{"name": "multicrop", "size": 0.5, "flip": True}])
    assert len(views) == 10
    crops, mirrors = views[:5], views[5:]
    # (top, left, height, width): the corners at 0 and 6 - 3 = 3, the centre at round(0.5 * 3) = round(1.5) = 2
    assert [crop.box(6, 6) for crop in crops] == [(0, 0, 3, 3), (0, 3, 3, 3), (3, 0, 3, 3), (3, 3, 3, 3), (2, 2, 3, 3)]
    assert all(isinstance(m, Mirrored) and m.view == crop for m, crop in zip(mirrors, crops, strict=True))
    image = torch.arange(36.0).reshape(1, 1, 6, 6)
    for crop, mirror in zip(crops, mirrors, strict=True):
        top, left, h, w = crop.box(6, 6)
        box = image[..., top : top + h, left : left + w]
        expected = torch.nn.functional.interpolate(box, size=(6, 6), mode="bilinear", align_corners=False)
        torch.testing.assert_close(crop(image), expected)  # the box's pixels, resized back to the full size
        torch.testing.assert_close(mirror(image), torch.flip(expected, dims=(-1,)))
    # the top-left box holds rows 0-2, columns 0-2 of the ramp: mean (0 + 1 + 2 + 6 + ... + 14) / 9 = 7
    assert crops[0](image).mean().item() == pytest.approx(7.0)
    assert mirrors[3](image).mean().item() == pytest.approx(28.0)  # bottom-right box: rows 3-5, columns 3-5


def test_registries_and_unknown_names():
    assert set(VIEW_FACTORIES) == {"identity", "hflip", "scale", "shift", "rotate", "multicrop"}
    assert set(MERGES) == {"mean", "max", "geometric_mean", "logit_mean"}
    with pytest.raises(KeyError, match="unknown TTA view"):
        build_views(["vflip"])
    with pytest.raises(KeyError, match="unknown TTA merge"):
        TTAPredictor(["identity"], merge="median")
    with pytest.raises(TypeError, match="bad arguments"):
        build_views([{"name": "scale", "zoom": 2}])
    assert build_views([{"name": "scale", "factors": 1.2}]) == [Scale(1.2)]


def test_merge_rules_by_hand():
    def logit(p):
        return math.log(p / (1 - p))

    probs = [[0.5, 0.75, 0.25], [0.75, 0.75, 0.1]]  # 2 views, 1 image, 3 classes
    logits = torch.tensor([[[logit(p) for p in view]] for view in probs])  # (V=2, N=1, C=3)
    expected = {
        "mean": [0.625, 0.75, 0.175],
        "max": [0.75, 0.75, 0.25],
        "geometric_mean": [math.sqrt(0.375), 0.75, math.sqrt(0.025)],
        # mean logits: ln3/2, ln3, (-ln3 - ln9)/2 = -ln27/2 -> sigmoid
        "logit_mean": [math.sqrt(3) / (1 + math.sqrt(3)), 0.75, 1 / (1 + math.sqrt(27))],
    }
    for name, values in expected.items():
        merged = TTAPredictor(["identity"], merge=name).merge(logits)
        assert merged.shape == (1, 3) and merged.dtype == np.float32
        np.testing.assert_allclose(merged[0], values, rtol=1e-6, err_msg=name)


class Symmetric(torch.nn.Module):
    """Exactly hflip-invariant: sees ``x + flip(x)``, which is the same tensor for ``x`` and ``flip(x)``."""

    def __init__(self, classes=4):
        super().__init__()
        torch.manual_seed(0)
        self.conv = torch.nn.Conv2d(1, 8, 3, padding=1)
        self.head = torch.nn.Linear(8, classes)

    def forward(self, x):
        x = x + torch.flip(x, dims=(-1,))
        return self.head(torch.relu(self.conv(x)).mean(dim=(-2, -1)))


@pytest.mark.parametrize("merge", sorted(MERGES))
def test_hflip_invariant_model_gives_identical_probabilities(images, merge):
    model = Symmetric()
    plain = TTAPredictor(["identity"], merge).predict(model, images, "cpu")
    tta = TTAPredictor(["identity", "hflip"], merge).predict(model, images, "cpu")
    np.testing.assert_allclose(tta, plain, rtol=1e-6, atol=1e-7)


class MeanModel(torch.nn.Module):
    """Logits that identify each input: its mean, twice its mean, minus its mean; records the mode it ran in."""

    def __init__(self):
        super().__init__()
        self.scale = torch.nn.Parameter(torch.tensor([1.0, 2.0, -1.0]))
        self.modes = []

    def forward(self, x):
        self.modes.append(self.training)
        return x.mean(dim=(1, 2, 3))[:, None] * self.scale  # (B, 3)


def test_predictor_shape_and_order_across_batches():
    data = torch.randn(10, 1, 8, 8, generator=torch.Generator().manual_seed(1))
    loader = [{"image": data[i : i + 4], "index": torch.arange(i, min(i + 4, 10))} for i in range(0, 10, 4)]
    model = MeanModel()
    model.train()
    predictor = TTAPredictor(["identity", "hflip", {"name": "shift", "offsets": [[0.25, 0.0]]}], "logit_mean")
    probs = predictor.predict(model, loader, "cpu")
    assert probs.shape == (10, 3) and probs.dtype == np.float32
    direct = torch.sigmoid(MeanModel()(data)).detach().numpy()
    np.testing.assert_allclose(probs[:, :2], direct[:, :2], atol=0.1)  # same row order; shift changes the mean
    logits = predictor.predict_logits(model, loader, "cpu")
    assert logits.shape == (3, 10, 3)
    np.testing.assert_allclose(logits[0], MeanModel()(data).detach().numpy(), rtol=1e-6)  # identity view exact
    np.testing.assert_allclose(logits[1], logits[0], rtol=1e-5)  # hflip keeps a mean
    assert model.training and not any(model.modes)  # ran in eval mode, mode restored after
    # The array path (batch_size 3 -> 4 batches) gives the same rows as the loader path.
    np.testing.assert_allclose(TTAPredictor(["identity"], batch_size=3).predict(model, data), direct, rtol=1e-6)


def test_uint8_arrays_are_normalised_like_the_eval_transform():
    raw = np.random.default_rng(0).integers(0, 256, (5, 6, 7), dtype=np.uint8)
    reference = torch.stack([build_transform(None)(image=image)["image"] for image in raw])  # (N, 1, H, W)
    torch.testing.assert_close(normalise_uint8(raw), reference, rtol=1e-6, atol=1e-6)
    model = MeanModel()
    np.testing.assert_allclose(
        TTAPredictor(["identity"], batch_size=2).predict(model, raw),
        torch.sigmoid(model(reference)).detach().numpy(), rtol=1e-5,
    )  # fmt: skip


def test_config_files_build_predictors():
    default = OmegaConf.load(CONFIGS / "default.yaml")
    assert default.enabled is True and default.name == "default"
    predictor = TTAPredictor.from_config(default)
    assert predictor.views == [Identity(), HFlip()] and predictor.merge_name == "mean"
    multicrop = TTAPredictor.from_config(OmegaConf.load(CONFIGS / "multicrop.yaml"))
    assert len(multicrop.views) == 6 and multicrop.views[0] == Identity()
    assert multicrop.describe()[1] == "Crop(size=0.9, ay=0.0, ax=0.0)"
    tencrop = TTAPredictor.from_config(OmegaConf.load(CONFIGS / "tencrop.yaml"))
    assert len(tencrop.views) == 10 and tencrop.views[5] == Mirrored(Crop(0.875, 0.0, 0.0))
