"""Pair and box tables of the temporal benchmark: every broken table is refused naming file, line, column, value."""

from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np
import pandas as pd
import pytest

from apps.benchmarks.chextemporal.pairs import (
    COARSE,
    PAIR_COLUMNS,
    PROGRESSION,
    DataContractError,
    covid_pairs,
    nih_followup_pairs,
    patient_folds,
    patient_split,
    read_pair_manifest,
    validate_pairs,
)
from apps.benchmarks.framework.boxes import BOX_COLUMNS, read_nih_boxes, validate_boxes
from apps.benchmarks.framework.protocol import Box

FINDINGS = ("Pleural Effusion", "Atelectasis")


def png(path: Path, width: int = 8, height: int = 8) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    assert cv2.imwrite(str(path), np.zeros((height, width), np.uint8))
    return path


def manifest(tmp_path: Path, drop: str | None = None, **row2: str) -> Path:
    """A two-pair manifest whose second data row (file line 3) takes ``row2``'s values (new columns allowed)."""
    for name in ("a", "b", "c"):
        png(tmp_path / "images" / f"{name}.png")
    rows = [
        {"pair_id": "p1", "patient_id": "0042", "prior_path": "images/a.png", "path": "images/b.png",
         "finding": "Effusion", "progression": "worse", "days_between": "3", "source": "t", "split": ""},
        {"pair_id": "p2", "patient_id": "0042", "prior_path": "images/b.png", "path": "images/c.png",
         "finding": "atelectasis", "progression": "", "days_between": "", "source": "t", "split": ""},
    ]  # fmt: skip
    for column, value in row2.items():
        rows[0].setdefault(column, "")
        rows[1][column] = value
    table = pd.DataFrame(rows)
    if drop:
        table = table.drop(columns=drop)
    path = tmp_path / "pairs.csv"
    table.to_csv(path, index=False)
    return path


def read(tmp_path: Path, drop: str | None = None, **row2: str) -> pd.DataFrame:
    return read_pair_manifest(manifest(tmp_path, drop, **row2), tmp_path, FINDINGS, PROGRESSION)


def test_a_good_manifest_reads_with_text_ids_and_the_vocabulary_spelling(tmp_path):
    pairs = read(tmp_path)
    assert list(pairs.columns[: len(PAIR_COLUMNS)]) == list(PAIR_COLUMNS)
    assert pairs["patient_id"].tolist() == ["0042", "0042"]  # never a number
    assert pairs["finding"].tolist() == ["Pleural Effusion", "Atelectasis"]  # alias and case resolved
    assert pairs["progression"].tolist() == ["worse", ""]  # empty = unlabelled
    assert pairs["days_between"].iloc[0] == 3.0 and np.isnan(pairs["days_between"].iloc[1])


@pytest.mark.parametrize(
    ("drop", "row2", "expected"),
    [
        (None, {"days_between": "-2"}, ["line 3, column days_between", "'-2'", "prior film is later"]),
        (None, {"days_between": "three"}, ["line 3, column days_between", "'three'", "not a number"]),
        (None, {"prior_time": "5", "current_time": "2"}, ["line 3, column current_time", "'2'", "'5'"]),
        (None, {"prior_time": "2020-03-05", "current_time": "2020-03-01"}, ["line 3, column current_time", "'2020-03-01'"]),
        (None, {"prior_patient_id": "0042", "current_patient_id": "0043"}, ["line 3, column current_patient_id", "'0043'", "'0042'"]),
        (None, {"finding": "Lung Cancer"}, ["line 3, column finding", "'Lung Cancer'", "Pleural Effusion"]),
        (None, {"progression": "better"}, ["line 3, column progression", "'better'", "improved"]),
        (None, {"prior_path": "images/zz.png"}, ["line 3, column prior_path", "'images/zz.png'", "not found"]),
        (None, {"path": "images/gone.png"}, ["line 3, column path", "'images/gone.png'", "not found"]),
        (None, {"path": "images/b.png"}, ["line 3, column path", "'images/b.png'", "both the prior and the current"]),
        (None, {"pair_id": "p1"}, ["lines 2, 3, column pair_id", "'p1'"]),
        (None, {"patient_id": ""}, ["line 3, column patient_id", "empty"]),
        ("finding", {}, ["no column(s) finding"]),
    ],
)  # fmt: skip
def test_every_broken_pair_is_named(tmp_path, drop, row2, expected):
    with pytest.raises(DataContractError) as caught:
        read(tmp_path, drop, **row2)
    message = str(caught.value)
    assert str(tmp_path / "pairs.csv") in message
    for part in expected:
        assert part in message


