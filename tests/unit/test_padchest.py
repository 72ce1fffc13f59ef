"""The ``padchest`` adapter on a hand-written table in PadChest's own layout: every count below is worked out by
hand from the rows in :data:`ROWS`."""

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
from training.data.adapters.padchest import PadChestSource, parse_labels
from training.data.adapters.padchest_hierarchy import ROLLUP, markdown_table
from training.data.check import check_dataset
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
    ("i8", "p7", "COSTAL", "Physician", "['fracture']"),  # rib series: kept out
    ("i9", "p8", "PA", "RNN_model", "['exclude']"),  # kept out by default
    ("i10", "p9", "PA", "RNN_model", "['suboptimal study', 'pneumoperitoneo']"),  # kept, flagged
    ("i11", "p9", "L", "Physician", "[1, 2]"),  # a list, but not of names: does not parse
]


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


def test_unparsed_rows_and_empty_names_are_counted_listed_and_kept_out(built):
    source, manifest = built
    summary = source.summary
    assert summary.rows == 12 and summary.kept == 7  # i0-i4, i7, i10
    assert summary.kept_out == {"Labels does not parse": 2, "no label name": 1, "Projection mapped to null": 1,
                                "labelled 'exclude'": 1}  # fmt: skip
    assert summary.empty_names == 1  # i7's second name (i6's only name makes it a row with no name)
    listing = pd.read_csv(summary.listing_path, dtype=str)
    assert listing[["line", "ImageID"]].values.tolist() == [["7", "i5"], ["8", "i6"], ["9", "i7"], ["13", "i11"]]
    assert listing.set_index("ImageID").at["i7", "reason"] == "empty name ignored"
    assert {"i5", "i6", "i11", "i8", "i9"}.isdisjoint(manifest.index)
    assert "line 7, ImageID 'i5': Labels does not parse" in source.check_sections["PadChest table"]


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
        "i3": ["Central Venous Catheter", "Support Devices"],
        "i4": ["Hydropneumothorax", "Pleural Effusion", "Pneumothorax"],  # COPD signs is not mapped
        "i7": ["Bulla"],
        "i10": ["Pneumoperitoneum"],
    }  # fmt: skip
    assert (manifest["Infarction"] == "").all()  # no PadChest name feeds it: not labelled, never negative
    assert (manifest[[c for c in CXRLT_FINDINGS if c != "Infarction"]] != "").all().all()


def test_projections_become_views_and_suboptimal_is_flagged(built):
    _, manifest = built
    assert manifest["view"].to_dict() == {"i0": "PA", "i1": "LATERAL", "i2": "PA", "i3": "AP Supine", "i4": "AP",
                                          "i7": "PA", "i10": "PA"}  # fmt: skip
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


@pytest.mark.parametrize(("method", "kept", "out"), [("physician", ["i0", "i1", "i4", "i7"], 4),
                                                     ("rnn", ["i2", "i3", "i10"], 4)])  # fmt: skip
def test_label_method_keeps_one_kind_of_labels(tmp_path, method, kept, out):
    source = configured(write_table(tmp_path / "padchest"), tmp_path, f"data.source.label_method={method}")
    manifest = pd.read_csv(source.prepare(), dtype=str)
    assert sorted(manifest["image_id"]) == sorted(kept)
    assert source.summary.kept_out[f"MethodLabel not kept by label_method={method}"] == out
    assert set(manifest["label_method"]) == {"Physician" if method == "physician" else "RNN_model"}


def test_exclude_is_kept_when_asked_and_suboptimal_dropped_when_asked(tmp_path):
    source = configured(write_table(tmp_path / "padchest"), tmp_path, "data.source.drop_excluded=false",
                        "data.source.drop_suboptimal=true")  # fmt: skip
    manifest = pd.read_csv(source.prepare(), dtype=str)
    assert "i9" in set(manifest["image_id"]) and "i10" not in set(manifest["image_id"])
    assert source.summary.kept_out["labelled 'suboptimal study'"] == 1


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
    done = subprocess.run([sys.executable, "-m", "training.data_check", "data=padchest", f"data.root={root}",
                           f"data.source.out_dir={tmp_path}/m", "+task=task1"], cwd=PROJECT_ROOT,
                          capture_output=True, text=True, timeout=180)  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "== PadChest table\n12 rows read, 7 in the manifest" in done.stdout
    assert "line 13, ImageID 'i11': Labels does not parse" in done.stdout
    assert "== files\nnot checked: table only" in done.stdout and "no errors" in done.stdout
