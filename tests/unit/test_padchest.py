"""The ``padchest`` adapter on a hand-written table in PadChest's own layout: every count below is worked out by
hand from the rows in :data:`ROWS`. The defaults follow the organisers' training table (every image kept, an
unlabelled one as an all-zero row); ``PADCHEST_READING`` gives PadChest's own (such images kept out)."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate

from tests.conftest import PROJECT_ROOT
from training.data.adapters.base import AdapterError
from training.data.adapters.padchest import PadChestSource, parse_labels, roll_up
from training.data.adapters.padchest_hierarchy import ROLLUP, markdown_table
from training.data.audit import check_dataset
from training.data.findings import CXRLT_FINDINGS
from training.data.splits import patient_split

TABLE = "PADCHEST_chest_x_ray_images_labels_160K_01.02.19.csv"
# ImageID, PatientID, Projection, MethodLabel, Labels (as the release writes them, leading spaces included)
ROWS = [
    ("i0", "p0", "PA", "Physician", "['normal']"),
    ("i1", "p0", "L", "Physician", "['normal']"),
    ("i2", "p1", "PA", "RNN_model", "['callus rib fracture', ' hiatal hernia']"),
    ("i3", "p2", "AP_horizontal", "RNN_model", "['central venous catheter via jugular vein', 'pacemaker']"),
    ("i4", "p3", "AP", "Physician", "['hydropneumothorax', 'COPD signs']"),
    ("i5", "p4", "PA", "RNN_model", "nan"),  # does not parse
    ("i6", "p5", "PA", "RNN_model", "['']"),  # parses, but no name
    ("i7", "p6", "PA", "Physician", "['bullas', '']"),  # one empty name beside a real one
    ("i8", "p7", "COSTAL", "Physician", "['fracture']"),  # rib series: kept, view COSTAL
    ("i9", "p8", "PA", "RNN_model", "['exclude']"),  # kept, as the organisers keep it
    ("i10", "p9", "PA", "RNN_model", "['suboptimal study', 'pneumoperitoneo']"),  # kept, flagged
    ("i11", "p9", "L", "Physician", "[1, 2]"),  # a list, but not of names: does not parse
]
#: The overrides that give PadChest's own reading: unlabelled rows, the rib series and `exclude` kept out.
PADCHEST_READING = ("data.source.unlabelled=drop", "data.source.views.COSTAL=null", "data.source.drop_excluded=true")
NOTHING = {c: 0 for c in CXRLT_FINDINGS if c != "Infarction"}


def write_table(folder, rows=ROWS):
    folder.mkdir(parents=True, exist_ok=True)
    table = pd.DataFrame(rows, columns=["ImageID", "PatientID", "Projection", "MethodLabel", "Labels"])
    table.insert(0, "", range(len(table)))  # the release's unnamed index column
    table.insert(2, "ImageDir", "0")
    table.insert(3, "StudyID", "s" + table["PatientID"])
    table["Report"] = "texto"
    table.to_csv(folder / TABLE, index=False)
    return folder


def configured(root, tmp_path, *overrides):
    """The source exactly as ``data=padchest`` builds it from the YAML."""
    with initialize_config_dir(config_dir=str(PROJECT_ROOT / "configs"), version_base="1.3"):
        cfg = compose("train", overrides=["data=padchest", f"data.root={root}", f"data.source.out_dir={tmp_path}/m",
                                          *overrides])  # fmt: skip
    return instantiate(cfg.data.source)


@pytest.fixture
def built(tmp_path):
    source = configured(write_table(tmp_path / "padchest"), tmp_path)
    manifest = pd.read_csv(source.prepare(), dtype=str, keep_default_na=False).set_index("image_id")
    return source, manifest


def test_unlabelled_rows_are_all_zero_rows_counted_and_listed(built):
    source, manifest = built
    summary = source.summary
    assert summary.rows == 12 and summary.kept == 12 and summary.kept_out == {}
    assert summary.unlabelled == {"Labels does not parse": 2, "no label name": 1}  # i5, i11; i6
    assert summary.empty_names == 1  # i7's second name (i6's only name makes it a row with no name)
    assert summary.excluded_kept == 1  # i9
    listing = pd.read_csv(summary.listing_path, dtype=str)
    assert listing[["line", "ImageID"]].values.tolist() == [["7", "i5"], ["8", "i6"], ["9", "i7"], ["13", "i11"]]
    assert listing.set_index("ImageID")["reason"].to_dict() == {
        "i5": "Labels does not parse: unlabelled, all-zero row", "i6": "no label name: unlabelled, all-zero row",
        "i7": "empty name ignored", "i11": "Labels does not parse: unlabelled, all-zero row"}  # fmt: skip
    for image in ("i5", "i6", "i9", "i11"):
        assert manifest.loc[image, list(NOTHING)].astype(int).to_dict() == NOTHING
        assert manifest.at[image, "Infarction"] == ""
    section = source.check_sections["PadChest table"]
    assert "line 7, ImageID 'i5': Labels does not parse: unlabelled, all-zero row" in section
    assert "  unlabelled, Labels does not parse: 2 (kept as all-zero rows)" in section


def test_padchest_reading_keeps_unlabelled_rows_the_rib_series_and_exclude_out(tmp_path):
    source = configured(write_table(tmp_path / "padchest"), tmp_path, *PADCHEST_READING)
    manifest = pd.read_csv(source.prepare(), dtype=str)
    summary = source.summary
    assert sorted(manifest["image_id"]) == sorted(["i0", "i1", "i2", "i3", "i4", "i7", "i10"])
    assert summary.kept == 7 and summary.unlabelled == {}
    assert summary.kept_out == {"Labels does not parse": 2, "no label name": 1, "Projection mapped to null": 1,
                                "labelled 'exclude'": 1}  # fmt: skip
    listing = pd.read_csv(summary.listing_path, dtype=str).set_index("ImageID")
    assert listing.at["i5", "reason"] == "Labels does not parse: unlabelled, kept out"
    with pytest.raises(AdapterError, match="data.source.unlabelled='keep'"):
        PadChestSource(str(tmp_path), unlabelled="keep")


def test_parse_labels_strips_names_and_separates_the_failures():
    parsed = parse_labels(pd.Series(["['a', ' b']", "nan", "['']", "[' c', '']", "{'a'}"]))
    assert parsed.names.tolist() == ["a", "b", "c"] and parsed.names.index.tolist() == [0, 0, 3]
    assert parsed.unparsed.tolist() == [1, 4] and parsed.no_names.tolist() == [2]
    assert parsed.empty_names.tolist() == [2, 3]


def test_children_roll_up_to_their_classes_and_normal_comes_only_from_normal(built):
    _, manifest = built
    positives = {i: sorted(c for c in CXRLT_FINDINGS if manifest.at[i, c] == "1") for i in manifest.index}
    assert positives == {
        "i0": ["Normal"], "i1": ["Normal"],
        "i2": ["Fracture", "Hernia"],
        "i3": ["Central Venous Catheter", "Support Devices"],  # the pacemaker is the support device
        "i4": ["Hydropneumothorax", "Pleural Effusion", "Pneumothorax"],  # COPD signs is not mapped
        "i5": [], "i6": [], "i9": [], "i11": [],
        "i7": ["Bulla"],
        "i8": ["Fracture"],
        "i10": ["Pneumoperitoneum"],
    }  # fmt: skip
    assert (manifest["Infarction"] == "").all()  # no PadChest name feeds it: not labelled, never negative
    assert (manifest[[c for c in CXRLT_FINDINGS if c != "Infarction"]] != "").all().all()


@pytest.mark.parametrize(("labels", "positives"), [
    ("['catheter']", []),  # a bare catheter is no support device
    ("['central venous catheter via subclavian vein']", ["Central Venous Catheter"]),  # nor is a CVC
    ("['reservoir central venous catheter', 'NSG tube']", ["Central Venous Catheter", "Support Devices"]),
    ("['chest drain tube']", []),
    ("['calcified granuloma']", ["Nodule"]),  # not Calcified Densities
    ("['granuloma']", ["Nodule"]),
    ("['pseudonodule', 'nipple shadow']", ["Nodule"]),
    ("['end on vessel']", ["Nodule"]),
    ("['air trapping']", ["Hyperinflated Lung"]),
    ("['flattened diaphragm']", ["Hyperinflated Lung"]),
    ("['volume loss']", ["Hypoexpansion"]),
    ("['hilar congestion']", ["Vascular Hilar Enlargement"]),
    ("['pulmonary artery enlargement']", ["Vascular Hilar Enlargement"]),
    ("['costophrenic angle blunting']", ["Pleural Effusion"]),
    ("['cavitation']", ["Alveolar Pattern"]),
    ("['calcified pleural thickening']", ["Pleural Thickening"]),  # not Calcified Densities
    ("['calcified pleural plaques', 'heart valve calcified', 'calcified fibroadenoma']", []),
    ("['calcified densities']", ["Calcified Densities"]),
    ("['pulmonary mass']", []),
    ("['mediastinal mass']", ["Mass"]),
    ("['normal', ' cardiomegaly']", ["Cardiomegaly", "Normal"]),  # Normal exactly when `normal` is named
    ("['COPD signs', 'unchanged']", []),  # nothing the classes contain: all zero, and not Normal
])  # fmt: skip
def test_roll_up_reads_each_name_as_the_organisers_table_does(labels, positives):
    column = pd.Series([labels])
    parsed = parse_labels(column)
    rolled = roll_up(parsed.names, column.index).iloc[0]
    assert sorted(c for c in CXRLT_FINDINGS if rolled[c] == 1) == positives
    assert np.isnan(rolled["Infarction"])  # no PadChest name feeds it: not labelled, never negative
    assert ((rolled.drop("Infarction") == 0) | (rolled.drop("Infarction") == 1)).all()


def test_every_projection_is_kept_as_a_view(tmp_path):
    rows = [*ROWS, ("i12", "p10", "EXCLUDE", "RNN_model", "['normal']"), ("i13", "p11", "UNK", "RNN_model", "['']")]
    source = configured(write_table(tmp_path / "padchest", rows), tmp_path)
    manifest = pd.read_csv(source.prepare(), dtype=str, keep_default_na=False).set_index("image_id")
    assert manifest["view"].to_dict() == {"i0": "PA", "i1": "LATERAL", "i2": "PA", "i3": "AP Supine", "i4": "AP",
                                          "i5": "PA", "i6": "PA", "i7": "PA", "i8": "COSTAL", "i9": "PA", "i10": "PA",
                                          "i11": "LATERAL", "i12": "", "i13": ""}  # fmt: skip
    assert manifest.at["i8", "projection"] == "COSTAL" and manifest.at["i12", "projection"] == "EXCLUDE"


def test_suboptimal_is_flagged_and_paths_follow_the_numbered_folders(built):
    _, manifest = built
    assert manifest.index[manifest["suboptimal"] == "1"].tolist() == ["i10"]
    assert manifest.at["i3", "path"] == "0/i3" and manifest.at["i3", "study_id"] == "sp2"


def test_splits_are_the_patient_hash_split_whatever_the_row_order(tmp_path):
    rows = [(f"i{k}", f"p{k // 3}", "PA", "Physician", "['normal']") for k in range(60)]
    first = configured(write_table(tmp_path / "a", rows), tmp_path / "ma")
    second = configured(write_table(tmp_path / "b", rows[::-1]), tmp_path / "mb")
    one, two = (pd.read_csv(s.prepare(), dtype=str).set_index("image_id") for s in (first, second))
    assert (one.groupby("patient_id")["split"].nunique() == 1).all()
    assert one["split"].to_dict() == two["split"].to_dict()
    expected = patient_split(one["patient_id"].to_numpy(), {"train": 0.7, "val": 0.1, "test": 0.2}, seed=0)
    assert one["split"].tolist() == expected.tolist()


@pytest.mark.parametrize(("method", "kept", "out"), [("physician", ["i0", "i1", "i4", "i7", "i8", "i11"], 6),
                                                     ("rnn", ["i2", "i3", "i5", "i6", "i9", "i10"], 6)])  # fmt: skip
def test_label_method_keeps_one_kind_of_labels(tmp_path, method, kept, out):
    source = configured(write_table(tmp_path / "padchest"), tmp_path, f"data.source.label_method={method}")
    manifest = pd.read_csv(source.prepare(), dtype=str)
    assert sorted(manifest["image_id"]) == sorted(kept)
    assert source.summary.kept_out[f"MethodLabel not kept by label_method={method}"] == out
    assert set(manifest["label_method"]) == {"Physician" if method == "physician" else "RNN_model"}


def test_exclude_is_dropped_when_asked_and_suboptimal_dropped_when_asked(tmp_path):
    source = configured(write_table(tmp_path / "padchest"), tmp_path, "data.source.drop_excluded=true",
                        "data.source.drop_suboptimal=true")  # fmt: skip
    manifest = pd.read_csv(source.prepare(), dtype=str)
    assert {"i9", "i10"}.isdisjoint(manifest["image_id"]) and len(manifest) == 10
    assert source.summary.kept_out == {"labelled 'exclude'": 1, "labelled 'suboptimal study'": 1}
    assert source.summary.excluded_kept == 0


def write_removal(path, ids):
    """A Removal.csv in the organisers' layout (their three id columns, PatientID spreadsheet-rounded)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = "".join(f"{i},20150101,1.23E+38\n" for i in ids)
    path.write_text("ImageID,StudyDate_DICOM,PatientID\n" + rows)
    return path


