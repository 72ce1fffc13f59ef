"""ImageCLEFmedical caption prediction on the ROCOv2 captions in ../shared/data/rocov2-text.

That folder has the valid and test captions but no training captions, so the valid split stands in as the
"training" pool of the constant-caption floor scored on test. BERTScore is not asked for here (its DeBERTa weights
are not on these machines, and 9,927 captions on a CPU would take long); the unit tests cover its paths.
"""

from __future__ import annotations

import csv

import numpy as np
import pytest

from apps.benchmarks.framework.extra import INSTALL
from apps.benchmarks.imageclef_captions.scoring import caption_scores, constant_caption, read_captions
from tests.conftest import shared_data

pytestmark = pytest.mark.realdata
pytest.importorskip("rouge_score", reason=INSTALL)  # the caption metrics' packages are the benchmarks extra


@pytest.fixture(scope="module")
def splits():
    root = shared_data("rocov2-text")
    return read_captions(root / "valid_captions.csv.gz"), read_captions(root / "test_captions.csv.gz")


def test_constant_caption_floor_on_test(splits, tmp_path):
    valid, test = splits
    assert len(valid) > 9000 and len(test) > 9000 and not set(valid) & set(test)
    caption = constant_caption(valid)  # valid as the training pool: the release has no train captions here
    assert caption
    run_path = tmp_path / "constant.csv"
    with open(run_path, "w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(["ID", "Caption"])
        writer.writerows((image_id, caption) for image_id in test)
    run = read_captions(run_path)
    assert list(run) == list(test)
    scores = caption_scores(test, run, bertscore_model=None)
    print(f"constant caption {caption!r}:", *scores.summary(), sep="\n  ")
    for name in ("rouge1", "bleu1", "meteor", "cider"):
        assert 0.0 < scores.means[name] < 1.0
        assert len(scores.per_caption[name]) == len(test)
    assert scores.means["bleu1"] < scores.means["rouge1"]  # a short caption: BLEU-1's brevity penalty bites


def test_captions_against_themselves(splits):
    _, test = splits
    scores = caption_scores(test, dict(test), bertscore_model=None, lexical=False)
    for name in ("rouge1", "bleu1"):
        np.testing.assert_array_equal(scores.per_caption[name], 1.0)
