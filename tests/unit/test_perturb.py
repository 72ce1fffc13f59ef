"""The fixed perturbed robustness set: parameter distribution, exact geometry, reproducibility (the cache:
test_perturbed_split.py)."""

import numpy as np
import pytest

from evaluation.perturb import PERTURB_SEED, PerturbParams, draw_params, perturb_image


@pytest.fixture(scope="module")
def many_params():
    return draw_params(3000, PERTURB_SEED)


def asymmetric_image(height=48, width=64):
    """Smooth, left-right asymmetric (bright blob on the left, ramp to the right): smooth so cv2's fixed-point
    interpolation stays within 1-2 grey levels of an exact float reference."""
    y, x = np.mgrid[0:height, 0:width].astype(np.float64)
    blob = 150 * np.exp(-(((x - 0.25 * width) / 6) ** 2 + ((y - 0.4 * height) / 8) ** 2))
    return np.clip(40 + 1.0 * x + blob, 0, 255).round().astype(np.uint8)  # (H, W)


def reference_affine(image, scale, tx, ty):
    """Independent numpy bilinear warp: dst(x) = src((x - c - t) / s + c), black outside the source."""
    height, width = image.shape
    cx, cy = (width - 1) / 2, (height - 1) / 2
    y, x = np.mgrid[0:height, 0:width].astype(np.float64)
    sx = (x - cx - tx * width) / scale + cx
    sy = (y - cy - ty * height) / scale + cy
    padded = np.pad(image.astype(np.float64), 1)  # zero ring: bilinear blends with black at the edge
    px, py = sx + 1, sy + 1
    inside = (px >= 0) & (px <= width + 1) & (py >= 0) & (py <= height + 1)
    px, py = np.clip(px, 0, width + 1 - 1e-9), np.clip(py, 0, height + 1 - 1e-9)
    x0, y0 = np.floor(px).astype(int), np.floor(py).astype(int)
    fx, fy = px - x0, py - y0
    x1, y1 = np.minimum(x0 + 1, width + 1), np.minimum(y0 + 1, height + 1)
    out = (padded[y0, x0] * (1 - fx) * (1 - fy) + padded[y0, x1] * fx * (1 - fy)
           + padded[y1, x0] * (1 - fx) * fy + padded[y1, x1] * fx * fy)  # fmt: skip
    return np.where(inside, out, 0.0)


def test_scales_are_exactly_the_two_choices(many_params):
    assert {p.scale for p in many_params} == {0.9, 1.1}
    share = np.mean([p.scale == 1.1 for p in many_params])
    assert 0.45 < share < 0.55


def test_translations_are_plus_minus_ten_percent_and_all_combinations_occur(many_params):
    assert {(p.tx, p.ty) for p in many_params} == {(-0.1, -0.1), (-0.1, 0.1), (0.1, -0.1), (0.1, 0.1)}


def test_noise_probability_and_std_range(many_params):
    flags = np.array([p.noise for p in many_params])
    assert abs(flags.mean() - 0.5) < 0.04  # binomial sd 0.009 at n=3000
    stds = np.array([p.noise_std for p in many_params if p.noise])
    assert stds.min() >= 0.1 and stds.max() <= 0.2
    assert stds.min() < 0.11 and stds.max() > 0.19  # spread over the whole range, not a constant
    assert all(p.noise_std == 0.0 for p in many_params if not p.noise)


def test_params_depend_only_on_seed_and_index(many_params):
    assert draw_params(40, PERTURB_SEED) == draw_params(50, PERTURB_SEED)[:40] == many_params[:40]
    assert draw_params(40, PERTURB_SEED) == draw_params(40, PERTURB_SEED)
    assert draw_params(40, PERTURB_SEED + 1) != draw_params(40, PERTURB_SEED)


def test_affine_matches_explicit_reference_and_is_not_flipped():
    image = asymmetric_image()
    params = PerturbParams(scale=1.1, tx=0.1, ty=-0.1, noise=False, noise_std=0.0, noise_seed=0)
    out = perturb_image(image, params)
    assert out.shape == image.shape and out.dtype == np.uint8
    expected = reference_affine(image, 1.1, 0.1, -0.1)
    assert np.abs(out.astype(float) - expected).max() <= 2
    assert np.abs(np.fliplr(out).astype(float) - expected).mean() > 20  # a mirrored result would fail


def test_content_moves_by_scale_about_centre_plus_translation():
    height, width = 48, 64
    y, x = np.mgrid[0:height, 0:width].astype(np.float64)
    blob = (200 * np.exp(-(((x - 20) / 3) ** 2 + ((y - 30) / 3) ** 2))).round().astype(np.uint8)
    out = perturb_image(blob, PerturbParams(scale=1.1, tx=0.1, ty=-0.1, noise=False, noise_std=0.0, noise_seed=0))
    weights = out.astype(np.float64)
    cx, cy = (weights * x).sum() / weights.sum(), (weights * y).sum() / weights.sum()
    assert cx == pytest.approx(1.1 * (20 - 31.5) + 31.5 + 6.4, abs=0.2)  # right by 10% of the width
    assert cy == pytest.approx(1.1 * (30 - 23.5) + 23.5 - 4.8, abs=0.2)  # up by 10% of the height


def test_noise_has_the_drawn_std_and_is_reproducible():
    image = np.full((64, 64), 128, np.uint8)
    params = PerturbParams(scale=0.9, tx=0.1, ty=0.1, noise=True, noise_std=0.15, noise_seed=7)
    clean = perturb_image(image, PerturbParams(0.9, 0.1, 0.1, False, 0.0, 7))
    noisy = perturb_image(image, params)
    assert np.array_equal(noisy, perturb_image(image, params))
    interior = clean == 128  # away from the black border, where clipping would shrink the spread
    residual = (noisy.astype(float) - clean)[interior] / 255
    assert abs(residual.std() - 0.15) < 0.01 and abs(residual.mean()) < 0.01
    other = perturb_image(image, PerturbParams(0.9, 0.1, 0.1, True, 0.15, 8))
    assert not np.array_equal(noisy, other)
