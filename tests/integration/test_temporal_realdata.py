"""The grounding protocol on the real NIH boxes (../shared/data/nih-bbox) and the progression protocol on the real
NIH follow-up series (../shared/data/nih1000), with the floors every report carries."""

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


def test_progression_pairs_from_the_real_nih_follow_ups(tmp_path):
    root = shared_data("nih1000")
    protocol = load_protocol("chextemporal")
    draw = draw_subsets(protocol, root)
    assert draw.params["source"] == "nih" and protocol.classes == ("new", "persisting", "resolved")
    tables = [subset.table for subset in draw.subsets.values()]
    assert sum(len(t) for t in tables) == 967  # 10 CheXpert findings from NIH's labels, consecutive films
    patients = [set(t["patient_id"]) for t in tables]
    assert all(not (a & b) for i, a in enumerate(patients) for b in patients[i + 1 :])
    model = load_model(protocol, write_tiny_clip(tmp_path / "clip"), "sqlite:///unused.db")
    result = run_benchmark(protocol, draw, model, root, n_boot=100, cache_dir=None)
    values = result.table.set_index(["protocol", "metric"])["value"]
    truth = draw.test.table["progression"]
    majority = draw.subsets["train"].table["progression"].value_counts().idxmax()
    assert values[("majority", "accuracy")] == pytest.approx((truth == majority).mean())
    assert np.isfinite([values[(m, "accuracy")] for m in ("zero_shot", "rule", "head")]).all()
