"""The rotation TTA view (evaluation.tta.Rotate) and the flip + small-rotation choice (configs/tta/flip_rotate.yaml)."""

from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from evaluation.tta import BLACK, VIEW_FACTORIES, Rotate, build_views


def test_a_quarter_turn_of_a_square_image_is_torch_rot90():
    """Reference: rot90 with dims (H, W) turns counter-clockwise as displayed, as a positive angle does."""
    images = torch.randn(2, 1, 6, 6)
    torch.testing.assert_close(Rotate(90)(images), torch.rot90(images, 1, dims=(-2, -1)), atol=1e-4, rtol=0)
    torch.testing.assert_close(Rotate(-90)(images), torch.rot90(images, -1, dims=(-2, -1)), atol=1e-4, rtol=0)


def test_a_quarter_turn_on_a_non_square_image_moves_a_pixel_by_hand():
    """7 x 5 image, centre pixel (3, 2). A pixel 2 left of it (3, 0) turned 90 degrees counter-clockwise lands 2 below
    the centre, (5, 2); what comes from outside the image is black."""
    images = torch.full((1, 1, 7, 5), -1.0)
    images[0, 0, 3, 0] = 5.0
    out = Rotate(90)(images)[0, 0]
    assert out[5, 2].item() == pytest.approx(5.0, abs=1e-4)
    assert out[0, 0].item() == pytest.approx(BLACK, abs=1e-4)  # the corner's source lies outside the 5-wide image


def test_zero_degrees_is_identity_and_the_view_keeps_the_size():
    images = torch.randn(3, 1, 8, 10)
    torch.testing.assert_close(Rotate(0)(images), images, atol=1e-5, rtol=0)
    assert Rotate(5)(images).shape == images.shape


def test_the_flip_rotate_choice_expands_to_four_views():
    cfg = OmegaConf.load(Path(__file__).resolve().parents[2] / "configs" / "tta" / "flip_rotate.yaml")
    views = build_views(cfg.views)
    assert "rotate" in VIEW_FACTORIES
    assert [type(v).__name__ for v in views] == ["Identity", "HFlip", "Rotate", "Rotate"]
    assert [v.degrees for v in views[2:]] == [-5.0, 5.0]
