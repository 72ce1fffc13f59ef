"""What a benchmark computes from a model is computed once: a rerun (of ``make benchmark`` or ``make card``) reads
grounding heatmap scores and CheXTemporal's fitted heads back from the cache instead of running Grad-CAM or the
fits again; and a finding the model has no map for is handled as n/a, never as a numpy warning about an all-NaN
slice."""

from __future__ import annotations

import warnings

import numpy as np
import pandas as pd
import pytest

import apps.benchmarks.chextemporal as chextemporal
from apps.benchmarks.framework import grounding
from apps.benchmarks.framework import heatmaps as hm
from apps.benchmarks.framework.catalog import load_protocol
from apps.benchmarks.framework.encoders import Encoded, Encoder, Target
from apps.benchmarks.framework.grounding import overlay_figure, score_heatmaps
from apps.benchmarks.framework.runner import draw_subsets, load_model, run_benchmark
from tests.benchmark_data import write_tiny_clip
from tests.temporal_data import write_bbox_folder, write_followup_folder


def test_a_rerun_reads_the_heatmap_scores_back_instead_of_computing_them(tmp_path, monkeypatch):
    write_bbox_folder(tmp_path / "nih", n=12, stored=64)
    protocol = load_protocol("nih-grounding")
    draw = draw_subsets(protocol, tmp_path / "nih")
    encoder = load_model(protocol, write_tiny_clip(tmp_path / "clip"), "sqlite:///unused.db")

    def run(**changes):
        for name, value in changes.items():
            monkeypatch.setattr(protocol, name, value)
        return run_benchmark(protocol, draw, encoder, tmp_path / "nih", n_boot=20, cache_dir=tmp_path / "cache",
                             batch_size=8)  # fmt: skip

    calls = []
    real = grounding.heatmaps
    monkeypatch.setattr(grounding, "heatmaps", lambda *args: calls.append(1) or real(*args))
    first = run()
    shown = {f: [(title, boxes, heatmap.copy()) for _, heatmap, boxes, title in items]
             for f, items in protocol.shown.items()}  # fmt: skip
    computed = len(calls)
    assert computed > 0 and len(list((tmp_path / "cache").glob("heatmaps-*.npz"))) == 1
    second = run()
    assert len(calls) == computed  # no heatmap was made again
    pd.testing.assert_frame_equal(first.table, second.table)
    assert first.notes[:-1] == second.notes[:-1]  # the last says which embeddings came from the cache
    assert set(first.extras.figures) == set(second.extras.figures) and sum(map(len, shown.values())) > 0
    for finding, items in protocol.shown.items():  # the overlay examples too: same films, boxes and maps
        assert [(title, boxes) for _, _, boxes, title in items] == [(t, b) for t, b, _ in shown[finding]]
        assert all(np.array_equal(m, s[2]) for (_, m, _, _), s in zip(items, shown[finding], strict=True))
    run(tolerance=0.0)  # another pointing-game margin is another entry
    assert len(calls) > computed and len(list((tmp_path / "cache").glob("heatmaps-*.npz"))) == 2


def test_a_rerun_reads_the_progression_heads_back_instead_of_fitting_them(tmp_path, monkeypatch):
    write_followup_folder(tmp_path / "nih", patients=30)
    protocol = load_protocol("chextemporal")
    draw = draw_subsets(protocol, tmp_path / "nih")
    encoder = load_model(protocol, write_tiny_clip(tmp_path / "clip"), "sqlite:///unused.db")
    fits = []
    real = chextemporal.fit_progression_head
    monkeypatch.setattr(chextemporal, "fit_progression_head", lambda *a, **k: fits.append(1) or real(*a, **k))

    def run(cache_dir):
        return run_benchmark(protocol, draw, encoder, tmp_path / "nih", n_boot=20, cache_dir=cache_dir, batch_size=8)

    first = run(tmp_path / "cache")
    assert len(fits) == 5  # one head per fold
    second = run(tmp_path / "cache")
    assert len(fits) == 5  # read back, not fitted again
    pd.testing.assert_frame_equal(first.table, second.table)
    pd.testing.assert_frame_equal(first.scores, second.scores)
    assert [n for n in first.notes if n.startswith("head:")] == [n for n in second.notes if n.startswith("head:")]
    run(None)  # no cache: fitted again, the same answers
    assert len(fits) == 10


class HalfBlind(Encoder):
    """Maps for its first target only; NaN for the second, as Grad-CAM gives a finding without a mapped output."""

    image_size, resize = 16, "stretch"

    @property
    def identity(self) -> str:
        return "half-blind"

    def encode(self, images):
        return Encoded(np.zeros((len(images), 2), np.float32))


def make_half_blind(encoder, images, labels):
    maps = np.random.default_rng(0).random((len(images), len(labels), 16, 16), dtype=np.float32)
    maps[:, 1] = np.nan
    return maps


def test_a_finding_without_a_heatmap_is_n_a_and_warns_nothing(tmp_path, monkeypatch):
    nih = tmp_path / "nih"
    write_bbox_folder(nih, n=4, stored=32)
    monkeypatch.setitem(hm.HEATMAPPERS, HalfBlind, hm.Heatmapper(make_half_blind, lambda encoder: "toy maps"))
    encoder = HalfBlind("half", [Target("Effusion", "e", "n"), Target("Nodule", "n", "n")])
    draw = draw_subsets(load_protocol("nih-grounding"), nih)
    paths, boxes = draw.test.table["path"].tolist(), draw.test.targets.boxes
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the RuntimeWarning "All-NaN slice encountered" fails the test
        grounded = score_heatmaps(encoder, nih, paths, boxes, ["Effusion", "Nodule"], seed=1)
        assert grounded.examples["Nodule"] == [] and len(grounded.examples["Effusion"]) == 2
        assert "model: n/a for Nodule (no heatmap: no output of the model answers it)" in grounded.notes
        blank = np.full((16, 16), np.nan, dtype=np.float32)
        figure = overlay_figure([np.zeros((16, 16), np.uint8)], [blank], [boxes[0]], ["Nodule: 00000001_000"])
    assert figure.axes[0].get_title() == "Nodule: 00000001_000 (n/a: no heatmap)"


@pytest.mark.parametrize("flat", [0.5, np.nan])
def test_the_overlay_of_a_flat_map_says_so_and_a_map_with_some_nan_still_peaks(flat):
    heatmap = np.full((8, 8), flat, dtype=np.float32)
    heatmap[2, 3], heatmap[0, 0] = 1.0, 0.0
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fig = overlay_figure([np.zeros((8, 8), np.uint8)] * 2, [heatmap, np.full((8, 8), 0.5)], [(), ()], ["a", "b"])
    assert [ax.get_title() for ax in fig.axes] == ["a", "b (flat map)"]
    (marker,) = fig.axes[0].lines
    assert (marker.get_xdata()[0], marker.get_ydata()[0]) == (3, 2)
