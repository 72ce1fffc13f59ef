"""The submission validator names every problem; the builder follows the template's header and row order."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from apps.submission import SubmissionError, Template, build_submission, problems, validate, validate_file

LABELS = ["Pleural Effusion", "Cardiomegaly", "Support Devices"]
IDS = ["img0", "img1", "img2", "img3"]


def _valid() -> pd.DataFrame:
    template = Template.default(LABELS, IDS)
    probs = np.array([[0.1, 0.2, 0.3], [0.4, 0.5, 0.6], [0.7, 0.8, 0.9], [0.0, 1.0, 0.5]])
    return build_submission(template, IDS, probs, LABELS)


def test_default_header_uses_the_organisers_spelling():
    assert Template.default(LABELS, IDS).header == ["ImageID", "pleural effusion", "cardiomegaly", "support devices"]


def test_a_valid_file_passes(tmp_path):
    frame = _valid()
    path = tmp_path / "submission.csv"
    frame.to_csv(path, index=False)
    assert problems(frame, Template.default(LABELS, IDS)) == []
    assert validate_file(path, Template.default(LABELS, IDS))["ImageID"].tolist() == IDS


def _rejected(frame: pd.DataFrame, tmp_path) -> str:
    path = tmp_path / "bad.csv"
    frame.to_csv(path, index=False)
    with pytest.raises(SubmissionError) as error:
        validate_file(path, Template.default(LABELS, IDS))
    return str(error.value)


def test_missing_id_is_named(tmp_path):
    message = _rejected(_valid().drop(index=2), tmp_path)
    assert "1 id(s) missing: 'img2'" in message


def test_duplicated_id_is_named_with_its_lines(tmp_path):
    frame = _valid()
    frame.loc[3, "ImageID"] = "img1"  # img3 is then missing too; both are reported
    message = _rejected(frame, tmp_path)
    assert "id 'img1' appears 2 times (lines [3, 5])" in message and "'img3'" in message


def test_extra_id_is_named(tmp_path):
    frame = pd.concat([_valid(), _valid().iloc[[0]].assign(ImageID="intruder")], ignore_index=True)
    assert "not in the template: 'intruder'" in _rejected(frame, tmp_path)


def test_nan_is_named_by_line_id_and_column(tmp_path):
    frame = _valid()
    frame.loc[1, "cardiomegaly"] = np.nan
    message = _rejected(frame, tmp_path)
    assert "line 3 (id 'img1'), column 'cardiomegaly'" in message and "not a probability" in message


def test_value_above_one_is_named(tmp_path):
    frame = _valid()
    frame.loc[2, "support devices"] = 1.5
    message = _rejected(frame, tmp_path)
    assert "line 4 (id 'img2'), column 'support devices': '1.5'" in message


def test_negative_and_text_values_are_rejected_too():
    frame = _valid().astype({"pleural effusion": object})
    frame.loc[0, "pleural effusion"] = -0.1
    frame.loc[3, "pleural effusion"] = "high"
    found = problems(frame, Template.default(LABELS, IDS))
    assert len(found) == 2 and "'high'" in found[1]


def test_misspelt_column_is_named(tmp_path):
    frame = _valid().rename(columns={"cardiomegaly": "cardiomegally"})
    message = _rejected(frame, tmp_path)
    assert "column 3 is 'cardiomegally', expected 'cardiomegaly'" in message


def test_every_problem_is_listed_at_once():
    frame = _valid().rename(columns={"cardiomegaly": "Cardiomegaly"}).drop(index=0)
    frame.loc[1, "support devices"] = 2.0
    with pytest.raises(SubmissionError) as error:
        validate(frame, Template.default(LABELS, IDS))
    assert all(part in str(error.value) for part in ("'Cardiomegaly'", "'img0'", "column 'support devices'"))


def test_row_order_must_follow_the_template():
    frame = _valid().iloc[[1, 0, 2, 3]]
    (problem,) = problems(frame, Template.default(LABELS, IDS))
    assert "line 2 has id 'img1', expected 'img0'" in problem
    assert problems(frame, Template.default(LABELS, IDS), check_order=False) == []


def test_template_order_and_spelling_are_followed_by_canonical_name(tmp_path):
    path = tmp_path / "template.csv"
    header = ["ImageID", "Support_Devices", "pleural effusion", "CARDIOMEGALY"]  # another order, other spellings
    pd.DataFrame({c: (["img3", "img0", "img2", "img1"] if c == "ImageID" else 0) for c in header}).to_csv(
        path, index=False
    )
    template = Template.read(path)
    probs = np.array([[0.1, 0.2, 0.3], [0.4, 0.5, 0.6], [0.7, 0.8, 0.9], [0.0, 1.0, 0.5]])  # rows follow IDS
    frame = build_submission(template, IDS, probs, LABELS)
    assert list(frame.columns) == header and frame["ImageID"].tolist() == ["img3", "img0", "img2", "img1"]
    row = frame.set_index("ImageID").loc["img1"]
    assert (row["Support_Devices"], row["pleural effusion"], row["CARDIOMEGALY"]) == (0.6, 0.4, 0.5)
    assert problems(frame, template) == []


def test_template_column_naming_no_model_class_is_rejected(tmp_path):
    template = Template(["ImageID", "pleural effusion", "pleural efusion"], IDS)
    with pytest.raises(SubmissionError, match="'pleural efusion'"):
        build_submission(template, IDS, np.zeros((4, 3)), LABELS)
