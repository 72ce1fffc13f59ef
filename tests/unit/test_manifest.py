"""Manifest validation: every broken input fails with its row and column named."""

import re

import numpy as np
import pandas as pd
import pytest

from training.data.findings import KNOWN_FINDINGS
from training.data.manifest import ManifestError, load_manifest


def _load(path, labels):
    return load_manifest(path, labels, KNOWN_FINDINGS)


def _edit(path, change):
    table = pd.read_csv(path, dtype=str, keep_default_na=False)
    table = change(table)
    table.to_csv(path, index=False)


def test_valid_manifest_loads_with_fingerprint_and_targets(make_manifest, task1_labels):
    path = make_manifest(n=30)
    manifest = _load(path, task1_labels)
    assert manifest.labels == tuple(task1_labels)
    assert len(manifest.fingerprint) == 12
    train = manifest.targets("train")
    assert train.shape == (10, 30)
    assert set(np.unique(train)) <= {0.0, 1.0}
    assert manifest.class_counts().sum() == (train == 1).sum()


def test_fingerprint_changes_with_content(make_manifest, task1_labels):
    path = make_manifest(n=30)
    before = _load(path, task1_labels).fingerprint
    _edit(path, lambda t: t.assign(**{"Hernia": t["Hernia"].where(t.index != 0, "1")}))
    after = _load(path, task1_labels).fingerprint
    assert before != after


def test_missing_image_names_line_and_path(make_manifest, task1_labels):
    path = make_manifest(n=12)
    (path.parent / "images" / "4.png").unlink()
    with pytest.raises(ManifestError, match=r"line 6, column 'path': image file not found: .*images/4\.png"):
        _load(path, task1_labels)


def test_unknown_label_column_suggests_the_known_name(make_manifest, task1_labels):
    path = make_manifest(n=12)
    _edit(path, lambda t: t.rename(columns={"Cardiomegaly": "Cardiomegally"}))
    with pytest.raises(ManifestError) as error:
        _load(path, task1_labels)
    message = str(error.value)
    assert "column 'Cardiomegally': unknown label column (did you mean 'Cardiomegaly'?)" in message
    assert "column 'Cardiomegaly': required by the task but absent" in message


def test_declared_extra_columns_are_accepted(make_manifest, task1_labels):
    path = make_manifest(n=12)
    _edit(path, lambda t: t.assign(age="60"))
    with pytest.raises(ManifestError, match="column 'age': unknown label column"):
        _load(path, task1_labels)
    manifest = load_manifest(path, task1_labels, KNOWN_FINDINGS, extra_columns=["age"])
    assert "age" in manifest.table


def test_duplicate_image_id_names_both_lines(make_manifest, task1_labels):
    path = make_manifest(n=12)
    _edit(path, lambda t: t.assign(image_id=t["image_id"].where(t.index != 7, "img2")))
    with pytest.raises(ManifestError, match=r"column 'image_id': 'img2' duplicated on lines \[4, 9\]"):
        _load(path, task1_labels)


def test_bad_label_value_and_split_are_reported_together(make_manifest, task1_labels):
    path = make_manifest(n=12)

    def corrupt(t):
        t.loc[3, "Nodule"] = "maybe"
        t.loc[5, "split"] = "training"
        return t

    _edit(path, corrupt)
    with pytest.raises(ManifestError) as error:
        _load(path, task1_labels)
    message = str(error.value)
    assert "2 problem(s)" in message
    assert "line 5, column 'Nodule': 'maybe' is not a manifest label: 1, 0 (or 1.0, 0.0) or an empty cell" in message
    assert "line 7, column 'split': 'training' is not one of" in message


def test_patient_in_two_splits_is_rejected(make_manifest, task1_labels):
    path = make_manifest(n=12)
    _edit(path, lambda t: t.assign(patient_id=t["patient_id"].where(t.index != 1, "p0")))
    with pytest.raises(ManifestError, match="patient 'p0' appears in several splits"):
        _load(path, task1_labels)


def test_empty_cell_means_not_labelled(make_manifest, task1_labels):
    path = make_manifest(n=12)
    _edit(path, lambda t: t.assign(Fracture=t["Fracture"].where(t.index != 0, "")))
    targets = _load(path, task1_labels).targets("train")
    column = task1_labels.index("Fracture")
    assert targets[0, column] == -1
    assert (targets[1:, column] >= 0).all()


@pytest.mark.parametrize("word", ["yes", "Yes ", "TRUE", "no", " 1", "-1", "nan"])
def test_labels_other_than_the_manifest_spellings_are_refused_by_line_and_column(make_manifest, task1_labels, word):
    """Issue 30 (12): a manifest holds 1, 0 (1.0, 0.0) or empty exactly as written; nothing else is given a meaning."""
    path = make_manifest(n=12)
    _edit(path, lambda t: t.assign(Nodule=t["Nodule"].where(t.index != 3, word)))
    with pytest.raises(ManifestError, match=rf"1 problem\(s\).*\n  line 5, column 'Nodule': {re.escape(repr(word))} "
                                            r"is not a manifest label"):  # fmt: skip
        _load(path, task1_labels)