def test_prior_and_current_in_order_or_unknown_pass(tmp_path):
    pairs = read(tmp_path, prior_time="2", current_time="")  # unknown current time: nothing to contradict
    assert len(pairs) == 2
    assert isinstance(DataContractError("x"), ValueError)  # the benchmark layer wraps ValueError


def test_missing_manifest_is_named(tmp_path):
    with pytest.raises(DataContractError, match="nothere.csv: file not found"):
        read_pair_manifest(tmp_path / "nothere.csv", tmp_path, FINDINGS, PROGRESSION)


NIH_FINDINGS = ("Effusion", "Mass")


def nih_table() -> pd.DataFrame:
    rows = [  # (image, patient, follow-up, Effusion, Mass)
        ("00000007_000.png", "7", 0, 0, 1),
        ("00000007_001.png", "7", 1, 1, 0),  # Effusion new, Mass resolved
        ("00000007_002.png", "7", 2, 1, 0),  # Effusion persisting, Mass absent-absent: no row
        ("00000012_000.png", "12", 0, 0, 0),
        ("00000012_003.png", "12", 3, 0, 1),  # a gap in numbering is still consecutive: Mass new
        ("00000009_000.png", "9", 0, 1, 1),  # a single film: no pair
    ]
    table = pd.DataFrame(rows, columns=["image", "patient_id", "follow_up", "Effusion", "Mass"])
    table["image"] = "images/" + table["image"]
    return table.sample(frac=1.0, random_state=3)  # row order must not matter


def test_nih_followup_pairs_label_consecutive_films_by_follow_up():
    pairs = nih_followup_pairs(nih_table(), NIH_FINDINGS)
    got = dict(zip(pairs["pair_id"], pairs["progression"], strict=True))
    assert got == {
        "00000007_000.png__00000007_001.png__Effusion": "new",
        "00000007_000.png__00000007_001.png__Mass": "resolved",
        "00000007_001.png__00000007_002.png__Effusion": "persisting",
        "00000012_000.png__00000012_003.png__Mass": "new",
    }
    assert (pairs["prior_follow_up"] < pairs["follow_up"]).all()
    assert set(pairs["progression"]) <= set(COARSE) and (pairs["source"] == "nih").all()
    assert pairs["days_between"].isna().all() and pairs["patient_id"].tolist() == ["7", "7", "7", "12"]
    assert nih_followup_pairs(nih_table().sort_index(), NIH_FINDINGS).equals(pairs)  # deterministic


def test_nih_followup_pairs_read_the_release_layout_and_merge_columns():
    table = nih_table()
    entry = pd.DataFrame({
        "Image Index": table["image"].str.removeprefix("images/"), "Patient ID": table["patient_id"],
        "Follow-up #": table["follow_up"],
        "Finding Labels": ["|".join(n for n in NIH_FINDINGS if r[n]) or "No Finding" for _, r in table.iterrows()],
    })  # fmt: skip
    pairs = nih_followup_pairs(entry, NIH_FINDINGS)
    assert dict(zip(pairs["pair_id"], pairs["progression"], strict=True)) == dict(
        zip(*nih_followup_pairs(table, NIH_FINDINGS)[["pair_id", "progression"]].T.to_numpy(), strict=True)
    )
    # CheXpert names: Pleural Effusion answered by NIH's Effusion (alias), Lung Lesion by Mass or Nodule
    merged = nih_followup_pairs(table.assign(Nodule=0), ["Pleural Effusion", "Lung Lesion"],
                                columns={"Lung Lesion": ("Mass", "Nodule")})  # fmt: skip
    assert sorted(merged["finding"].unique()) == ["Lung Lesion", "Pleural Effusion"]
    assert len(merged) == 4