@pytest.mark.parametrize("given", ["folder", "file"])
def test_removal_drops_exactly_the_listed_images_before_anything_else(tmp_path, given):
    removal = write_removal(tmp_path / "release" / "Removal.csv", ["i2", "i5", "i10", "not-in-padchest"])
    where = removal.parent if given == "folder" else removal
    source = configured(write_table(tmp_path / "padchest"), tmp_path, f"data.source.removal={where}")
    manifest = pd.read_csv(source.prepare(), dtype=str)
    summary = source.summary
    assert sorted(manifest["image_id"]) == sorted(["i0", "i1", "i3", "i4", "i6", "i7", "i8", "i9", "i11"])
    assert summary.kept_out == {"in Removal.csv": 3} and summary.removal_listed == 4
    assert summary.rows == 12 and summary.kept == 9
    assert summary.unlabelled == {"Labels does not parse": 1, "no label name": 1}  # i5 went with the removal
    assert "i5" not in set(pd.read_csv(summary.listing_path, dtype=str)["ImageID"])
    assert source.run_tags == {"padchest.removal": str(removal), "padchest.removed_in_removal": "3"}
    assert "  kept out, in Removal.csv: 3" in source.check_sections["PadChest table"]


def test_a_missing_removal_file_is_named_and_none_given_is_said(tmp_path, built):
    source = configured(write_table(tmp_path / "padchest"), tmp_path, f"data.source.removal={tmp_path}/nowhere")
    with pytest.raises(AdapterError, match=f"data.source.removal={tmp_path}/nowhere: no Removal.csv there"):
        source.prepare()
    default, _ = built
    assert default.run_tags == {"padchest.removal": "not given"}
    assert "Removal.csv: not given (data.source.removal)" in default.check_sections["PadChest table"]


