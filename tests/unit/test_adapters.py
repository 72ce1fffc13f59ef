"""Adapters on tiny release-shaped folders: layouts, ids, class names and splits, and every documented error."""

from __future__ import annotations

import cv2
import numpy as np
import pandas as pd
import pytest

from training.data.adapters.base import AdapterError
from training.data.adapters.kermany import KermanySource, parse_name
from training.data.adapters.nih14 import NIH14Source
from training.data.adapters.table import TableSource
from training.data.findings import NIH14_LABELS
from training.data.label_names import ORGANISER_SPELLING, canonical_name
from training.data.manifest import ManifestError, load_manifest


def image(path, value=128, size=16):
    path.parent.mkdir(parents=True, exist_ok=True)
    cv2.imwrite(str(path), np.full((size, size), value, np.uint8))


def read(path):
    return pd.read_csv(path, dtype=str, keep_default_na=False)


@pytest.mark.parametrize(
    ("name", "patient", "subtype"),
    [
        ("person123_bacteria_456.jpeg", "person123", "bacteria"),
        ("person1_virus_6.jpeg", "person1", "virus"),
        ("person1_virus_6_7.jpeg", "person1", "virus"),
        ("IM-0115-0001.jpeg", "IM-0115", None),
        ("IM-0429-0001-0002.jpeg", "IM-0429", None),
        ("NORMAL2-IM-0383-0001.jpeg", "NORMAL2-IM-0383", None),
        ("NORMAL2-IM-0383-0001-0002.jpeg", "NORMAL2-IM-0383", None),
    ],
)
def test_kermany_file_names(name, patient, subtype):
    assert parse_name(name) == (patient, subtype)


def test_kermany_unknown_file_name_is_named():
    with pytest.raises(AdapterError, match="scan_7.jpeg"):
        parse_name("scan_7.jpeg")


def test_kermany_layout_to_manifest(tmp_path):
    root = tmp_path / "chest_xray"
    names = {("train", "NORMAL"): [f"IM-{i:04d}-0001.jpeg" for i in range(12)],
             ("train", "PNEUMONIA"): [f"person{i}_bacteria_{i}.jpeg" for i in range(20)] + ["person99_virus_1.jpeg"],
             ("test", "NORMAL"): ["IM-0900-0001.jpeg"], ("test", "PNEUMONIA"): ["person99_virus_2.jpeg"]}  # fmt: skip
    for (split, label), files in names.items():
        for file in files:
            image(root / split / label / file)
    table = read(KermanySource(str(root), out_dir=str(tmp_path / "m")).prepare())
    # person99 is in the test folder, so its train image is excluded, not leaked.
    assert "train/PNEUMONIA/person99_virus_1.jpeg" not in set(table["path"])
    assert len(table) == 12 + 20 + 2
    assert table.groupby("patient_id")["split"].nunique().max() == 1
    assert set(table.loc[table["official_split"] == "test", "split"]) == {"test"}
    assert set(table.loc[table["official_split"] == "train", "split"]) == {"train", "val"}
    assert table.loc[table["path"] == "test/PNEUMONIA/person99_virus_2.jpeg", ["Pneumonia", "subtype"]].values.tolist() \
        == [["1", "virus"]]  # fmt: skip


def test_kermany_wrong_layout_says_what_it_expected(tmp_path):
    (tmp_path / "images").mkdir()
    with pytest.raises(AdapterError, match=r"train/NORMAL/"):
        KermanySource(str(tmp_path), out_dir=str(tmp_path / "m")).prepare()


def nih_release(root, rows, test_list=None):
    header = "Image Index,Finding Labels,Follow-up #,Patient ID,Patient Age,Patient Gender,View Position,x\n"
    (root / "images_001" / "images").mkdir(parents=True)
    lines = []
    for i, (patient, findings) in enumerate(rows):
        name = f"{int(patient):08d}_{i:03d}.png"
        image(root / "images_001" / "images" / name)
        lines.append(f"{name},{findings},{i},{patient},50,F,PA,0")
    (root / "Data_Entry_2017_v2020.csv").write_text(header + "\n".join(lines) + "\n")
    if test_list:
        (root / "test_list.txt").write_text("\n".join(test_list) + "\n")