def test_nih_followup_pairs_refuse_unordered_or_broken_tables():
    table = nih_table().sort_index()
    with pytest.raises(DataContractError, match=r"line 3, column follow_up: .*'7'.*younger.*line 2"):
        nih_followup_pairs(table.assign(age=[60, 50, 61, 40, 41, 30]), NIH_FINDINGS)  # 2017-style numbering
    twice = table.copy()
    twice.loc[1, "follow_up"] = 0
    with pytest.raises(DataContractError, match=r"lines 2, 3, column follow_up: patient '7' has follow-up 0"):
        nih_followup_pairs(twice, NIH_FINDINGS)
    bad = table.astype({"Mass": object})
    bad.loc[4, "Mass"] = "maybe"
    with pytest.raises(DataContractError, match=r"nih labels line 6, column Mass: 'maybe' is not 0/1"):
        nih_followup_pairs(bad, NIH_FINDINGS)
    with pytest.raises(DataContractError, match="no column for finding 'Edema'"):
        nih_followup_pairs(table, ["Edema"])


def covid_root(tmp_path: Path, scores: list[tuple[str, str]], **extra: list[str]) -> Path:
    rows = []
    for i, (before, after) in enumerate(scores):
        prior, current = png(tmp_path / "images" / f"p{i}a.png"), png(tmp_path / "images" / f"p{i}b.png")
        rows.append({"patient_id": f"{i}a", "prior_file": f"images/{prior.name}", "current_file": f"images/{current.name}",
                     "days_between": "2", "prior_opacity_mean": before, "current_opacity_mean": after,
                     "prior_geographic_extent_mean": after, "current_geographic_extent_mean": before,
                     "prior_offset": "1", "current_offset": "3", "prior_view": "PA", "current_view": "AP"})  # fmt: skip
    table = pd.DataFrame(rows)
    for column, values in extra.items():
        table[column] = values
    table.to_csv(tmp_path / "pairs.csv", index=False)
    return tmp_path


SCORES = [("1", "1.5"), ("1", "1.51"), ("2", "1.5"), ("2", "1.4"), ("6.8", "7.3"), ("", "3"), ("4", "")]


def test_covid_pairs_threshold_boundaries(tmp_path):
    root = covid_root(tmp_path, SCORES)
    pairs = covid_pairs(root)
    assert pairs["progression"].tolist() == ["stable", "worse", "stable", "improved", "stable", "", ""]
    assert (pairs["finding"] == "Lung Opacity").all() and (pairs["source"] == "covid-temporal").all()
    assert pairs["patient_id"].tolist()[:2] == ["0a", "1a"] and pairs["view"].iloc[0] == "AP"
    assert covid_pairs(root, threshold=0.0)["progression"].tolist()[:4] == ["worse", "worse", "improved", "improved"]
    # geographic extent runs the other way in this fixture
    extent = covid_pairs(root, score="geographic_extent")["progression"].tolist()
    assert extent == ["stable", "improved", "stable", "worse", "stable", "", ""]
    with pytest.raises(ValueError, match="score must be one of"):
        covid_pairs(root, score="severity")


def test_covid_pairs_refuse_swapped_films(tmp_path):
    root = covid_root(tmp_path, SCORES[:2], days_between=["2", "-4"])
    with pytest.raises(DataContractError, match=r"pairs.csv line 3, column days_between: '-4'"):
        covid_pairs(root)
    root = covid_root(tmp_path, SCORES[:2], current_offset=["3", "0"])
    with pytest.raises(DataContractError, match=r"pairs.csv line 3, column current_time: '0' is before"):
        covid_pairs(root)
    root = covid_root(tmp_path, SCORES[:2], prior_opacity_mean=["1", "n/a"])
    with pytest.raises(DataContractError, match=r"line 3, column prior_opacity_mean: 'n/a' is not a number"):
        covid_pairs(root)


def split_table(n_patients: int = 200) -> pd.DataFrame:
    rows = [
        {"pair_id": f"q{p}_{k}", "patient_id": f"{p:04d}", "source": "s"} for p in range(n_patients) for k in range(3)
    ]
    return pd.DataFrame(rows)


def test_patient_split_is_disjoint_and_deterministic():
    fractions = {"train": 0.6, "val": 0.2, "test": 0.2}
    first = patient_split(split_table(), fractions, seed=4)
    assert (first.groupby("patient_id")["split"].nunique() == 1).all()
    assert set(first["split"]) == set(fractions)
    again = patient_split(split_table().sample(frac=1.0, random_state=1), fractions, seed=4)
    assert again.set_index("pair_id")["split"].to_dict() == first.set_index("pair_id")["split"].to_dict()
    other = patient_split(split_table(), fractions, seed=5)
    assert (other["split"] != first["split"]).any()
    assert patient_split(split_table().iloc[:0], fractions, seed=4).empty


