"""Pointing game (TorchRay's convention: first maximum, 15-px tolerance in the boxes' frame; the platform's rules for
flat maps) and signed CNR on hand-made heatmaps and boxes whose answers are known, and boxes moved between frames."""

from __future__ import annotations

import numpy as np
import pytest

from apps.benchmarks.framework.grounding import (
    POINTING_TOLERANCE,
    box_mask,
    cnr,
    grounding_scores,
    hit_region,
    overlay_figure,
    pointing_game,
)
from apps.benchmarks.framework.protocol import Box


def test_a_box_in_the_1024_frame_lands_at_half_size_on_a_512_image():
    box = Box("Nodule", x=100, y=200, w=50, h=20, frame_width=1024, frame_height=1024)
    mask = box_mask([box], 512)
    rows, cols = np.flatnonzero(mask.any(axis=1)), np.flatnonzero(mask.any(axis=0))
    assert (rows[0], rows[-1], cols[0], cols[-1]) == (100, 109, 50, 74)  # y 100..110, x 50..75 at half size
    assert mask.sum() == 10 * 25


def test_a_pixel_counts_when_the_box_covers_its_centre():
    mask = box_mask([Box("A", x=1.4, y=0, w=1.2, h=1, frame_width=4, frame_height=4)], 4)
    assert mask[0].tolist() == [False, True, True, False]  # covers centres 1.5 and 2.5, not 0.5 or 3.5


def test_pointing_game_hits_misses_and_a_flat_map():
    mask = np.zeros((4, 4), bool)
    mask[:2, :2] = True
    heat = np.zeros((4, 4))
    heat[1, 1] = 5.0
    assert pointing_game(heat, mask) == 1.0
    heat[3, 3] = 6.0
    assert pointing_game(heat, mask) == 0.0
    assert pointing_game(np.ones((4, 4)), mask) == 0.25  # share: the hit rate of a point drawn at random
    assert pointing_game(np.ones((4, 4)), mask, "miss") == 0.0  # miss: a map that points nowhere earns nothing
    assert pointing_game(np.ones((4, 4)), np.ones((4, 4), bool), "miss") == 0.0  # even on a box that fills the film
    flat_with_a_hole = np.ones((4, 4))
    flat_with_a_hole[3, 3] = np.nan
    assert pointing_game(flat_with_a_hole, mask) == pytest.approx(4 / 15)  # a non-finite pixel is not a candidate
    assert pointing_game(flat_with_a_hole, mask, "miss") == 0.0
    assert pointing_game(heat, mask, "miss") == pointing_game(heat, mask) == 0.0  # a map with a peak: rule unused
    with pytest.raises(ValueError, match="flat_maps must be one of miss, share"):
        pointing_game(heat, mask, "half")
    assert np.isnan(pointing_game(heat, np.zeros((4, 4), bool)))
    assert np.isnan(pointing_game(np.full((4, 4), np.nan), mask))


def test_tied_maxima_point_at_the_first_in_row_major_order_as_torch_argmax_does():
    torch = pytest.importorskip("torch")
    mask = np.zeros((4, 4), bool)
    mask[2:, 2:] = True  # the box is the bottom-right quarter
    heat = np.zeros((4, 4))
    heat[0, 3] = heat[3, 3] = 1.0  # tied: (0, 3) comes first row by row, outside the box; (3, 3) inside
    assert pointing_game(heat, mask) == 0.0  # not 1 (any maximum in the box) nor 0.5 (the share of the maxima)
    assert int(torch.argmax(torch.as_tensor(heat).flatten())) == 3  # TorchRay's point: flat index 3 = (0, 3)
    heat[0, 3] = 0.0
    heat[2, 2] = 1.0  # tied again, now both in the box: (2, 2) first
    assert pointing_game(heat, mask) == 1.0


def test_the_tolerance_is_15_px_of_the_boxes_frame_and_strict():
    box = Box("A", x=20, y=20, w=10, h=10, frame_width=64, frame_height=64)  # heatmap in the box's frame: 1:1
    region = hit_region([box], 64)
    assert POINTING_TOLERANCE == 15.0
    heat = np.zeros((64, 64))
    heat[25, 29 + 14] = 1.0  # 14 px right of the box's last column: within TorchRay's 15 px
    assert pointing_game(heat, region) == 1.0 and pointing_game(heat, box_mask([box], 64)) == 0.0
    heat[:] = 0.0
    heat[25, 29 + 15] = 1.0  # 15 px: TorchRay's test is distance < 15, a miss
    assert pointing_game(heat, region) == 0.0
    heat[:] = 0.0
    heat[29 + 10, 29 + 11] = 1.0  # diagonal from the corner pixel: sqrt(10^2 + 11^2) = 14.87 px, a hit
    assert pointing_game(heat, region) == 1.0
    heat[:] = 0.0
    heat[29 + 11, 29 + 11] = 1.0  # sqrt(2) * 11 = 15.56 px, a miss
    assert pointing_game(heat, region) == 0.0


