"""ImageCLEFmedical Caption 2024 (ROCOv2) concept detection on the real tables in ../shared/data/rocov2-text.

The frequency-prior baseline (the 3 most frequent training concepts for every image) is scored with the primary
and the secondary rule; its figures are pinned so a change to the scorer or the data shows here.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from sklearn.metrics import f1_score

from apps.benchmarks.imageclef_concepts.scoring import (
    MANUAL_2024,
    MANUAL_2025,
    SubmissionCheckError,
    check_submission,
    frequency_prior,
    manual_vocabulary,
    per_image_f1,
    read_concepts,
    read_run,
    write_run,
)
from tests.conftest import shared_data
from tests.unit.test_imageclef_concepts import mean_f1

pytestmark = pytest.mark.realdata

#: rows, and rows with an empty manual CUIs cell, per split (gzip CSV, header ``ID,CUIs``)
ROWS = {"train": 59962, "valid": 9904, "test": 9927}
EMPTY_MANUAL = {"train": 493, "valid": 130, "test": 105}
#: the train-frequency prior's scores: primary, secondary (MANUAL_2024, the default; MANUAL_2025 gives the same on
#: ROCOv2), secondary (the split's manual vocabulary)
BASELINE = {
    "valid": (0.25894610914304567, 0.3724677716390424, 0.3587340563399495),
    "test": (0.2559950682988565, 0.3687538179596823, 0.35490735084504177),
}
#: the full (automatic) ground truth submitted as a run, on the secondary score (MANUAL_2025): below 1, because on
#: about a tenth of the images (valid 1027, test 1007) the full table has an allowed concept the manual one dropped
FULL_AS_RUN_SECONDARY = {"valid": 0.9655071277539049, "test": 0.9663476549243196}


@pytest.fixture(scope="module")
def tables():
    root = shared_data("rocov2-text")
    return {
        split: (
            read_concepts(root / f"{split}_concepts.csv.gz"),
            read_concepts(root / f"{split}_concepts_manual.csv.gz"),
        )
        for split in ROWS
    }


def test_tables_read_as_published(tables):
    for split, (full, manual) in tables.items():
        assert len(full) == len(manual) == ROWS[split], split
        assert list(full) == list(manual)  # the same images in the same order
        assert all(full.values()), f"{split}: every image has at least one concept"
        assert sum(not concepts for concepts in manual.values()) == EMPTY_MANUAL[split]
        assert all(concepts <= full[i] for i, concepts in manual.items()), "manual concepts are a subset"
    vocabulary = manual_vocabulary(tables["test"][1])
    assert {"C1999039", "C1996865"} <= vocabulary  # AP and PA projections
    assert vocabulary - MANUAL_2025 == {"C1999039", "C1996865", "C0205106", "C0205129"}
    assert MANUAL_2025 - vocabulary == {"C0920367"}  # OCT: added in 2025, absent from ROCOv2


@pytest.mark.parametrize("split", ["valid", "test"])
def test_frequency_prior_baseline(tables, split):
    prior = frequency_prior(tables["train"][0])
    assert prior == ("C0040405", "C1306645", "C0024485")  # CT, X-ray, MRI; k = median 3 concepts per image
    full, manual = tables[split]
    run = dict.fromkeys(full, prior)
    primary = mean_f1(full, run)
    secondary = mean_f1(manual, run, MANUAL_2025)
    secondary_vocabulary = mean_f1(manual, run, manual_vocabulary(manual))
    print(f"{split}: primary {primary:.4f}, secondary {secondary:.4f} (manual vocabulary {secondary_vocabulary:.4f})")
    assert all(0 < score < 1 for score in (primary, secondary, secondary_vocabulary))
    assert (primary, secondary, secondary_vocabulary) == pytest.approx(BASELINE[split], abs=1e-12)
    _, values = per_image_f1(manual, run, MANUAL_2025)
    assert np.isnan(values).sum() == EMPTY_MANUAL[split]  # every non-empty manual row has an allowed concept
    # the truth scored against itself is exactly 1
    assert mean_f1(full, full) == 1.0
    assert mean_f1(manual, manual, MANUAL_2025) == 1.0
    assert mean_f1(manual, manual, manual_vocabulary(manual)) == 1.0
    # a perfect primary run is not a perfect secondary one
    assert mean_f1(manual, full, MANUAL_2025) == pytest.approx(FULL_AS_RUN_SECONDARY[split], abs=1e-12)
    assert sum(full[i] & MANUAL_2025 != manual[i] & MANUAL_2025 for i in full) == {"valid": 1027, "test": 1007}[split]


def test_scores_match_the_evaluators_sklearn_computation(tables):
    """On the first 300 test images, an independent evaluator-style loop (sklearn over the sorted union)."""
    full, manual = tables["test"]
    ids = list(full)[:300]
    prior = set(frequency_prior(tables["train"][0]))

    def evaluator(truth, allowed):
        total, count = 0.0, 0
        for i in ids:
            true = truth[i] if allowed is None else truth[i] & allowed
            predicted = prior if allowed is None else prior & allowed
            if not true:
                continue
            union = sorted(true | predicted)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                total += f1_score([int(c in true) for c in union], [int(c in predicted) for c in union])
            count += 1
        return total / count

    run = dict.fromkeys(ids, tuple(prior))
    assert mean_f1({i: full[i] for i in ids}, run) == pytest.approx(evaluator(full, None), abs=1e-12)
    for vocabulary in (MANUAL_2024, MANUAL_2025):
        assert mean_f1({i: manual[i] for i in ids}, run, vocabulary) == pytest.approx(
            evaluator(manual, vocabulary), abs=1e-12
        )


def test_the_2024_and_2025_vocabularies_agree_on_rocov2(tables):
    """2025 only adds OCT (C0920367), which no ROCOv2 table holds: the secondary figures are the same."""
    prior = frequency_prior(tables["train"][0])
    for split in ("valid", "test"):
        full, manual = tables[split]
        assert not any("C0920367" in concepts for concepts in full.values())
        run = dict.fromkeys(full, prior)
        assert mean_f1(manual, run, MANUAL_2024) == mean_f1(manual, run, MANUAL_2025)


def test_write_run_on_the_test_ids_round_trips(tables, tmp_path):
    full, manual = tables["test"]
    ids = list(full)
    prior = frequency_prior(tables["train"][0])
    path = tmp_path / "run.csv"
    back = write_run(path, dict.fromkeys(ids, prior), ids)
    lines = path.read_text().splitlines()
    assert len(lines) == len(ids) + 1 and lines[:2] == ["ID,CUIs", f"{ids[0]},{';'.join(prior)}"]
    check_submission(path, ids)  # the 2026 submission check's stated format, against the ground-truth order
    swapped = path.with_name("swapped.csv")
    swapped.write_text("\n".join([lines[0], lines[2], lines[1], *lines[3:]]) + "\n")
    with pytest.raises(SubmissionCheckError, match="'order' failed"):
        check_submission(swapped, ids)
    assert read_run(path, ids) == back == dict.fromkeys(ids, prior)
    assert mean_f1(full, back) == pytest.approx(BASELINE["test"][0], abs=1e-12)
    # the ground truth itself as a run (with a header) reads back and scores 1
    write_run(path, full, ids)
    check_submission(path, ids)
    assert mean_f1(full, read_run(path, ids)) == 1.0
    assert mean_f1(manual, read_run(path, ids), MANUAL_2025) == pytest.approx(FULL_AS_RUN_SECONDARY["test"])