def fold_table(n_patients: int = 40) -> pd.DataFrame:
    """1 to 3 pairs per patient, a patient's pairs all of one class (new, stable, resolved in turn); the same
    patient id in two sources is two patients."""
    classes = ("new", "stable", "resolved")
    rows = [{"pair_id": f"q{p}_{k}", "patient_id": f"{p // 2:04d}", "source": "ab"[p % 2],
             "progression": classes[p % 3]} for p in range(n_patients) for k in range(1 + p % 3)]  # fmt: skip
    return pd.DataFrame(rows)


def test_patient_folds_partition_the_pairs_by_patient_spread_the_classes_and_ignore_row_order():
    table = fold_table()
    folds = patient_folds(table, 5, seed=3)
    assert folds.shape == (len(table),) and sorted(set(folds.tolist())) == [0, 1, 2, 3, 4]  # every pair in one fold
    keyed = table.assign(fold=folds, key=table["source"] + ":" + table["patient_id"])
    assert (keyed.groupby("key")["fold"].nunique() == 1).all()  # a patient never in two folds
    assert keyed["patient_id"].map(keyed.groupby("patient_id")["fold"].nunique()).max() == 2  # id in two sources
    per_fold = pd.crosstab(keyed["fold"], keyed["progression"])
    assert (per_fold > 0).all().all()  # every class in every fold
    shuffled = table.sample(frac=1.0, random_state=1)
    again = dict(zip(shuffled["pair_id"], patient_folds(shuffled, 5, seed=3), strict=True))
    assert again == dict(zip(table["pair_id"], folds, strict=True))
    assert (patient_folds(table, 5, seed=4) != folds).any()


def test_patient_folds_fall_back_to_one_patient_per_fold_and_refuse_what_cannot_be_folded():
    table = fold_table(3)  # 3 patients (one id in two sources): at most 3 folds
    folds = patient_folds(table, 5, seed=0)
    assert sorted(set(folds.tolist())) == [0, 1, 2]
    assert (table.assign(fold=folds).groupby(["source", "patient_id"])["fold"].nunique() == 1).all()
    with pytest.raises(ValueError, match="at least 2 patients, got 1"):
        patient_folds(fold_table(1), 5, seed=0)
    with pytest.raises(ValueError, match="at least 2 folds"):
        patient_folds(table, 1, seed=0)
    with pytest.raises(ValueError, match="1 pairs have no progression label"):
        patient_folds(table.assign(progression=["", *table["progression"][1:]]), 5, seed=0)


def box_table(**changes) -> pd.DataFrame:
    row = {"image_id": "img1", "path": "images/img1.png", "finding": "effusion", "x": "100", "y": "200", "w": "50",
           "h": "60", "frame_width": "1024", "frame_height": "1024"}  # fmt: skip
    row.update(changes)
    return pd.DataFrame([row, {**row, "image_id": "img2", "path": "images/img2.png"} | changes])


def test_validate_boxes_keeps_good_boxes_in_the_vocabulary_spelling():
    boxes = validate_boxes(box_table(x="-0.5", w="1025"), "boxes.csv", ["Pleural Effusion"])  # within 1 px
    assert list(boxes.columns) == list(BOX_COLUMNS)
    assert boxes["finding"].tolist() == ["Pleural Effusion"] * 2 and boxes["correspondence_id"].tolist() == ["", ""]
    assert boxes["x"].dtype == float and boxes["frame_width"].tolist() == [1024, 1024]


@pytest.mark.parametrize(
    ("changes", "expected"),
    [
        ({"x": "-5"}, ["line 2, column x", "'-5'", "left edge"]),
        ({"x": "1000"}, ["line 2, column w", "'50'", "right edge", "1024 x 1024"]),
        ({"y": "1000"}, ["line 2, column h", "bottom edge"]),
        ({"w": "0"}, ["line 2, column w", "'0'", "positive width"]),
        ({"h": "-3"}, ["line 2, column h", "'-3'", "positive width"]),
        ({"y": "abc"}, ["line 2, column y", "'abc'", "not a number"]),
        ({"frame_width": "0"}, ["line 2, column frame_width", "'0'", "frame size"]),
        ({"finding": "Tumour"}, ["line 2, column finding", "'Tumour'", "Pleural Effusion"]),
    ],
)
def test_every_broken_box_is_named(changes, expected):
    with pytest.raises(DataContractError) as caught:
        validate_boxes(box_table(**changes), "boxes.csv", ["Pleural Effusion"])
    assert str(caught.value).startswith("boxes.csv line 2")
    for part in expected:
        assert part in str(caught.value)


