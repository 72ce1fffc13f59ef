"""Bad prediction files fail with their row and column named."""

import numpy as np
import pandas as pd
import pytest

from evaluation.predictions import PredictionsError, align_predictions, read_predictions

LABELS = ["A", "B"]


@pytest.fixture
def pair():
    truth = pd.DataFrame({"image_id": ["x", "y", "z"], "A": [1, 0, np.nan], "B": [0, 1, 1]})
    predictions = pd.DataFrame({"image_id": ["z", "x", "y"], "A": [0.3, 0.9, 0.1], "B": [0.8, 0.2, 0.7]})
    return predictions, truth


def test_aligns_by_id_and_marks_unlabelled(pair):
    predictions, truth = pair
    targets, probs = align_predictions(predictions, truth, LABELS)
    np.testing.assert_array_equal(probs, [[0.9, 0.2], [0.1, 0.7], [0.3, 0.8]])
    np.testing.assert_array_equal(targets, [[1, 0], [0, 1], [-1, 1]])


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda p: p.assign(A=[0.3, np.nan, 0.1]), "line 3, column 'A': 'nan' is not a probability"),
        (lambda p: p.assign(B=[0.8, 1.2, 0.7]), "line 3, column 'B': '1.2' is not a probability"),
        (lambda p: p.drop(columns="B"), r"missing class column\(s\) \['B'\] .*; columns not recognised: none$"),
        (
            lambda p: p.rename(columns={"B": "Bee"}),
            r"missing class column\(s\) \['B'\] .*; columns not recognised: \['Bee'\]",
        ),
        (lambda p: p.iloc[:2], r"1 missing \(e.g. \['y'\]\)"),
        (lambda p: p.assign(image_id=["z", "x", "w"]), r"1 unknown \(e.g. \['w'\]\)"),
        (lambda p: p.assign(image_id=["z", "x", "x"]), r"duplicated image_id\(s\) \['x'\]"),
    ],
)
def test_bad_predictions_are_named(pair, edit, message):
    predictions, truth = pair
    with pytest.raises(PredictionsError, match=message):
        align_predictions(edit(predictions), truth, LABELS, source="preds.csv")


def test_ids_with_leading_zeros_are_read_as_written(tmp_path):
    """An export keyed by 000123 matches ground truth keyed by 000123, not by the number 123."""
    truth = pd.DataFrame({"image_id": ["000123", "004560", "7"], "A": [1.0, 0.0, 1.0], "B": [0.0, 1.0, 0.0]})
    path = tmp_path / "preds.csv"
    path.write_text("image_id,A,B\n004560,0.25,0.5\n7,0.125,0.75\n000123,1,0\n")
    targets, probs = align_predictions(read_predictions(path), truth, LABELS, source=str(path))
    np.testing.assert_array_equal(probs, [[1.0, 0.0], [0.25, 0.5], [0.125, 0.75]])
    np.testing.assert_array_equal(targets, truth[LABELS].to_numpy())


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", r"preds\.csv: empty file"),
        ("image_id,A,B\nx,0.5,\n", r"preds\.csv: line 2, column 'B': '' is not a probability"),
        ('image_id,A,B\nx,"0.5\n', r"preds\.csv: not a readable CSV file"),
    ],
)
def test_unreadable_files_and_empty_cells_are_named(tmp_path, text, message):
    path = tmp_path / "preds.csv"
    path.write_text(text)
    truth = pd.DataFrame({"image_id": ["x"], "A": [1.0], "B": [0.0]})
    with pytest.raises(PredictionsError, match=message):
        align_predictions(read_predictions(path), truth, LABELS, source=str(path))
