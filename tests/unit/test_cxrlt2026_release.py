"""``data=cxrlt2026`` on a folder shaped exactly as the organisers ship the release (tests/cxrlt2026_release.py):
their file names and headers, Removal.csv, the empty-header test lists, rounded PatientIDs, PadChest's true ones."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate

from evaluation.organiser_names import TASK1_COLUMNS, TASK2_COLUMNS
from tests.conftest import PROJECT_ROOT, shared_data
from tests.cxrlt2026_release import DEV_LABELS, NIH_FINDINGS, TRAINING_HEADER, write_nih_external, write_release
from training.data.adapters.base import AdapterError
from training.data.adapters.cxrlt2026 import CXRLT2026Source
from training.data.adapters.cxrlt2026_files import REMOVAL, TASK2_CLASSES, TEST_LISTS, TRAINING_TABLE, class_list
from training.data.adapters.nih_external import STAND_IN, NIHExternal
from training.data.audit import check_dataset
from training.data.findings import CXRLT_FINDINGS, TASK1_LABELS, TASK2_LABELS
from training.data.manifest import load_manifest


def configured_source(root: Path, tmp_path: Path, *overrides: str):
    """The source exactly as ``data=cxrlt2026`` builds it from the YAML."""
    with initialize_config_dir(config_dir=str(PROJECT_ROOT / "configs"), version_base="1.3"):
        cfg = compose("train", overrides=["data=cxrlt2026", f"data.root={root}", f"data.source.out_dir={tmp_path}/m",
                                          *overrides])  # fmt: skip
    return instantiate(cfg.data.source)


def manifest_of(source) -> pd.DataFrame:
    return pd.read_csv(source.prepare(), dtype=str, keep_default_na=False)


@pytest.fixture(scope="module")
def release(tmp_path_factory):
    return write_release(tmp_path_factory.mktemp("cxrlt") / "release")


def test_the_fixture_writes_the_organisers_exact_headers(release):
    assert (release.root / TRAINING_TABLE).read_text().split("\n")[0] == TRAINING_HEADER
    assert TRAINING_HEADER.startswith("ImageID,StudyDate_DICOM,PatientID,Normal,aortic elongation,cardiomegaly,")
    assert TRAINING_HEADER.endswith(",pneumoperitoneo,vascular hilar enlargement,vertebral degenerative changes,"
                                    "hyperinflated lung,interstitial pattern,central venous catheter,hypoexpansion,"
                                    "bronchiectasis,hemidiaphragm elevation,sternotomy,calcified densities")  # fmt: skip
    task1 = (release.root / TEST_LISTS["task1"]).read_text()
    assert task1.split("\n")[0] == "ImageID,StudyDate_DICOM,PatientID" + "," * 30
    task2 = (release.root / TEST_LISTS["task2"]).read_bytes()
    assert not task2.endswith(b"\n") and task2.split(b"\n")[0] == b"ImageID,StudyDate_DICOM,PatientID"
    assert (release.root / TASK2_CLASSES).read_text().split("\n")[:2] == ["Scoliosis\t", "Osteopenia\t"]
    assert class_list(release.root / TASK2_CLASSES) == ["Scoliosis", "Osteopenia", "Bulla", "Infarction",
                                                          "Adenopathy", "goiter"]  # fmt: skip
    assert release.training["PatientID"].str.fullmatch(r"\d\.\d\dE\+\d\d").all()


def test_the_release_becomes_a_manifest_with_no_label_map(release, tmp_path):
    source = configured_source(release.root, tmp_path, f"data.source.eval_labels=[{','.join(DEV_LABELS.values())}]")
    table = manifest_of(source)
    kept = set(release.training["ImageID"]) - set(release.leaked)
    assert set(table.loc[table["split"].isin(["train", "val"]), "image_id"]) == kept
    evaluation = release.evaluation["task1"] + release.evaluation["task2"]
    assert sorted(table.loc[table["split"] == "test", "image_id"]) == sorted(evaluation)
    # The organisers' 0/1 cells arrive under the paper's names, pneumoperitoneo included, value for value.
    training = release.training.set_index("ImageID")
    rows = table.set_index("image_id").loc[sorted(kept)]
    for paper, column in TASK1_COLUMNS.items():
        assert rows[paper].tolist() == training.loc[sorted(kept), column].tolist(), paper
    # Task 2's six are labelled on Task 2's evaluation images only; never on training rows.
    dev2 = pd.read_csv(release.root / DEV_LABELS["task2"], dtype=str).set_index("ImageID")
    task2 = table.set_index("image_id").loc[release.evaluation["task2"]]
    for paper, column in TASK2_COLUMNS.items():
        assert task2[paper].tolist() == dev2.loc[release.evaluation["task2"], column].tolist()
    assert (table.loc[table["split"] != "test", list(TASK2_LABELS)] == "").all().all()
    # Images found by ImageID in PadChest's numbered folders.
    assert all((release.root / p).is_file() for p in table["path"]) and table["path"].str.contains("/").all()
    assert len(load_manifest(source.prepare(), list(TASK1_LABELS), CXRLT_FINDINGS, root=release.root).table) == len(
        table
    )


def test_removal_and_the_evaluation_lists_never_reach_training_and_are_counted(release, tmp_path):
    source = configured_source(release.root, tmp_path)
    table = manifest_of(source)
    removal = set(pd.read_csv(release.root / REMOVAL, dtype=str)["ImageID"])
    training = table[table["split"].isin(["train", "val"])]
    assert not set(training["image_id"]) & removal
    assert not set(training["image_id"]) & set(release.evaluation["task1"] + release.evaluation["task2"])
    assert source.counts["removed_from_training"] == len(release.leaked) == 2
    assert source.counts["removal_listed"] == len(removal)
    assert source.run_tags["cxrlt.release.removed_from_training"] == "2"
    section = source.check_sections["CXR-LT 2026 release"]
    assert all(f"removed (in Removal.csv): {i}" in section for i in release.leaked)
    # Without evaluation labels the lists' images are unlabelled test rows and an internal test is drawn.
    test = table[table["split"] == "test"]
    listed = test["image_id"].isin(release.evaluation["task1"] + release.evaluation["task2"])
    assert (test.loc[listed, list(TASK1_LABELS)] == "").all().all()
    assert (~listed).sum() > 0 and (test.loc[~listed, list(TASK1_LABELS)] != "").all().all()


def test_patients_rounded_or_recovered_and_the_split_disjoint_under_the_true_ids(release, tmp_path):
    lossy = configured_source(release.root, tmp_path / "a")
    lossy_table = manifest_of(lossy)
    recovered = configured_source(release.root, tmp_path / "b", f"data.padchest_table={release.padchest_table.parent}")
    table = manifest_of(recovered)
    kept = table[table["split"] != "test"]
    assert kept["patient_id"].tolist() == kept["image_id"].map(release.true_patients).tolist()
    true = kept["image_id"].map(release.true_patients)
    assert true.groupby(true).apply(lambda p: kept.loc[p.index, "split"].nunique()).max() == 1
    lossy_kept = lossy_table[lossy_table["split"] != "test"]
    assert lossy_kept["patient_id"].str.startswith("approx:").all()
    assert lossy.counts["distinct_patients"] < recovered.counts["distinct_patients"]
    assert recovered.counts["rounded_patient_values"] == 0 and lossy.counts["patient_ids"].endswith("(lossy)")
    # Over-grouping never leaks: every rounded group lies in one split, so its true patients do too.
    lossy_true = lossy_kept["image_id"].map(release.true_patients)
    assert lossy_kept.groupby(lossy_true)["split"].nunique().max() == 1


def test_the_validation_split_is_seeded_and_about_a_tenth_of_the_patients(release, tmp_path):
    one = manifest_of(configured_source(release.root, tmp_path / "a", f"data.padchest_table={release.padchest_table}"))
    two = manifest_of(configured_source(release.root, tmp_path / "b", f"data.padchest_table={release.padchest_table}"))
    assert one["split"].tolist() == two["split"].tolist()
    patients = one[one["split"] != "test"].groupby("split")["patient_id"].nunique()
    assert 0.05 <= patients["val"] / patients.sum() <= 0.2


def test_flat_and_numbered_folders_give_the_same_manifest_but_its_paths(tmp_path):
    flat = manifest_of(configured_source(write_release(tmp_path / "flat", layout="flat", n_train=40).root,
                                         tmp_path / "a"))  # fmt: skip
    nested = manifest_of(configured_source(write_release(tmp_path / "nested", n_train=40).root, tmp_path / "b"))
    assert flat.drop(columns="path").equals(nested.drop(columns="path"))
    assert (flat["path"] == flat["image_id"]).all() and not (nested["path"] == nested["image_id"]).any()


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda h: h.replace(",pneumoperitoneo,", ",pneumoperitonitis,"),
         r"CXRLT_2026_training.csv, column 'pneumoperitonitis': unknown class name"),
        (lambda h: h.replace(",sternotomy,", ",Kyphosis,"), r"column 'Kyphosis': a second column for 'Kyphosis'"),
        (lambda h: h.replace("ImageID,StudyDate_DICOM,PatientID", "ImageId,Date,Patient"),
         r"CXRLT_2026_training.csv, line 1: expected the release's id columns"),
    ],
)  # fmt: skip
def test_a_wrong_training_header_is_one_error_naming_the_column(tmp_path, edit, message):
    release = write_release(tmp_path / "release", n_train=20, n_task1=4, n_task2=2)
    path = release.root / TRAINING_TABLE
    head, rest = path.read_text().split("\n", 1)
    path.write_text(edit(head) + "\n" + rest)
    with pytest.raises(AdapterError, match=message):
        CXRLT2026Source(str(release.root), out_dir=str(tmp_path / "m")).prepare()


def test_a_missing_class_column_is_named_in_the_organisers_spelling(tmp_path):
    release = write_release(tmp_path / "release", n_train=20, n_task1=4, n_task2=2)
    table = pd.read_csv(release.root / TRAINING_TABLE, dtype=str).drop(columns="pneumoperitoneo")
    table.to_csv(release.root / TRAINING_TABLE, index=False)
    with pytest.raises(AdapterError, match=r"line 1: no column 'pneumoperitoneo'"):
        CXRLT2026Source(str(release.root), out_dir=str(tmp_path / "m")).prepare()


def test_data_check_lists_the_release_section_and_passes(release, tmp_path):
    source = configured_source(release.root, tmp_path, f"data.padchest_table={release.padchest_table}")
    report = check_dataset(source.prepare(), source.root, labels=list(TASK1_LABELS))
    assert not report.errors
    assert "removed from training: 2" in source.check_sections["CXR-LT 2026 release"]


@pytest.mark.realdata
def test_real_padchest_ids_recover_their_patients_and_split_them_disjointly(tmp_path):
    """A training table in the release's layout over real PadChest ImageIDs, PatientID rounded as the organisers'
    spreadsheet rounds it (``%.2E``); with PadChest's table the split is patient-disjoint by PadChest's own ids."""
    padchest = shared_data("padchest-labels")
    table = next(padchest.glob("PADCHEST_*.csv.gz"))
    real = pd.read_csv(table, dtype=str, keep_default_na=False, usecols=["ImageID", "PatientID", "StudyDate_DICOM"])
    sample = real.sample(n=3000, random_state=0).sort_values("ImageID")
    root = tmp_path / "release"
    root.mkdir()
    rounded = sample["PatientID"].astype(float).map(lambda v: f"{v:.2E}")
    columns = {"ImageID": sample["ImageID"], "StudyDate_DICOM": sample["StudyDate_DICOM"], "PatientID": rounded,
               **{column: [i % 2 for i in range(len(sample))] for column in TASK1_COLUMNS.values()}}  # fmt: skip
    pd.DataFrame(columns).to_csv(root / TRAINING_TABLE, index=False)
    source = CXRLT2026Source(str(root), padchest_table=str(padchest), out_dir=str(tmp_path / "m"))
    manifest = manifest_of(source)
    truth = dict(zip(sample["ImageID"], sample["PatientID"], strict=True))
    assert manifest["patient_id"].tolist() == manifest["image_id"].map(truth).tolist()
    assert manifest.groupby("patient_id")["split"].nunique().max() == 1
    assert source.counts["distinct_patients"] == sample["PatientID"].nunique() > rounded.nunique()


def test_external_test_from_an_nih_folder_and_the_organisers_list(tmp_path):
    release = write_release(tmp_path / "release", n_train=20, n_task1=4, n_task2=4)
    external = write_nih_external(tmp_path, np.random.default_rng(0), 6, 16)
    source = configured_source(release.root, tmp_path, "data.source.external={" + ",".join(f"{k}:{v}" for k, v in
                                                                                     external.items()) + "}")  # fmt: skip
    table = manifest_of(source)
    nih = table[table["source"] == "nih"].reset_index(drop=True)
    listed = pd.read_csv(external["list"], dtype=str)
    assert nih["image_id"].tolist() == listed["ImageID"].tolist()  # the list defines the set: 6 of NIH's 8
    assert (nih["split"] == "test").all() and all(Path(p).is_absolute() and Path(p).is_file() for p in nih["path"])
    np.testing.assert_array_equal(nih["Goiter"], listed["goiter"])  # the organisers' labels
    # Seen classes the list lacks come from NIH's own labels; the rest stay not labelled; patient ids are NIH's.
    assert nih["Pleural Effusion"].tolist() == ["1" if "Effusion" in NIH_FINDINGS[i % 5] else "0" for i in range(6)]
    assert (nih["Alveolar Pattern"] == "").all() and nih["patient_id"].tolist()[:4] == ["1000", "1000", "1001", "1001"]
    listed.loc[0, "ImageID"] = release.training["ImageID"].iloc[0]  # an image of the release
    listed.to_csv(external["list"], index=False)
    with pytest.raises(AdapterError, match="is also in the release"):
        source.prepare()


@pytest.mark.realdata
def test_nih_stand_in_from_nih1000_labels_the_seen_findings_nih_has(tmp_path):
    nih = shared_data("nih1000")
    rows = NIHExternal(root=str(nih), labels="Data_Entry_2017_v2020.csv").build()
    assert len(rows) == 1000 and (rows["split"] == "test").all() and (rows["source"] == "nih").all()
    # The README's counts: Effusion 170, Cardiomegaly 83, Emphysema 37, Hernia 9; 278 patients.
    assert {c: int(rows[c].sum()) for c in ("Pleural Effusion", "Cardiomegaly", "Emphysema", "Hernia")} == {
        "Pleural Effusion": 170, "Cardiomegaly": 83, "Emphysema": 37, "Hernia": 9}  # fmt: skip
    assert set(STAND_IN.values()) <= set(rows.columns) and not set(TASK2_LABELS) & set(rows.columns)
    assert all(Path(p).is_file() for p in rows["path"])