def test_a_box_table_without_a_column_is_named():
    with pytest.raises(DataContractError, match=r"boxes.csv: no column\(s\) frame_height"):
        validate_boxes(box_table().drop(columns="frame_height"), "boxes.csv")


def boxes_of(table: pd.DataFrame) -> list[Box]:
    """The benchmark's boxes of a checked table, built as apps/benchmarks/nih_grounding.py builds them."""
    return [Box(r.finding, float(r.x), float(r.y), float(r.w), float(r.h), int(r.frame_width), int(r.frame_height))
            for r in table.itertuples()]  # fmt: skip


def test_boxes_in_the_1024_frame_halve_on_512_images():
    boxes = validate_boxes(box_table(), "boxes.csv")
    moved = boxes_of(boxes)[0].in_frame(512, 512)
    assert (moved.x, moved.y, moved.w, moved.h) == (50.0, 100.0, 25.0, 30.0)
    assert (moved.frame_width, moved.frame_height) == (512, 512) and boxes["x"].iloc[0] == 100.0  # input untouched


def test_a_stretched_copy_scales_each_axis_on_its_own():
    moved = boxes_of(validate_boxes(box_table(), "boxes.csv"))[0].in_frame(512, 400)
    assert moved.x == 50.0 and moved.y == pytest.approx(200 * 400 / 1024)


BBOX_HEADER = "Image Index,Finding Label,Bbox [x,y,w,h],,,\n"
ENTRY_HEADER = "Image Index,Finding Labels,Follow-up #,Patient ID,View Position,OriginalImage[Width,Height]\n"


def nih_release(tmp_path: Path, box_lines: list[str]) -> Path:
    (tmp_path / "BBox_List_2017.csv").write_text(BBOX_HEADER + "".join(box_lines))
    (tmp_path / "Data_Entry_2017_v2020.csv").write_text(
        ENTRY_HEADER + "00000001_000.png,Infiltration|Mass,0,1,PA,2500,2048\n00000002_003.png,Mass,3,2,AP,2992,2991\n"
    )
    return tmp_path


def test_read_nih_boxes_reads_the_release_in_its_1024_frame(tmp_path):
    root = nih_release(tmp_path, ["00000001_000.png,Infiltrate,10.5,20,300,400\n", "00000002_003.png,Mass,1,2,3,4\n"])
    boxes = read_nih_boxes(root)
    assert boxes["finding"].tolist() == ["Infiltration", "Mass"]
    assert boxes["path"].tolist() == ["images/00000001_000.png", "images/00000002_003.png"]
    assert boxes[["frame_width", "frame_height"]].iloc[0].tolist() == [1024, 1024]
    assert boxes["patient_id"].tolist() == ["1", "2"] and boxes["original_width"].tolist() == [2500, 2992]
    assert boxes["x"].iloc[0] == 10.5


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("00000009_000.png,Mass,1,2,3,4\n", r"BBox_List_2017.csv line 3, column Image Index: '00000009_000.png' has no row"),
        ("00000002_003.png,Mass,1,two,3,4\n", r"BBox_List_2017.csv line 3, column y: 'two' is not a number"),
        ("00000002_003.png,Tumour,1,2,3,4\n", r"BBox_List_2017.csv line 3, column finding: 'Tumour'"),
        ("00000002_003.png,Mass,1000,2,30,4\n", r"BBox_List_2017.csv line 3, column w: '30' puts box"),
    ],
)  # fmt: skip
def test_read_nih_boxes_names_broken_lines(tmp_path, line, expected):
    root = nih_release(tmp_path, ["00000001_000.png,Infiltrate,10.5,20,300,400\n", line])
    with pytest.raises(DataContractError, match=expected):
        read_nih_boxes(root)


def test_pairs_table_without_files_on_disk_can_be_checked_without_root():
    table = pd.DataFrame(
        [{"pair_id": "x", "patient_id": 42, "prior_path": "a.png", "path": "b.png", "finding": "mass"}]
    )
    pairs = validate_pairs(table, None, ["Mass"], COARSE)
    assert pairs["patient_id"].tolist() == ["42"] and pairs["progression"].tolist() == [""]