def test_the_tolerance_shrinks_with_the_heatmap_a_1024_frame_box_on_a_128_px_map():
    # a 128-px heatmap pixel spans 8 px of the 1024 frame: 1 pixel off is 8 px (hit), 2 pixels 16 px (miss),
    # 1 pixel diagonally 11.3 px (hit)
    box = Box("A", x=512, y=512, w=64, h=64, frame_width=1024, frame_height=1024)  # heatmap pixels 64..71
    region = hit_region([box], 128)
    assert region[64:72, 63].all() and not region[64:72, 62].any()
    assert region[63, 63] and not region[62, 63] and not region[63, 62]  # 2 rows above the corner row: 16 px
    assert region.sum() == 10 * 10  # the 8 x 8 box grown by one pixel on every side, corners included (11.3 px)
    assert region[63, 72] and region[72, 72] and not region[73, 73]
    # a frame twice as wide: along x a heatmap pixel is 16 px of it, so one pixel off is already a miss
    wide = Box("A", x=1024, y=512, w=128, h=64, frame_width=2048, frame_height=1024)
    wide_region = hit_region([wide], 128)
    assert wide_region[64:72, 64:72].all() and not wide_region[64:72, 63].any() and wide_region[63, 64:72].all()


def test_a_zero_tolerance_is_the_box_itself_and_a_negative_one_is_refused():
    box = Box("A", x=1, y=1, w=2, h=2, frame_width=4, frame_height=4)
    assert (hit_region([box], 4, tolerance=0) == box_mask([box], 4)).all()
    with pytest.raises(ValueError, match="tolerance"):
        hit_region([box], 4, tolerance=-1)


def test_a_flat_map_scores_the_share_of_the_grown_box_or_nothing():
    box = Box("A", x=20, y=20, w=10, h=10, frame_width=64, frame_height=64)
    region = hit_region([box], 64)
    assert pointing_game(np.zeros((64, 64)), region) == pytest.approx(region.mean())
    assert region.mean() > box_mask([box], 64).mean()
    flat = np.zeros((2, 1, 64, 64))
    flat[1, 0, 30, 30] = 1.0  # the second map peaks inside the box
    scores = grounding_scores(flat, [[box], [box]], ["A"], flat_maps="miss")
    assert scores[:, 0, 0].tolist() == [0.0, 1.0]
    assert grounding_scores(flat, [[box], [box]], ["A"])[0, 0, 0] == pytest.approx(region.mean())


def test_cnr_by_hand_signed_and_invariant_to_a_positive_affine_rescaling():
    mask = np.zeros((4, 4), bool)
    mask[:2, :2] = True
    heat = np.zeros((4, 4))
    heat[mask] = [1, 2, 3, 4]  # mean 2.5, variance 1.25
    outside = np.array([0] * 6 + [1] * 6, float)  # mean 0.5, variance 0.25
    heat[~mask] = outside
    expected = (2.5 - 0.5) / np.sqrt(1.25 + 0.25)  # 1.633
    assert cnr(heat, mask) == pytest.approx(expected)
    assert cnr(3 * heat + 7, mask) == pytest.approx(expected)
    # the inverted map is brighter around the box than on it: minus the same ratio, not the same score
    assert cnr(-heat, mask) == pytest.approx(-expected) and cnr(-heat, mask) < 0
    assert cnr(heat.max() - heat, mask) == pytest.approx(-expected)
    step = np.where(mask, 1.0, 0.0)
    assert np.isnan(cnr(step, mask))  # contrast without any noise: an infinite ratio, left out
    assert cnr(np.full((4, 4), 0.3), mask) == 0.0  # a flat map shows no contrast at all
    assert np.isnan(cnr(heat, np.ones((4, 4), bool)))


def test_grounding_scores_only_where_the_image_has_a_box_of_the_finding():
    boxes = [(Box("A", 0, 0, 2, 2, 4, 4),), (Box("B", 2, 2, 2, 2, 4, 4),)]
    heat = np.zeros((2, 2, 4, 4))
    heat[0, 0, 0, 0] = 1  # image 0, finding A: peak in its box
    heat[1, 1, 0, 0] = 1  # image 1, finding B: peak outside its box
    scores = grounding_scores(heat, boxes, ["A", "B"], tolerance=0)
    assert scores[0, 0, 0] == 1.0 and scores[1, 1, 0] == 0.0
    assert scores[1, 1, 1] < 0  # B's map is bright away from B's box: a negative CNR
    near = grounding_scores(heat, boxes, ["A", "B"], tolerance=2)  # (0, 0) is 2.83 px from B's corner (2, 2)
    assert near[1, 1, 0] == 0.0 and grounding_scores(heat, boxes, ["A", "B"], tolerance=3)[1, 1, 0] == 1.0
    assert np.isnan(scores[0, 1]).all() and np.isnan(scores[1, 0]).all()


def test_overlay_figure_draws_one_panel_per_example():
    fig = overlay_figure([np.zeros((8, 8), np.uint8)] * 2, [np.random.default_rng(0).random((8, 8))] * 2,
                         [(Box("A", 0, 0, 4, 4, 8, 8),), ()], ["a", "b"])  # fmt: skip
    assert len(fig.axes) == 2 and [ax.get_title() for ax in fig.axes] == ["a", "b"]
    assert len(fig.axes[0].patches) == 1 and len(fig.axes[1].patches) == 0


def test_the_protocol_takes_its_tolerance_from_the_config_and_refuses_a_negative_one(tmp_path):
    from apps.benchmarks.framework.catalog import CONFIG_DIR, load_protocol

    assert load_protocol("nih-grounding").tolerance == POINTING_TOLERANCE
    text = (CONFIG_DIR / "nih-grounding.yaml").read_text()
    assert "\ntolerance: 15 " in text
    (tmp_path / "nih-grounding.yaml").write_text(text.replace("\ntolerance: 15 ", "\ntolerance: -3 "))
    with pytest.raises(Exception, match=r"tolerance .* got -3 \(configs/benchmark/nih-grounding.yaml\)"):
        load_protocol("nih-grounding", tmp_path)
