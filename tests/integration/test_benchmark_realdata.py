"""The pneumonia protocol on the real Kermany images in ../shared/data/kermany-dev (its test folder = dev_test)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from sklearn.metrics import accuracy_score, recall_score, roc_auc_score

from apps.benchmarks.framework.catalog import load_protocol
from apps.benchmarks.framework.runner import draw_subsets, load_model, run_benchmark
from apps.benchmarks.framework.sampling import largest_remainder_quotas
from apps.benchmarks.pneumonia import pools
from tests.benchmark_data import write_tiny_clip
from tests.conftest import shared_data
from training.data.adapters.kermany import parse_name

pytestmark = pytest.mark.realdata
PROTOCOL = load_protocol("pneumonia")


def test_every_file_name_parses_to_the_data_sets_own_patient_key():
    root = shared_data("kermany-dev")
    labels = pd.read_csv(root / "labels.csv")
    parsed = labels["image"].map(lambda rel: parse_name(Path(rel).name)[0])
    assert (parsed == labels["patient_key"]).all()
    shapes = set(labels["image"].str.replace(r"\d+", "N", regex=True).map(lambda rel: Path(rel).name))
    assert {"personN_bacteria_N.jpeg", "personN_virus_N_N.jpeg", "IM-N-N-N.jpeg", "NORMALN-IM-N-N-N.jpeg"} <= shapes


def test_protocol_draws_on_kermany_dev():
    root = shared_data("kermany-dev")
    train_pool, test_pool = pools(str(root))
    assert test_pool["label"].value_counts().to_dict() == {1: 390, 0: 234}  # dev_test: the official test's mix
    full, n100 = draw_subsets(PROTOCOL, root, "full"), draw_subsets(PROTOCOL, root, "n100")
    # dev_train / dev_test are patient-disjoint by construction: no version excludes anything, so both versions
    # train on the same 500 images (on the official release they would not).
    assert full.params["excluded_train_images"] == n100.params["excluded_train_images"] == 0
    assert full.params["train_shared_full_n100"] == n100.params["train_shared_full_n100"] == 500
    assert full.params["train_fingerprint_n100"] == n100.params["train_fingerprint_full"] == "867f1693ad5cfbff"
    assert "500 of 500 training images shared between full and n100" in n100.description
    assert {name: subset.pool for name, subset in full.subsets.items()} == {"train": 4592, "test": 624}
    assert full.subsets["train"].table["label"].value_counts().to_dict() == {1: 379, 0: 121}
    assert n100.test.table["label"].value_counts().to_dict() == {1: 63, 0: 37}
    assert len(full.test) == 624
    # The subsets are part of the protocol (docs/benchmarks.md quotes these fingerprints): they change only if
    # the draw (or the data) changes.
    assert full.fingerprints == {"train": "867f1693ad5cfbff", "test": "9e931b14ab8f38c5"}
    assert n100.fingerprints == {"train": "867f1693ad5cfbff", "test": "7a4e7f5c2b828314"}


def by_hand(labels: pd.DataFrame, split: str, size: int) -> set[str]:
    """The documented draw from the data set's own table: per label, the quota's lowest
    ``sha256("<seed>:pneumonia-<folder>-<file stem>")`` among the ``split`` rows."""
    rows = labels[labels["dev_split"] == split]
    folder = rows["image"].str.split("/").str[0].iloc[0]
    ids = {label: [f"pneumonia-{folder}-{Path(image).stem}" for image in part["image"]]
           for label, part in rows.groupby("pneumonia")}  # fmt: skip
    quotas = largest_remainder_quotas({label: len(items) for label, items in ids.items()}, size)

    def rank(item: str) -> str:
        return hashlib.sha256(f"{PROTOCOL.seed}:{item}".encode()).hexdigest()

    return {item for label, items in ids.items() for item in sorted(items, key=rank)[: quotas[label]]}


def test_the_draws_are_the_cards_ids_ranked_by_hand_from_labels_csv():
    root = shared_data("kermany-dev")
    labels = pd.read_csv(root / "labels.csv")
    n100 = draw_subsets(PROTOCOL, root, "n100")
    assert set(n100.test.ids) == by_hand(labels, "dev_test", 100)
    assert set(n100.subsets["train"].ids) == by_hand(labels, "dev_train", 500)
    assert set(draw_subsets(PROTOCOL, root, "full").test.ids) == by_hand(labels, "dev_test", 624)


def test_tiny_random_clip_runs_the_protocol_on_real_images(tmp_path):
    root = shared_data("kermany-dev")
    draw = draw_subsets(PROTOCOL, root, "n100")
    encoder = load_model(PROTOCOL, write_tiny_clip(tmp_path / "tiny"), "sqlite:///unused.db")
    result = run_benchmark(PROTOCOL, draw, encoder, root, n_boot=200, cache_dir=tmp_path / "cache")
    assert len(result.scores) == 100 and result.scores["label"].sum() == 63
    values = result.table.set_index(["protocol", "metric"])["value"]
    # An image-text model has no threshold of its own: the extra column is empty, every other figure a proportion.
    own = values.index.get_level_values("protocol") == "zero_shot_run_threshold"
    assert own.any() and values[own].isna().all()
    card = values[~own].to_numpy()
    assert np.isfinite(card).all() and ((card >= 0) & (card <= 1)).all()


def test_the_cards_decision_rule_on_real_images(tmp_path):
    """The tiny random CLIP on the n100 draw: the card's calls (a margin above 0, the probe's probability above
    0.5) scored as scikit-learn scores them from the logged per-image values; the floor is the draw's prevalence."""
    root = shared_data("kermany-dev")
    draw = draw_subsets(PROTOCOL, root, "n100")
    encoder = load_model(PROTOCOL, write_tiny_clip(tmp_path / "tiny"), "sqlite:///unused.db")
    result = run_benchmark(PROTOCOL, draw, encoder, root, n_boot=0, cache_dir=None)
    got, scores = result.table.set_index(["protocol", "metric"])["value"], result.scores
    labels = scores["label"].to_numpy()
    for method, calls in (("zero_shot", scores["zero_shot_score"] > 0), ("probe", scores["probe_probability"] > 0.5)):
        assert np.array_equal(scores[f"{method}_pneumonia"], calls.astype(int))
        assert got[method, "accuracy"] == pytest.approx(accuracy_score(labels, calls), abs=1e-12)
        assert got[method, "sensitivity"] == pytest.approx(recall_score(labels, calls), abs=1e-12)
        assert got[method, "specificity"] == pytest.approx(recall_score(labels, calls, pos_label=0), abs=1e-12)
    assert got["zero_shot", "auroc"] == pytest.approx(roc_auc_score(labels, scores["zero_shot_score"]), abs=1e-12)
    assert (
        got["always_pneumonia", "accuracy"] == pytest.approx(63 / 100) and got["always_pneumonia", "specificity"] == 0
    )
    assert got.loc["zero_shot_run_threshold"].isna().all()