def test_nih_findings_and_official_test_list(tmp_path):
    rows = [(p, "Effusion|Hernia" if p % 3 == 0 else "No Finding") for p in range(1, 31)]
    nih_release(tmp_path / "nih", rows, test_list=["00000001_000.png", "00000002_001.png"])
    table = read(NIH14Source(str(tmp_path / "nih"), out_dir=str(tmp_path / "m")).prepare())
    row = table.set_index("image_id").loc["00000003_002.png"]
    assert (row["Effusion"], row["Hernia"], row["No Finding"], row["Atelectasis"]) == ("1", "1", "0", "0")
    assert row["path"] == "images_001/images/00000003_002.png" and row["patient_id"] == "3"
    assert set(table.loc[table["split"] == "test", "image_id"]) == {"00000001_000.png", "00000002_001.png"}
    assert set(table["split"]) == {"train", "val", "test"}
    manifest = load_manifest(next((tmp_path / "m").glob("*.csv")), NIH14_LABELS, NIH14_LABELS, root=tmp_path / "nih",
                             extra_columns=NIH14Source.extra_columns)  # fmt: skip
    assert manifest.class_counts("train").sum() > 0


def test_nih_unknown_finding_names_its_line(tmp_path):
    nih_release(tmp_path / "nih", [(1, "Effusion"), (2, "Efusion|Mass")])
    with pytest.raises(AdapterError, match=r"line 3, column 'Finding Labels': unknown finding 'Efusion'"):
        NIH14Source(str(tmp_path / "nih"), out_dir=str(tmp_path / "m")).prepare()


def cxrlt_release(root, ids, patients=None, extra=None):
    """A generic table keyed by ``ImageID`` (``train_labels.csv``); a ``PatientID`` column only when given."""
    (root / "images").mkdir(parents=True)
    for i in ids:
        if "E+" not in i:
            image(root / "images" / f"{i}.png")
    columns = {"ImageID": ids, **({"PatientID": patients} if patients else {}),
               "pleural effusion": [i % 2 for i in range(len(ids))], "cardiomegaly": [1] * len(ids), **(extra or {})}  # fmt: skip
    pd.DataFrame(columns).to_csv(root / "train_labels.csv", index=False)


def test_cxrlt_ids_stay_text_and_organiser_names_map_to_the_papers(tmp_path):
    """A user who has patient ids configures the column and gets patient-disjoint splits of it."""
    ids = [f"00{i}12345678901234" for i in range(20)]
    cxrlt_release(tmp_path / "r", ids, [f"0{i // 2}" for i in range(20)])
    source = TableSource(str(tmp_path / "r"), table="train_labels.csv", image_column="ImageID", image_dir="images",
                             image_suffix=".png", patient_column="PatientID", out_dir=str(tmp_path / "m"))  # fmt: skip
    table = read(source.prepare())
    assert table["image_id"].tolist() == ids  # leading zeros and all 18 digits kept
    assert table["patient_id"].iloc[0] == "00" and source.patient_ids
    assert {"Pleural Effusion", "Cardiomegaly"} <= set(table.columns)
    assert table.groupby("patient_id")["split"].nunique().max() == 1


def test_scientific_notation_ids_are_refused_with_their_line(tmp_path):
    cxrlt_release(tmp_path / "r", ["1.23457E+11", "200"])
    with pytest.raises(AdapterError, match=r"line 2, column 'ImageID': '1.23457E\+11' looks like a number"):
        TableSource(
            str(tmp_path / "r"), table="train_labels.csv", image_column="ImageID", out_dir=str(tmp_path / "m")
        ).prepare()


