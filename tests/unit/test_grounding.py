"""Pointing game and CNR on hand-made heatmaps and boxes whose answers are known, and boxes moved between frames."""

from __future__ import annotations

import numpy as np
import pytest

from apps.benchmarks.framework.grounding import box_mask, cnr, grounding_scores, overlay_figure, pointing_game
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
    assert pointing_game(np.ones((4, 4)), mask) == 0.25  # a constant map scores the box's area share
    assert np.isnan(pointing_game(heat, np.zeros((4, 4), bool)))


def test_cnr_by_hand_and_invariant_to_a_positive_affine_rescaling():
    mask = np.zeros((4, 4), bool)
    mask[:2, :2] = True
    heat = np.zeros((4, 4))
    heat[mask] = [1, 2, 3, 4]  # mean 2.5, variance 1.25
    outside = np.array([0] * 6 + [1] * 6, float)  # mean 0.5, variance 0.25
    heat[~mask] = outside
    expected = abs(2.5 - 0.5) / np.sqrt(1.25 + 0.25)
    assert cnr(heat, mask) == pytest.approx(expected)
    assert cnr(3 * heat + 7, mask) == pytest.approx(expected)
    step = np.where(mask, 1.0, 0.0)
    assert np.isnan(cnr(step, mask))  # contrast without any noise: an infinite ratio, left out
    assert cnr(np.full((4, 4), 0.3), mask) == 0.0  # a flat map shows no contrast at all
    assert np.isnan(cnr(heat, np.ones((4, 4), bool)))


def test_grounding_scores_only_where_the_image_has_a_box_of_the_finding():
    boxes = [(Box("A", 0, 0, 2, 2, 4, 4),), (Box("B", 2, 2, 2, 2, 4, 4),)]
    heat = np.zeros((2, 2, 4, 4))
    heat[0, 0, 0, 0] = 1  # image 0, finding A: peak in its box
    heat[1, 1, 0, 0] = 1  # image 1, finding B: peak outside its box
    scores = grounding_scores(heat, boxes, ["A", "B"])
    assert scores[0, 0, 0] == 1.0 and scores[1, 1, 0] == 0.0
    assert np.isnan(scores[0, 1]).all() and np.isnan(scores[1, 0]).all()


def test_overlay_figure_draws_one_panel_per_example():
    fig = overlay_figure([np.zeros((8, 8), np.uint8)] * 2, [np.random.default_rng(0).random((8, 8))] * 2,
                         [(Box("A", 0, 0, 4, 4, 8, 8),), ()], ["a", "b"])  # fmt: skip
    assert len(fig.axes) == 2 and [ax.get_title() for ax in fig.axes] == ["a", "b"]
    assert len(fig.axes[0].patches) == 1 and len(fig.axes[1].patches) == 0