def test_every_manifest_spelling_reads_as_documented(make_manifest, task1_labels):
    path = make_manifest(n=12)
    plain = _load(path, task1_labels).targets("train")
    _edit(path, lambda t: t.assign(**{c: t[c].map({"1": "1.0", "0": "0.0"}).where(t.index % 2 == 0, t[c])
                                      for c in task1_labels}))  # fmt: skip
    np.testing.assert_array_equal(_load(path, task1_labels).targets("train"), plain)


def test_ids_differing_only_by_surrounding_spaces_are_one_image(make_manifest, task1_labels):
    """Issue 30 (12): ``img2`` and ``img2 `` are stripped and compared as text: one id, refused as duplicated."""
    path = make_manifest(n=12)
    _edit(path, lambda t: t.assign(image_id=t["image_id"].where(t.index != 5, " img2 ")))
    with pytest.raises(ManifestError, match=re.escape("column 'image_id': 'img2' duplicated on lines [4, 7]")):
        _load(path, task1_labels)
    _edit(path, lambda t: t.assign(image_id=t["image_id"].where(t.index != 5, " img5\t")))
    assert _load(path, task1_labels).table.at[5, "image_id"] == "img5"


def test_header_only_manifest_is_refused(make_manifest, task1_labels):
    path = make_manifest(n=12)
    _edit(path, lambda t: t.iloc[:0])
    with pytest.raises(ManifestError, match=r"manifest\.csv: 1 problem.*\n  line 1: a header without rows"):
        _load(path, task1_labels)


def test_empty_file_is_named(tmp_path, task1_labels):
    path = tmp_path / "manifest.csv"
    path.write_text("")
    with pytest.raises(ManifestError, match=rf"^{path}: empty file"):
        _load(path, task1_labels)


def test_a_split_without_images_is_refused(make_manifest, task1_labels):
    path = make_manifest(n=12)
    _edit(path, lambda t: t[t["split"] != "val"])
    with pytest.raises(ManifestError, match=r"column 'split': no 'val' rows"):
        _load(path, task1_labels)
    assert len(load_manifest(path, task1_labels, KNOWN_FINDINGS, splits=("test",)).split("test")) == 4


@pytest.mark.parametrize("column", ["image_id", "patient_id"])
def test_scientific_notation_ids_are_refused_not_read_as_numbers(make_manifest, task1_labels, column):
    path = make_manifest(n=12)
    _edit(path, lambda t: t.assign(**{column: t[column].where(t.index != 3, "1e5")}))
    with pytest.raises(ManifestError, match=rf"line 5, column '{column}': '1e5' looks like a number"):
        _load(path, task1_labels)


def test_ids_stay_text(make_manifest, task1_labels):
    path = make_manifest(n=12)
    _edit(path, lambda t: t.assign(image_id=[f"{i:06d}" for i in range(len(t))]))
    assert _load(path, task1_labels).split("train")["image_id"].tolist() == ["000000", "000003", "000006", "000009"]


def test_data_check_and_training_share_the_validation(make_manifest, task1_labels):
    """Every manifest training refuses, make data-check refuses too, with the same problem lines."""
    from training.data.audit import check_dataset

    path = make_manifest(n=12)
    original = pd.read_csv(path, dtype=str, keep_default_na=False)
    breakers = {
        "unknown column": lambda t: t.rename(columns={"Cardiomegaly": "Cardiomegally"}),
        "header only": lambda t: t.iloc[:0],
        "scientific id": lambda t: t.assign(image_id=t["image_id"].where(t.index != 0, "1.5E+3")),
        "bad label": lambda t: t.assign(Hernia=t["Hernia"].where(t.index != 0, "maybe")),
        "missing split": lambda t: t[t["split"] != "test"],
    }
    for name, breaker in breakers.items():
        breaker(original.copy()).to_csv(path, index=False)
        with pytest.raises(ManifestError) as error:
            load_manifest(path, task1_labels, KNOWN_FINDINGS, check_files=False)
        trained = str(error.value).splitlines()[1:]
        report = check_dataset(path, path.parent)
        assert [line.strip() for line in trained if "required by the task" not in line] == report.errors, name
        assert report.errors, name


def test_a_file_that_is_not_utf8_is_named_with_its_line(make_manifest, task1_labels):
    path = make_manifest(n=12)
    lines = path.read_bytes().split(b"\n")
    lines[5] = lines[5].replace(b"centre_a", b"centre_\xe9")  # Latin-1 e-acute: the sixth line of the file
    path.write_bytes(b"\n".join(lines))
    with pytest.raises(ManifestError, match=rf"^{path}, line 6: not UTF-8 text \(invalid continuation byte"):
        _load(path, task1_labels)


def test_a_path_outside_the_data_root_is_that_problem_only_not_also_a_missing_image(make_manifest, task1_labels):
    path = make_manifest(n=12)
    _edit(path, lambda t: t.assign(path=t["path"].mask(t.index == 3, "../elsewhere.png")))
    with pytest.raises(ManifestError) as refused:
        load_manifest(path, task1_labels, KNOWN_FINDINGS, image_roots=[path.parent])
    assert "line 5, column 'path': '../elsewhere.png' leaves the data root" in str(refused.value)
    assert "not found" not in str(refused.value)