def test_an_unknown_name_or_projection_is_refused_with_its_line(tmp_path):
    rows = [*ROWS[:2], ("x", "p", "OBLIQUE", "Physician", "['normal', 'dragon sign']")]
    source = configured(write_table(tmp_path / "padchest", rows), tmp_path)
    with pytest.raises(AdapterError) as error:
        source.prepare()
    assert "line 4, column 'Labels': 'dragon sign' is not in PadChest's roll-up table" in str(error.value)
    assert "line 4, column 'Projection': 'OBLIQUE' is not in data.source.views" in str(error.value)
    with pytest.raises(AdapterError, match="label_method='doctor'"):
        PadChestSource(str(tmp_path), label_method="doctor")


def test_data_check_counts_a_table_only_source_without_opening_images(built, tmp_path):
    source, manifest = built
    assert source.table_only
    report = check_dataset(source.prepare(), source.root, list(source.extra_columns),
                           files_note=source.table_only_note)  # fmt: skip
    assert report.errors == [] and report.sections["files"].startswith("not checked: table only")
    counts = report.sections["positives per class"]
    total = {line.split()[0]: line.split() for line in counts.splitlines()}
    assert total["Normal"][-3] == "2" and total["Bulla"][-3] == "1"  # total column, before train % and group


def test_every_class_is_fed_but_infarction_and_docs_show_the_table():
    fed = {label for labels in ROLLUP.values() for label in labels}
    assert set(CXRLT_FINDINGS) - fed == {"Infarction"} and fed <= set(CXRLT_FINDINGS)
    assert markdown_table(CXRLT_FINDINGS) in (PROJECT_ROOT / "docs" / "data.md").read_text()
    assert np.isin(["hiatal hernia", "bullas", "pneumoperitoneo"], list(ROLLUP)).all()


def test_make_data_check_on_the_table_alone_prints_the_report_and_passes(tmp_path):
    root = write_table(tmp_path / "padchest")
    removal = write_removal(tmp_path / "release" / "Removal.csv", ["i9"])
    done = subprocess.run([sys.executable, "-m", "training.data_check", "data=padchest", f"data.root={root}",
                           f"data.source.out_dir={tmp_path}/m", f"data.source.removal={removal.parent}",
                           "+task=task1"], cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=180)  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "== PadChest table\n12 rows read, 11 in the manifest\n" in done.stdout
    assert f"  Removal.csv: 1 ImageIDs listed ({removal})\n  kept out, in Removal.csv: 1\n" in done.stdout
    assert "line 13, ImageID 'i11': Labels does not parse: unlabelled, all-zero row" in done.stdout
    assert "== files\nnot checked: table only" in done.stdout and "no errors" in done.stdout