def test_duplicated_ids_are_refused_with_their_lines(tmp_path):
    cxrlt_release(tmp_path / "r", ["a", "b", "a"])
    with pytest.raises(AdapterError, match=r"'a' duplicated on lines \[2, 4\]"):
        TableSource(
            str(tmp_path / "r"), table="train_labels.csv", image_column="ImageID", out_dir=str(tmp_path / "m")
        ).prepare()


def test_unknown_class_names_are_refused_with_a_suggestion(tmp_path):
    cxrlt_release(tmp_path / "r", ["a", "b"], extra={"cardiomegalia": [0, 1]})
    with pytest.raises(AdapterError, match=r"column 'cardiomegalia': unknown class name \(did you mean 'Cardiomegaly'"):
        TableSource(
            str(tmp_path / "r"), table="train_labels.csv", image_column="ImageID", out_dir=str(tmp_path / "m")
        ).prepare()


def test_bad_label_values_are_named(tmp_path):
    root = tmp_path / "t"
    root.mkdir()
    pd.DataFrame({"image": ["a.png", "b.png"], "Mass": ["1", "maybe"]}).to_csv(root / "labels.csv", index=False)
    with pytest.raises(AdapterError, match=r"line 3, column 'Mass': 'maybe' is not 0/1"):
        TableSource(str(root), out_dir=str(tmp_path / "m")).prepare()


def test_generic_table_with_label_map_split_column_and_dicom_paths(tmp_path):
    root = tmp_path / "t"
    rows = [{"file": f"scans/{i}.dcm", "patient": f"p{i}", "set": ["train", "validation", "test"][i % 3],
             "opacity": i % 2, "age": 40 + i} for i in range(9)]  # fmt: skip
    root.mkdir()
    pd.DataFrame(rows).to_csv(root / "labels.csv", index=False)
    source = TableSource(str(root), image_column="file", patient_column="patient", split_column="set",
                         label_map={"opacity": "Consolidation"}, keep_columns=["age"], out_dir=str(tmp_path / "m"))  # fmt: skip
    table = read(source.prepare())
    assert table["split"].tolist() == ["train", "val", "test"] * 3
    assert table["Consolidation"].tolist() == [str(i % 2) for i in range(9)]
    assert table["path"].iloc[0] == "scans/0.dcm" and table["age"].iloc[8] == "48"
    assert source.labels == ("Consolidation",)


def test_manifest_is_rewritten_only_when_its_content_changes(tmp_path):
    cxrlt_release(tmp_path / "r", [f"i{i}" for i in range(10)])
    source = TableSource(
        str(tmp_path / "r"), table="train_labels.csv", image_column="ImageID", out_dir=str(tmp_path / "m")
    )
    first = source.prepare()
    stamp = first.stat().st_mtime_ns
    assert source.prepare() == first and first.stat().st_mtime_ns == stamp


def test_organiser_spellings_round_trip():
    for paper, organiser in ORGANISER_SPELLING.items():
        assert canonical_name(organiser) == paper
        assert canonical_name(organiser.upper().replace(" ", "_")) == paper
    assert canonical_name("Pleural Efusion") is None


def test_the_table_adapter_converts_yes_no_while_a_manifest_refuses_them(tmp_path):
    """data=csv converts an export's yes/no and true/false into the manifest's 1/0; a hand-written manifest holding
    them is refused by line and column (issue 30, 12): a word is converted or refused, never silently read."""
    root = tmp_path / "t"
    root.mkdir()
    words = ["yes", "no", "Yes", "NO", "true", "False", "1", "0", ""]
    rows = {"image": [f"{i}.png" for i in range(9)], "patient": [f"p{i}" for i in range(9)],
            "set": ["train", "val", "test"] * 3, "Mass": words}  # fmt: skip
    pd.DataFrame(rows).to_csv(root / "labels.csv", index=False)
    for i in range(9):
        image(root / f"{i}.png")
    adapted = TableSource(str(root), image_column="image", patient_column="patient", split_column="set",
                          out_dir=str(tmp_path / "m")).prepare()  # fmt: skip
    from_adapter = load_manifest(adapted, ["Mass"], ["Mass"], root=root).table["Mass"].to_numpy()
    np.testing.assert_array_equal(from_adapter, [1, 0, 1, 0, 1, 0, 1, 0, np.nan])
    hand = pd.DataFrame({"image_id": rows["image"], "path": rows["image"], "split": rows["set"],
                         "patient_id": rows["patient"], "Mass": words})  # fmt: skip
    hand.to_csv(tmp_path / "hand.csv", index=False)
    with pytest.raises(ManifestError, match=r"6 problem\(s\).*\n  line 2, column 'Mass': 'yes' is not a manifest"):
        load_manifest(tmp_path / "hand.csv", ["Mass"], ["Mass"], root=root)


