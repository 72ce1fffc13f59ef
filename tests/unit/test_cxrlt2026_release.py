"""The ``cxrlt2026`` data config on the release as distributed: its split information, no patient ids, and Task 2's
NIH external test (from the release's own split, from an NIH folder plus the organisers' list, or the stand-in)."""

from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np
import pandas as pd
import pytest
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate

from tests.conftest import PROJECT_ROOT, shared_data
from tests.cxrlt2026_release import NIH_FINDINGS, write_release
from training.data.adapters.base import AdapterError
from training.data.adapters.nih_external import STAND_IN, NIHExternal
from training.data.adapters.table import CXRLT2026Source
from training.data.check import check_dataset
from training.data.findings import TASK1_LABELS, TASK2_LABELS
from training.data.images import read_grayscale
from training.data.manifest import load_manifest


def configured_source(release, tmp_path, *overrides):
    """The source exactly as ``data=cxrlt2026`` builds it from the YAML."""
    with initialize_config_dir(config_dir=str(PROJECT_ROOT / "configs"), version_base="1.3"):
        cfg = compose("train", overrides=[*release.hydra_overrides(), f"data.source.out_dir={tmp_path}/m", *overrides])
    return instantiate(cfg.data.source), cfg


def manifest_of(source):
    return pd.read_csv(source.prepare(), dtype=str, keep_default_na=False)


@pytest.mark.parametrize("layout", ["column", "files"])
def test_the_release_splits_become_train_val_test_with_padchest_and_nih_sources(tmp_path, layout, caplog):
    release = write_release(tmp_path / "release", layout=layout)
    source, cfg = configured_source(release, tmp_path)
    with caplog.at_level("WARNING"):
        table = manifest_of(source)
    counts = table.groupby(["split", "source"]).size().to_dict()
    assert counts == {("train", "padchest"): 96, ("val", "padchest"): 32, ("test", "padchest"): 24, ("test", "nih"): 16}
    # No patient ids in the release: none invented, none checkable, said once.
    assert (table["patient_id"] == table["image_id"]).all() and source.patient_ids is False
    assert sum("no patient column" in r.getMessage() for r in caplog.records) == 1
    # Organisers' spelling read as the paper's; Task 2's classes labelled on development and test rows only.
    assert set(TASK1_LABELS + TASK2_LABELS) <= set(table.columns) and source.labels[: len(TASK1_LABELS)] == TASK1_LABELS
    assert (table.loc[table["split"] == "train", list(TASK2_LABELS)] == "").all().all()
    assert table.loc[table["split"] != "train", list(TASK2_LABELS)].isin(["0", "1"]).all().all()
    assert cfg.data.internal_source == "padchest"
    # The images are the release's 16-bit PNG (NIH's 8-bit), and they read as the platform's grayscale.
    path = release.root / table.loc[table["split"] == "train", "path"].iloc[0]
    assert read_grayscale(path, 32).shape == (32, 32)
    assert cv2.imread(str(path), cv2.IMREAD_UNCHANGED).dtype == np.uint16


def test_one_table_and_per_split_tables_give_the_same_manifest(tmp_path):
    one = manifest_of(configured_source(write_release(tmp_path / "a", layout="column"), tmp_path / "ma")[0])
    files = manifest_of(configured_source(write_release(tmp_path / "b", layout="files"), tmp_path / "mb")[0])
    key = ["image_id"]
    pd.testing.assert_frame_equal(one.sort_values(key).reset_index(drop=True),
                                  files[one.columns].sort_values(key).reset_index(drop=True))  # fmt: skip


def test_data_check_says_patient_disjointness_is_not_checkable(tmp_path):
    release = write_release(tmp_path / "release", nih=None)
    source, _ = configured_source(release, tmp_path)
    report = check_dataset(source.prepare(), source.root, [], patient_ids=source.patient_ids)
    assert report.sections["patients shared between splits"].startswith("not checkable")


def test_a_configured_patient_column_is_still_used(tmp_path):
    release = write_release(tmp_path / "release", nih=None)
    table = pd.read_csv(release.root / "labels.csv", dtype=str)
    table.insert(1, "PatientID", [f"p{i // 3}" for i in range(len(table))])
    table.to_csv(release.root / "labels.csv", index=False)
    source, _ = configured_source(release, tmp_path, "data.source.patient_column=PatientID")
    manifest = manifest_of(source)
    assert source.patient_ids and manifest["patient_id"].iloc[4] == "p1"


def test_an_unknown_split_value_is_named_with_its_line_and_the_known_names(tmp_path):
    release = write_release(tmp_path / "release", nih=None)
    table = pd.read_csv(release.root / "labels.csv", dtype=str)
    table.loc[5, "split"] = "holdout"
    table.to_csv(release.root / "labels.csv", index=False)
    source, _ = configured_source(release, tmp_path)
    with pytest.raises(AdapterError, match=r"line 7, column 'split': unknown split 'holdout' \(use one of .*dev"):
        source.prepare()


