"""The grounding protocol on the real NIH boxes (../shared/data/nih-bbox) and the progression protocol on every
labelled pair of the real NIH follow-up series (../shared/data/nih1000) and of covid-temporal
(../shared/data/covid-temporal), with the floors every report carries."""

from __future__ import annotations

import numpy as np
import pytest

from apps.benchmarks.framework.catalog import load_protocol
from apps.benchmarks.framework.runner import draw_subsets, load_model, run_benchmark
from tests.benchmark_data import write_tiny_clip
from tests.conftest import shared_data

pytestmark = pytest.mark.realdata


def test_grounding_on_the_real_boxes_with_a_tiny_model_and_both_floors(tmp_path):
    root = shared_data("nih-bbox")
    protocol = load_protocol("nih-grounding")
    draw = draw_subsets(protocol, root, "n200")
    assert len(draw.test) == 200 and draw.test.pool == 880
    assert sum(len(b) for b in draw.test.targets.boxes) >= 200 and all(
        box.frame_width == 1024 for boxes in draw.test.targets.boxes for box in boxes
    )
    model = load_model(protocol, write_tiny_clip(tmp_path / "clip"), "sqlite:///unused.db")
    result = run_benchmark(protocol, draw, model, root, n_boot=100, cache_dir=None, batch_size=32)
    values = result.table.set_index(["protocol", "metric"])
    # hearts sit in the middle of a chest film: the centre prior finds nearly every cardiomegaly box
    assert values.loc[("centre", "pg/cardiomegaly"), "value"] > 0.8
    assert values.loc[("random", "pg/overall"), "value"] < values.loc[("centre", "pg/overall"), "value"]
    low, high = values.loc[("model", "pg/overall"), ["ci_low", "ci_high"]]
    assert 0 <= low <= values.loc[("model", "pg/overall"), "value"] <= high <= 1


def every_pair_scored_once(result) -> None:
    """Each method answers every labelled pair exactly once, and no fold shares a patient with another."""
    table, scores = result.draw.test.table, result.scores
    assert scores["pair_id"].tolist() == table["pair_id"].tolist() and scores["pair_id"].is_unique
    for method in result.protocol.methods:
        if result.params[f"scored_{method}"]:
            assert scores[f"{method}_predicted"].notna().all()
            assert result.params[f"scored_{method}"] == len(table)
    assert (table.groupby(["source", "patient_id"])["fold"].nunique() == 1).all()


def test_progression_on_every_real_nih_follow_up_pair(tmp_path):
    root = shared_data("nih1000")
    protocol = load_protocol("chextemporal")
    draw = draw_subsets(protocol, root)
    assert draw.params["source"] == "nih" and protocol.classes == ("new", "persisting", "resolved")
    assert list(draw.subsets) == ["test"] and len(draw.test) == 967  # 10 CheXpert findings, consecutive films
    assert draw.params["folds"] == 5
    model = load_model(protocol, write_tiny_clip(tmp_path / "clip"), "sqlite:///unused.db")
    result = run_benchmark(protocol, draw, model, root, n_boot=100, cache_dir=None)
    every_pair_scored_once(result)
    values = result.table.set_index(["protocol", "metric"])["value"]
    assert np.isfinite([values[(m, "accuracy")] for m in ("zero_shot", "rule", "head", "majority")]).all()


def test_progression_on_every_labelled_covid_temporal_pair(tmp_path):
    root = shared_data("covid-temporal")
    protocol = load_protocol("chextemporal")
    draw = draw_subsets(protocol, root)
    # 123 consecutive pairs, of which 5 (3 patients) have the raters' opacity score on both films
    assert draw.params["source"] == "covid-temporal" and draw.test.pool == 123 and len(draw.test) == 5
    assert draw.params["folds"] == 3  # fewer patients than folds: one patient per fold
    model = load_model(protocol, write_tiny_clip(tmp_path / "clip"), "sqlite:///unused.db")
    result = run_benchmark(protocol, draw, model, root, n_boot=100, cache_dir=None)
    every_pair_scored_once(result)
