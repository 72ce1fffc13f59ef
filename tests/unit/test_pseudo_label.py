"""make pseudo-label's pieces on hand-computed values: which cells are filled and how, the thresholds chosen on a
run's validation predictions, the record beside the output, and the refusals of bad input in one line."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from apps import pseudo_label
from apps.pseudo_label import PseudoLabelInputError, fill_cells, validation_thresholds
from training.data.manifest import file_fingerprint
from training.data.pseudo_labels import PseudoLabelError, PseudoLabelledSource, cell_counts, read_record, record_path

NAN = np.nan


def test_fill_cells_fills_only_unlabelled_cells_of_chosen_rows():
    values = np.array([[1.0, NAN, NAN], [NAN, 0.0, NAN], [NAN, NAN, NAN]])
    probs = np.array([[0.1, 0.30, 0.69], [0.5, 0.9, 0.70], [0.9, 0.9, 0.9]])
    thresholds = np.array([0.5, 0.3, 0.7])
    rows = np.array([True, True, False])  # the third row is, say, a test row: never filled
    filled, pseudo = fill_cells(values, probs, thresholds, rows)
    # prob >= threshold is positive: 0.30 at 0.3 -> 1, 0.69 at 0.7 -> 0, 0.5 at 0.5 -> 1, 0.70 at 0.7 -> 1
    expected = np.array([[1.0, 1.0, 0.0], [1.0, 0.0, 1.0], [NAN, NAN, NAN]])
    np.testing.assert_array_equal(filled, expected)
    np.testing.assert_array_equal(pseudo, [[False, True, True], [True, False, True], [False, False, False]])


def test_margin_keeps_uncertain_cells_unlabelled():
    values = np.full((1, 4), NAN)
    probs = np.array([[0.59, 0.61, 0.41, 0.39]])
    filled, pseudo = fill_cells(values, probs, np.full(4, 0.5), np.array([True]), margin=0.1)
    np.testing.assert_array_equal(filled, [[NAN, 1.0, NAN, 0.0]])
    np.testing.assert_array_equal(pseudo, [[False, True, False, True]])


def val_frame() -> pd.DataFrame:
    return pd.DataFrame({"image_id": ["a", "b", "c", "d"], "A": [0.9, 0.8, 0.6, 0.1], "true/A": [1, 0, 1, 0],
                         "B": [0.2, 0.7, 0.99, 0.4], "true/B": [0, 1, -1, 0]})  # fmt: skip


def test_per_class_thresholds_are_the_f1_maximising_midpoints():
    # A: F1 is best keeping 0.9, 0.8, 0.6 (2TP / (3 + 2) = 0.8), midway to 0.1 -> 0.35
    # B: the -1 cell is left out; keeping 0.7 alone gives F1 1, midway to 0.4 -> 0.55
    np.testing.assert_allclose(validation_thresholds(val_frame(), ["A", "B"], "per_class", "v"), [0.35, 0.55])


def test_global_threshold_pools_every_class():
    # pooled: .9(1) .8(0) .7(1) .6(1) .4(0) .2(0) .1(0); keeping four gives 2*3 / (4 + 3) = 0.857, midway .6/.4 -> 0.5
    np.testing.assert_allclose(validation_thresholds(val_frame(), ["A", "B"], "global", "v"), [0.5, 0.5])


@pytest.mark.parametrize(("column", "value", "row"), [("A", 1.5, 2), ("true/B", 2, 3), ("A", "x", 1)])
def test_tampered_validation_predictions_are_refused(column, value, row):
    frame = val_frame().astype(object)
    frame.loc[row - 1, column] = value
    with pytest.raises(PseudoLabelInputError, match=f"run x: row {row}, class '{column.removeprefix('true/')}'"):
        validation_thresholds(frame, ["A", "B"], "per_class", "run x")


def test_validation_predictions_without_a_class_are_refused():
    with pytest.raises(PseudoLabelInputError, match=r"no validation predictions for \['C', 'true/C'\]"):
        validation_thresholds(val_frame(), ["A", "C"], "per_class", "run x")


def write_record(tmp_path, **changes) -> tuple:
    manifest = tmp_path / "pseudo.csv"
    manifest.write_text("image_id,path,split,patient_id,Mass\na,a.png,train,p,1\n")
    record = {"format": 1, "manifest_fingerprint": file_fingerprint(manifest), "root": str(tmp_path / "images"),
              "source_run": "r1", "thresholds_mode": "global", "thresholds": {"Mass": 0.5, "Nodule": 0.5},
              "margin": 0.0, "cells": {"Mass": {"1": ["a", "b"], "0": ["c"]}, "Nodule": {"1": [], "0": ["a"]}},
              **changes}  # fmt: skip
    record_path(manifest).write_text(json.dumps(record))
    return manifest, record


def test_source_reads_the_record_and_tags_its_counts(tmp_path):
    manifest, _ = write_record(tmp_path)
    source = PseudoLabelledSource(str(manifest))
    assert source.prepare() == manifest
    assert source.root == tmp_path / "images"  # the image folder make pseudo-label read
    tags = source.run_tags
    assert (tags["cxrlt.pseudo_labels.cells"], tags["cxrlt.pseudo_labels.positive"]) == ("4", "2")
    assert (tags["cxrlt.pseudo_labels.negative"], tags["cxrlt.pseudo_labels.source_run"]) == ("2", "r1")
    assert PseudoLabelledSource(str(manifest), root=str(tmp_path)).root == tmp_path  # a root given wins
    assert cell_counts({"cells": {}}) == {"cells": 0, "positive": 0, "negative": 0, "classes": 0}


def test_a_record_of_another_manifest_content_is_refused(tmp_path):
    manifest, _ = write_record(tmp_path, manifest_fingerprint="000000000000")
    with pytest.raises(PseudoLabelError, match="the manifest changed after make pseudo-label"):
        read_record(manifest)
    record_path(manifest).unlink()
    with pytest.raises(PseudoLabelError, match="no pseudo-label record beside"):
        read_record(manifest)


def run_main(capsys, *argv) -> str:
    with pytest.raises(SystemExit) as stopped:
        pseudo_label.main(list(argv))
    assert stopped.value.code == 1
    return capsys.readouterr().err


def test_bad_manifest_is_one_line_before_any_model_loads(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path}/never.db")
    (tmp_path / "a.png").write_bytes(b"")
    manifest = tmp_path / "m.csv"
    manifest.write_text("image_id,path,split,patient_id,Mass\na,a.png,train,p,-1\n")  # CheXpert's -1 is refused
    err = run_main(capsys, "--model", "r", "--manifest", str(manifest), "--out", str(tmp_path / "o.csv"))
    assert err.startswith(f"error: {manifest}: 1 problem(s), nothing was pseudo-labelled:\n")
    assert err.splitlines()[1].strip().startswith("line 2, column 'Mass': '-1' is not a manifest label")
    assert not (tmp_path / "never.db").exists()  # refused before the store was opened


def test_missing_inputs_and_bad_margin_are_one_line(tmp_path, capsys):
    manifest = tmp_path / "m.csv"
    assert run_main(capsys, "--model", "r", "--manifest", str(manifest), "--out", "o.csv").startswith(
        f"error: --manifest {manifest}: no such file\n"
    )
    manifest.write_text("x\n")
    assert run_main(capsys, "--model", "r", "--manifest", str(manifest), "--out", "o.csv", "--margin", "1").startswith(
        "error: --margin 1.0: must be in [0, 1)\n"
    )
    assert run_main(capsys, "--model", "r", "--manifest", str(manifest), "--out", str(manifest)).startswith(
        f"error: --out {manifest}: would overwrite the input manifest; name a new file\n"
    )


def test_cells_are_written_as_text_and_listed_in_the_record():
    text = pd.DataFrame({"image_id": ["a", "b"], "Mass": ["1.0", ""], "Infiltration": ["", "1"]})
    filled = np.array([[1.0, 0.0], [1.0, NAN]])  # Mass, then Nodule: a class the manifest lacks
    pseudo = np.array([[False, True], [True, False]])
    pseudo_label.write_cells(text, ["Mass", "Nodule"], filled, pseudo)
    assert text.to_dict("list") == {"image_id": ["a", "b"], "Mass": ["1.0", "1"], "Infiltration": ["", "1"],
                                    "Nodule": ["0", ""]}  # fmt: skip
    cells = pseudo_label.cell_lists(text["image_id"].to_numpy(), ["Mass", "Nodule"], filled, pseudo)
    assert cells == {"Mass": {"1": ["b"], "0": []}, "Nodule": {"1": [], "0": ["a"]}}


def test_metadata_columns_are_declared_once_and_carried_to_training(tmp_path, capsys, monkeypatch):
    """An adapter's manifest (NIH's age, sex, ...) is refused until its metadata columns are declared; declared,
    they stay metadata (not classes to fill), and the record hands them to the training run."""
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path}/never.db")
    (tmp_path / "a.png").write_bytes(b"")
    manifest = tmp_path / "m.csv"
    manifest.write_text("image_id,path,split,patient_id,age,Mass\na,a.png,train,p,57,\n")
    err = run_main(capsys, "--model", "r", "--manifest", str(manifest), "--out", str(tmp_path / "o.csv"))
    assert "column 'age': unknown label column" in err and "EXTRA_COLUMNS=" in err
    text, parsed, labels = pseudo_label.read_input(manifest, tmp_path, extra_columns=("age",))
    assert labels == ["Mass"] and text.loc[0, "age"] == "57" and np.isnan(parsed.loc[0, "Mass"])
    declared, _ = write_record(tmp_path, extra_columns=["age", "sex"])
    source = PseudoLabelledSource(str(declared))
    assert source.extra_columns == ()  # nothing is known before the record is read
    source.prepare()
    assert source.extra_columns == ("age", "sex")
    record_path(declared).write_text(
        json.dumps({**json.loads(record_path(declared).read_text()), "extra_columns": "age"})
    )
    tampered = PseudoLabelledSource(str(declared))
    tampered.prepare()
    with pytest.raises(PseudoLabelError, match="'extra_columns' must be a list of column names"):
        _ = tampered.extra_columns