def test_split_spellings_are_matched_whatever_their_case_spaces_or_hyphens(tmp_path):
    release = write_release(tmp_path / "release")
    table = pd.read_csv(release.root / "labels.csv", dtype=str)
    table["split"] = table["split"].map({"train": " TRAIN", "development": "Development", "test": "Internal Test",
                                         "external_test": "external-test"})  # fmt: skip
    table.to_csv(release.root / "labels.csv", index=False)
    source, _ = configured_source(release, tmp_path)
    counts = manifest_of(source).groupby(["split", "source"]).size().to_dict()
    assert counts == {("train", "padchest"): 96, ("val", "padchest"): 32, ("test", "padchest"): 24, ("test", "nih"): 16}


def test_external_test_from_an_nih_folder_and_the_organisers_list(tmp_path):
    release = write_release(tmp_path / "release", layout="files", nih="folder")
    source, _ = configured_source(release, tmp_path)
    table = manifest_of(source)
    nih = table[table["source"] == "nih"].reset_index(drop=True)
    listed = pd.read_csv(release.external["list"], dtype=str)
    assert nih["image_id"].tolist() == listed["ImageID"].tolist()  # the list defines the set: 16 of NIH's 18
    assert (nih["split"] == "test").all() and all(Path(p).is_absolute() and Path(p).is_file() for p in nih["path"])
    np.testing.assert_array_equal(nih["Scoliosis"], listed["scoliosis"])  # the organisers' labels
    # Seen classes the list lacks come from NIH's own labels; the rest stay not labelled; patient ids are NIH's.
    assert nih["Pleural Effusion"].tolist() == ["1" if "Effusion" in NIH_FINDINGS[i % 5] else "0" for i in range(16)]
    assert (nih["Alveolar Pattern"] == "").all() and nih["patient_id"].tolist()[:4] == ["1000", "1000", "1001", "1001"]
    manifest = load_manifest(source.prepare(), list(TASK2_LABELS), source.vocabulary, root=source.root)  # files exist
    assert len(manifest.split("test")) == 24 + 16


def test_external_builder_errors_name_the_file_and_what_to_set(tmp_path):
    release = write_release(tmp_path / "release", nih="folder")
    with pytest.raises(AdapterError, match="give the organisers' list"):
        NIHExternal(root=release.external["root"]).build()
    with pytest.raises(AdapterError, match=r"missing the image id column 'Image'"):
        NIHExternal(root=release.external["root"], list=release.external["list"], id_column="Image").build()
    with pytest.raises(AdapterError, match="NIH folder not found"):
        NIHExternal(root=str(tmp_path / "nowhere"), list="x.csv").build()
    listed = pd.read_csv(release.external["list"], dtype=str)
    listed.loc[2, "goiter"] = "maybe"
    listed.to_csv(release.external["list"], index=False)
    with pytest.raises(AdapterError, match=r"nih_external_test\.csv, line 4, column 'goiter': 'maybe'"):
        NIHExternal(root=release.external["root"], list=release.external["list"]).build()


def test_an_external_image_already_in_the_release_is_refused(tmp_path):
    release = write_release(tmp_path / "release", nih="folder")
    listed = pd.read_csv(release.external["list"], dtype=str)
    listed.loc[0, "ImageID"] = "pctra00003"  # a release image id
    listed.to_csv(release.external["list"], index=False)
    source = CXRLT2026Source(str(release.root), table="labels.csv", split_column="split", image_dir="images",
                             image_suffix=".png", external=release.external, out_dir=str(tmp_path / "m"))  # fmt: skip
    with pytest.raises(AdapterError, match="'pctra00003' is also in the release"):
        source.prepare()


@pytest.mark.realdata
def test_nih_stand_in_from_nih1000_labels_the_seen_findings_nih_has(tmp_path):
    nih = shared_data("nih1000")
    rows = NIHExternal(root=str(nih), labels="Data_Entry_2017_v2020.csv").build()
    assert len(rows) == 1000 and (rows["split"] == "test").all() and (rows["source"] == "nih").all()
    # The README's counts: Effusion 170, Cardiomegaly 83, Emphysema 37, Hernia 9; 278 patients.
    assert {c: int(rows[c].sum()) for c in ("Pleural Effusion", "Cardiomegaly", "Emphysema", "Hernia")} == {
        "Pleural Effusion": 170, "Cardiomegaly": 83, "Emphysema": 37, "Hernia": 9}  # fmt: skip
    assert rows["patient_id"].nunique() <= 278 and rows["patient_id"].iloc[0] == "1"
    assert set(STAND_IN.values()) <= set(rows.columns) and not set(TASK2_LABELS) & set(rows.columns)
    assert all(Path(p).is_file() for p in rows["path"])
    # Through the adapter: the stand-in is the test's NIH part, the unseen classes not labelled there.
    release = write_release(tmp_path / "release", nih=None)
    source, _ = configured_source(
        release, tmp_path, f"data.source.external={{root:{nih},labels:Data_Entry_2017_v2020.csv}}"
    )
    table = manifest_of(source)
    external = table[table["source"] == "nih"]
    assert len(external) == 1000 and (external[list(TASK2_LABELS)] == "").all().all()
    assert (table.loc[table["source"] == "padchest", "Scoliosis"] != "").sum() == 32 + 24
