"""One id/label contract: what the submission writer writes, the scorer reads, in either spelling."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from apps.score import score
from apps.submission import SubmissionError, Template, build_submission
from evaluation.prediction_columns import PredictionsError, id_column, to_platform
from evaluation.predictions import align_predictions, read_predictions
from training.data.findings import TASK2_LABELS

LABELS = ["Pleural Effusion", "Cardiomegaly", "Support Devices"]
IDS = ["000123", "img1", "img2"]
PROBS = np.array([[0.1, 0.2, 0.3], [0.4, 0.5, 0.6], [0.7, 0.8, 0.9]])
TRUTH = pd.DataFrame({"image_id": IDS[::-1], **{name: [1.0, 0.0, np.nan] for name in LABELS}})


def test_the_written_submission_is_scored_as_written(tmp_path):
    """make submit's file (ImageID, the organisers' spelling) is what make score reads: no renaming."""
    path = tmp_path / "submission.csv"
    build_submission(Template.default(LABELS, IDS), IDS, PROBS, LABELS).to_csv(path, index=False)
    assert path.read_text().splitlines()[0] == "ImageID,pleural effusion,cardiomegaly,Support Devices"
    targets, probs = align_predictions(read_predictions(path), TRUTH, LABELS, source=str(path))
    np.testing.assert_array_equal(probs, PROBS[::-1])  # the truth's row order, ids read as text ("000123")
    np.testing.assert_array_equal(targets, TRUTH[LABELS].fillna(-1).to_numpy())


def test_a_template_spelling_is_matched_by_the_same_rule_the_scorer_uses(tmp_path):
    template = Template(["Image_ID", "SUPPORT_DEVICES", "cardio-megaly", "Pleural  Effusion"], IDS)
    frame = build_submission(template, IDS, PROBS, LABELS)
    renamed = to_platform(frame, LABELS)
    assert list(renamed.columns) == ["image_id", *LABELS]
    np.testing.assert_array_equal(renamed[LABELS].to_numpy(), PROBS)


@pytest.mark.parametrize("name", ["image_id", "ImageID", "Image ID", "IMAGE-ID", "dicom_id"])
def test_every_spelling_of_the_id_column_is_found(name):
    assert id_column(["x", name, "Mass"]) == name


def test_no_id_column_names_what_the_file_holds():
    with pytest.raises(PredictionsError, match=r"p\.csv: no image id column \('image_id' or 'ImageID'\); columns: "
                                               r"\['id', 'Mass'\]"):  # fmt: skip
        to_platform(pd.DataFrame({"id": ["a"], "Mass": [0.5]}), ["Mass"], "p.csv")


def test_two_columns_naming_one_class_are_refused_by_name():
    frame = pd.DataFrame({"ImageID": ["a"], "Pleural_Effusion": [0.1], "pleural effusion": [0.9]})
    with pytest.raises(PredictionsError, match=r"columns \['Pleural_Effusion', 'pleural effusion'\] all name the "
                                               r"class 'Pleural Effusion'"):  # fmt: skip
        to_platform(frame, ["Pleural Effusion"])
    with pytest.raises(SubmissionError, match="all name the class 'Pleural Effusion'"):
        build_submission(Template(list(frame.columns), ["a"]), ["a"], np.zeros((1, 1)), ["Pleural Effusion"])


def test_a_template_whose_first_column_is_no_id_is_refused(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("cardiomegaly,ImageID\n0,a\n")
    with pytest.raises(SubmissionError, match=r"the first column 'cardiomegaly' is not an image id column"):
        Template.read(path)
    with pytest.raises(SubmissionError, match=r"template not found: .*missing\.csv"):
        Template.read(tmp_path / "missing.csv")


def test_a_task2_submission_is_scored_on_the_unseen_classes_it_holds(make_manifest, capsys):
    """Task 2 submits only its six unseen columns (docs/rules.md §1): make score TASK=task2 scores exactly those."""
    manifest = make_manifest(n=60)
    test = pd.read_csv(manifest, dtype=str).query("split == 'test'")
    ids = test["image_id"].tolist()
    probs = np.random.default_rng(0).random((len(ids), len(TASK2_LABELS)))
    path = manifest.with_name("task2.csv")
    build_submission(Template.default(TASK2_LABELS, ids), ids, probs, TASK2_LABELS).to_csv(path, index=False)
    score(SimpleNamespace(predictions=path, manifest=manifest, split="test", task="task2", n_boot=10))
    printed = capsys.readouterr().out
    assert printed.startswith(f"{path} on {manifest} [test], {len(ids)} images")