def test_empty_label_table_is_named(tmp_path):
    root = tmp_path / "t"
    root.mkdir()
    (root / "labels.csv").write_text("")
    with pytest.raises(AdapterError, match=r"labels\.csv: empty file"):
        TableSource(str(root), out_dir=str(tmp_path / "m")).prepare()


def rocov2_release(root, tables=None, images=None, gz=(), names=True):
    """A tiny ROCOv2 layout: ``tables`` maps the split folder to its concept table's text."""
    tables = tables or {
        "train": "ID,CUIs\nr_train_1,C1306645;C0817096;C0032227\nr_train_2,C1306645;C0032227\n"
                 "r_train_3,C1306645;C0000001\n",
        "valid": "ID,CUIs\nr_valid_1,C1306645;C0032227;C0000002\nr_valid_2,\n",
        "test": "ID,CUIs\nr_test_1,C1306645\n",
    }  # fmt: skip
    root.mkdir(parents=True, exist_ok=True)
    for folder, text in tables.items():
        ids = [line.split(",")[0] for line in text.splitlines()[1:] if line.strip()]
        for image_id in ids if images is None else images.get(folder, ids):
            image(root / folder / f"{image_id}.jpg")
        name = f"{folder}_concepts.csv"
        if folder in gz:
            import gzip

            (root / f"{name}.gz").write_bytes(gzip.compress(text.encode()))
        else:
            (root / name).write_text(text)
    if names:
        (root / "cui_mapping.csv").write_text("CUI,Canonical name\nC1306645,Plain x-ray\nC0032227,Pleural effusion\n")
    return root


def test_rocov2_release_to_manifest_with_the_labels_from_the_training_counts(tmp_path):
    from training.data.adapters.rocov2 import ROCOv2Source
    from training.data.sources import manifest_vocabulary

    root = rocov2_release(tmp_path / "rocov2", gz=("valid",))
    source = ROCOv2Source(str(root), min_count=2, out_dir=str(tmp_path / "m"))
    # C1306645 (3 training images), C0032227 (2); C0817096 and C0000001 (1 each) stay in `concepts` only.
    assert source.labels == ("C1306645", "C0032227")
    assert source.label_titles == {"C1306645": "Plain x-ray", "C0032227": "Pleural effusion"}
    path = source.prepare()
    table = read(path)
    assert list(table.columns) == ["image_id", "path", "split", "patient_id", "source", "view", "concepts",
                                   "C1306645", "C0032227"]  # fmt: skip
    assert table["split"].tolist() == ["train"] * 3 + ["val"] * 2 + ["test"]
    assert table["path"].tolist()[3] == "valid/r_valid_1.jpg"  # the gzipped table was found and read
    assert (table["patient_id"] == table["image_id"]).all()  # no patient ids in ROCOv2: each image its own
    assert table["concepts"].tolist()[0] == "C1306645;C0817096;C0032227"
    assert table["concepts"].tolist()[4] == ""  # an image without concepts
    assert table["C0032227"].tolist() == ["1", "1", "0", "1", "0", "0"]
    manifest = load_manifest(path, list(source.labels), manifest_vocabulary(source), root=root,
                             extra_columns=source.extra_columns)  # fmt: skip
    assert manifest.class_counts("train").tolist() == [3, 2]
    assert ROCOv2Source(str(root), min_count=1, out_dir=str(tmp_path / "m")).labels[:2] == ("C1306645", "C0032227")


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ("ID,CUIs\nr_train_1,C1306645;C03\n", r"train_concepts\.csv, line 2, column 'CUIs': 'C03' is not a CUI"),
        ("ID,CUIs\nr_train_1,c1306645\nr_train_2,C130664X\n", r"line 3, column 'CUIs': 'C130664X' is not a CUI"),
        ("ID,CUIs\nr_train_1,C1306645\nr_train_1,C1306645\n", r"'r_train_1' duplicated on lines \[2, 3\]"),
        ("ID,CUIs\n", r"train_concepts\.csv: a header without rows"),
        ("", r"train_concepts\.csv: empty file"),
        ("Image,Concepts\nr_train_1,C1306645\n", r"train_concepts\.csv, line 1: header"),
        ("ID,CUIs\n1.23457E+11,C1306645\n", r"line 2, column 'ID': '1.23457E\+11' looks like a number"),
    ],
)
def test_rocov2_table_errors_name_the_file_line_and_value(tmp_path, table, message):
    from training.data.adapters.rocov2 import ROCOv2Source

    root = rocov2_release(tmp_path / "r", tables={"train": table, "valid": "ID,CUIs\nv1,C1306645\n",
                                                  "test": "ID,CUIs\nt1,C1306645\n"})  # fmt: skip
    with pytest.raises(AdapterError, match=message):
        ROCOv2Source(str(root), out_dir=str(tmp_path / "m")).prepare()


