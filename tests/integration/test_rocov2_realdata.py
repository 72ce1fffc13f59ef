"""`task=rocov2_concepts` end to end on real radiographs: a ROCOv2-shaped release built from the 1,000 NIH films of
../shared/data/nih1000 in ROCOv2's own vocabulary (tests/rocov2_data.py), trained with a long-tailed loss and
sampler, then the run file and its official F1 beside the frequency-prior floor.
"""

from __future__ import annotations

import json
import math
from collections import Counter

import numpy as np
import pytest
from mlflow import MlflowClient

from apps import score as score_cli
from apps import submit_cli
from apps.benchmarks.imageclef_concepts.scoring import frequency_prior, read_concepts, read_run
from tests.conftest import shared_data
from tests.integration.test_rocov2_concepts import train
from tests.rocov2_data import write_rocov2_release
from tests.unit.test_imageclef_concepts import mean_f1
from training.data.adapters.rocov2 import read_concept_table
from training.data.label_names import NIH_FINDING_CUIS, ROCOV2_CHEST, ROCOV2_PLAIN_RADIOGRAPH, ROCOV2_VIEW_CUIS

pytestmark = pytest.mark.realdata


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    nih = shared_data("nih1000")
    tmp = tmp_path_factory.mktemp("rocov2_real")
    release = tmp / "release"
    ids = write_rocov2_release(release, nih, n=1000)
    # LDAM-DRW with class-aware sampling: the long-tailed recipe, on every film (no smoke subset), 64 px.
    train(tmp, release, "loss=ldam", "sampler=class_aware", "data.subset=null", "data.image_size=64",
          "trainer.max_epochs=2")  # fmt: skip
    client = MlflowClient(f"sqlite:///{tmp}/mlflow.db")
    (run,) = client.search_runs([client.get_experiment_by_name("rocov2_concepts").experiment_id])
    return tmp, release, ids, client, run


def test_release_fixture_speaks_rocov2s_vocabulary(trained):
    _, release, ids, _, _ = trained
    assert sum(len(v) for v in ids.values()) == 1000
    truth = {**read_concepts(release / "train_concepts.csv"), **read_concepts(release / "valid_concepts.csv"),
             **read_concepts(release / "test_concepts.csv")}  # fmt: skip
    assert all(
        {"C1306645", "C0817096"} <= cuis and len(cuis & {"C1996865", "C1999039"}) == 1 for cuis in truth.values()
    )
    used = {c for cuis in truth.values() for c in cuis}
    assert used - {"C1306645", "C0817096", "C1996865", "C1999039"} <= set(NIH_FINDING_CUIS.values())


def test_real_run_file_scores_beside_the_frequency_prior(trained, tmp_path, monkeypatch, capsys):
    tmp, release, ids, _, run = trained
    assert run.info.status == "FINISHED" and math.isfinite(run.data.metrics["test/mAP"])
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp}/mlflow.db")
    monkeypatch.setenv("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    truth = read_concepts(release / "test_concepts.csv")
    scores = {}
    for mode in ("global", "per_class"):
        out = tmp_path / f"{mode}.csv"
        submit_cli.main(["--task", "rocov2_concepts", "--model", run.info.run_id, "--out", str(out), "--thresholds",
                         mode])  # fmt: skip
        chosen = json.loads((tmp_path / f"{mode}.csv.thresholds.json").read_text())
        scores[mode] = (chosen["val_f1"], mean_f1(truth, read_run(out, ids["test"])))
    assert scores["per_class"][0] >= scores["global"][0] - 1e-12  # coordinate ascent starts from the global one
    prior = frequency_prior(read_concepts(release / "train_concepts.csv"))
    floor = mean_f1(truth, {i: prior for i in truth})
    capsys.readouterr()
    score_cli.main([str(tmp_path / "per_class.csv"), str(release / "test_concepts.csv"), "--task", "rocov2_concepts",
                    "--manual", str(release / "test_concepts_manual.csv"), "--secondary", "manual"])  # fmt: skip
    printed = capsys.readouterr().out
    with capsys.disabled():
        print(f"\nnih1000 as ROCOv2, test {len(truth)} images: test mAP {run.data.metrics['test/mAP']:.3f}; mean "
              f"per-image F1 (validation, test): global {scores['global']}, per_class {scores['per_class']}; "
              f"frequency prior {floor:.4f} ({', '.join(prior)})\n{printed}")  # fmt: skip
    assert np.isfinite([*scores["global"], *scores["per_class"], floor]).all()
    assert float(printed.split("F1 (primary)")[1].split()[0]) == pytest.approx(scores["per_class"][1], abs=1e-4)


def test_the_real_rocov2_tables_read_and_carry_the_fixtures_verified_concepts():
    """The adapter's reader on ROCOv2's own concept tables (../shared/data/rocov2-text), the label count the task's
    default min_count gives, and the fixture's CUIs: each one not marked UNSURE in label_names.py is a concept
    ROCOv2 uses."""
    root = shared_data("rocov2-text")
    tables = {split: read_concept_table(root / f"{split}_concepts.csv.gz") for split in ("train", "valid", "test")}
    assert {split: len(t.ids) for split, t in tables.items()} == {"train": 59962, "valid": 9904, "test": 9927}
    counts = Counter(c for cuis in tables["train"].concepts for c in cuis)
    assert len(counts) == 1948 and sum(n >= 10 for n in counts.values()) == 1571  # task.min_count=10: 1,571 labels
    unsure = {"Consolidation", "Mass", "Pleural_Thickening"}  # absent from ROCOv2 (label_names.py says why)
    verified = [cui for finding, cui in NIH_FINDING_CUIS.items() if finding not in unsure]
    for cui in [ROCOV2_PLAIN_RADIOGRAPH, ROCOV2_CHEST, *ROCOV2_VIEW_CUIS.values(), *verified]:
        assert counts[cui] >= 25, cui
    assert all(counts[NIH_FINDING_CUIS[finding]] == 0 for finding in unsure)
    manual = read_concept_table(root / "test_concepts_manual.csv.gz")
    assert sum(not cuis for cuis in manual.concepts) == 105  # empty cells are images without manual concepts