def test_rocov2_id_in_two_tables_and_missing_image_are_named(tmp_path):
    from training.data.adapters.rocov2 import ROCOv2Source

    tables = {"train": "ID,CUIs\na,C1306645\nb,C1306645\n", "valid": "ID,CUIs\nv,C1306645\n",
              "test": "ID,CUIs\nx,C1306645\na,C1306645\n"}  # fmt: skip
    root = rocov2_release(tmp_path / "r", tables=tables)
    with pytest.raises(
        AdapterError, match=r"test_concepts\.csv, line 3, column 'ID': 'a' is also on line 2 of .*train"
    ):
        ROCOv2Source(str(root), out_dir=str(tmp_path / "m")).prepare()
    tables["test"] = "ID,CUIs\nx,C1306645\n"
    root = rocov2_release(tmp_path / "s", tables=tables, images={"train": ["a"]})
    with pytest.raises(
        AdapterError, match=r"train_concepts\.csv, line 3, column 'ID': 'b' has no image .*train/b\.jpg"
    ):
        ROCOv2Source(str(root), out_dir=str(tmp_path / "m")).prepare()
    with pytest.raises(
        AdapterError, match=r"no CUI is carried by 5 or more training images \(the most frequent by 2\)"
    ):
        ROCOv2Source(str(root), min_count=5, out_dir=str(tmp_path / "m")).prepare()
    with pytest.raises(AdapterError, match=r"concept table not found: .*train_concepts\.csv"):
        ROCOv2Source(str(tmp_path), out_dir=str(tmp_path / "m")).prepare()


def test_a_task_without_labels_takes_the_adapters_and_needs_one_that_declares_them(tmp_path):
    from omegaconf import OmegaConf

    from training.data.adapters.rocov2 import ROCOv2Source
    from training.data.sources import ManifestSource, TaskLabelsError, task_labels

    source = ROCOv2Source(str(rocov2_release(tmp_path / "r")), min_count=2, out_dir=str(tmp_path / "m"))
    free = OmegaConf.create({"name": "rocov2_concepts", "labels": None})
    assert task_labels(free, source) == ["C1306645", "C0032227"]
    assert task_labels(OmegaConf.create({"name": "t", "labels": ["C0032227"]}), source) == ["C0032227"]
    with pytest.raises(TaskLabelsError, match="takes its labels from the data.*declares none"):
        task_labels(free, ManifestSource(str(tmp_path / "manifest.csv")))
