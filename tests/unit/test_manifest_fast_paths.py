"""The manifest check's vectorised paths give exactly what the plain per-cell / per-row readings give (issue 31).

Each fast path (label columns factorised, folders listed once, patients counted on codes, only suspect paths
parsed) is compared with a straightforward reference written here, on inputs holding every accepted spelling,
blanks, CheXpert's -1 and cells that must be refused.
"""

import csv
import os
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from training.data import manifest as manifest_module
from training.data.manifest import (
    MANIFEST_LABELS,
    NOT_A_MANIFEST_LABEL,
    ManifestError,
    check_manifest,
    load_manifest,
    missing_files,
    outside_roots,
    parse_manifest_labels,
    patients_in_several_splits,
    read_manifest_table,
)

LABELS = ["Nodule", "Mass", "Hernia"]
#: Every accepted spelling, and cells that look like one but are not (spaces, case, other numbers, NaN words).
ACCEPTED = ["1", "1.0", "0", "0.0", ""]
REFUSED = ["-1", " 1", "1 ", "yes", "TRUE", "nan", "NaN", "NA", "1.00", "01", "+1", "1e0", "2", "0.", ".0", "１"]


def reference_parse(cells) -> tuple[list[float], list[int]]:
    """The plain reading: each cell on its own, by its ``str``, exactly as written; a missing value is refused."""
    values, bad = [], []
    for i, cell in enumerate(cells):
        text = None if cell is None or (isinstance(cell, float) and np.isnan(cell)) else str(cell)
        if text in MANIFEST_LABELS:
            values.append(MANIFEST_LABELS[text])
        else:
            values.append(np.nan)
            bad.append(i)
    return values, bad


def _cells(seed: int, n: int = 400) -> list[str]:
    rng = np.random.default_rng(seed)
    pool = ACCEPTED * 20 + REFUSED
    return [pool[i] for i in rng.integers(0, len(pool), n)]


@pytest.mark.parametrize("dtype", [object, str, "category"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_label_parse_matches_the_per_cell_reading(dtype, seed):
    cells = _cells(seed)
    series = pd.Series(cells, index=pd.RangeIndex(len(cells)) + 7, dtype=dtype)  # an index not from 0
    values, bad = parse_manifest_labels(series)
    expected, expected_bad = reference_parse(cells)
    np.testing.assert_array_equal(values, np.array(expected))
    assert bad.tolist() == [i + 7 for i in expected_bad]


def test_label_parse_of_values_that_are_not_text_uses_their_str():
    """``1.0`` (a float column) reads as "1.0", ``1`` as "1"; a missing value (None, NaN) is refused."""
    cells = [1.0, 0.0, np.nan, 1, 0, None, 2, -1.0, True]
    values, bad = parse_manifest_labels(pd.Series(cells, dtype=object))
    expected, expected_bad = reference_parse(cells)
    np.testing.assert_array_equal(values, np.array(expected))
    assert bad.tolist() == expected_bad
    floats, bad_floats = parse_manifest_labels(pd.Series([1.0, 0.0, np.nan]))
    np.testing.assert_array_equal(floats, [1.0, 0.0, np.nan])
    assert bad_floats.tolist() == [2]


def test_label_parse_of_an_empty_column():
    values, bad = parse_manifest_labels(pd.Series([], dtype=object))
    assert values.shape == (0,) and len(bad) == 0


def _write_manifest(tmp_path: Path, columns: dict[str, list[str]], n: int) -> Path:
    (tmp_path / "images").mkdir(exist_ok=True)
    for i in range(n):
        (tmp_path / "images" / f"{i}.png").write_bytes(b"x")
    table = pd.DataFrame({"image_id": [f"img{i}" for i in range(n)], "path": [f"images/{i}.png" for i in range(n)],
                          "split": [("train", "val", "test")[i % 3] for i in range(n)],
                          "patient_id": [f"p{i}" for i in range(n)], **columns})  # fmt: skip
    path = tmp_path / "manifest.csv"
    table.to_csv(path, index=False)
    return path


def test_every_accepted_spelling_loads_to_the_per_cell_targets(tmp_path):
    rng = np.random.default_rng(3)
    n = 300
    columns = {c: [ACCEPTED[i] for i in rng.integers(0, len(ACCEPTED), n)] for c in LABELS}
    manifest = load_manifest(_write_manifest(tmp_path, columns, n), LABELS, LABELS)
    for label in LABELS:
        expected, bad = reference_parse(columns[label])
        assert bad == []
        np.testing.assert_array_equal(manifest.table[label].to_numpy(), np.array(expected))
        assert manifest.table[label].dtype == np.float64
    targets = np.concatenate([manifest.targets(s) for s in ("train", "val", "test")])
    order = np.concatenate([np.flatnonzero(manifest.table["split"] == s) for s in ("train", "val", "test")])
    reference = np.array([reference_parse(columns[c])[0] for c in LABELS]).T[order]
    np.testing.assert_array_equal(targets, np.where(np.isnan(reference), -1, reference).astype(np.float32))


def test_each_refused_cell_is_named_by_file_line_and_column(tmp_path):
    n = 60
    columns = {c: ["0"] * n for c in LABELS}
    expected = []
    for k, word in enumerate(REFUSED[:9]):  # nine bad cells: all listed, none summarised
        row, label = 3 + 5 * k, LABELS[k % len(LABELS)]
        columns[label][row] = word
        expected.append((label, f"line {row + 2}, column {label!r}: {word!r} {NOT_A_MANIFEST_LABEL}"))
    path = _write_manifest(tmp_path, columns, n)
    with pytest.raises(ManifestError) as error:
        load_manifest(path, LABELS, LABELS)
    lines = str(error.value).splitlines()
    assert lines[0] == f"{path}: 9 problem(s), nothing was trained:"
    # problems are listed column by column (task order), each column's in row order
    assert [line.strip() for line in lines[1:]] == [m for c in LABELS for label, m in expected if label == c]


def test_more_bad_cells_than_listed_are_counted(tmp_path):
    n = 40
    columns = {"Nodule": ["yes"] * n, "Mass": ["0"] * n, "Hernia": ["1"] * n}
    found = check_manifest(_write_manifest(tmp_path, columns, n), LABELS, LABELS)
    assert found.problems[0] == f"line 2, column 'Nodule': 'yes' {NOT_A_MANIFEST_LABEL}"
    assert found.problems[-1] == f"... and {n - manifest_module.MAX_LISTED} more bad values in 'Nodule'"
    assert np.isnan(found.values["Nodule"]).all() and (found.values["Hernia"] == 1).all()


def test_the_check_keeps_every_cell_exactly_as_written(tmp_path):
    """The label columns stay the parser's text (object), the others pandas' str; ids are stripped."""
    rng = np.random.default_rng(4)
    n = 90
    columns = {c: _cells(int(rng.integers(1000)), n) for c in LABELS} | {"age": [f" {i} " for i in range(n)]}
    path = _write_manifest(tmp_path, columns, n)
    with open(path, newline="") as handle:
        raw = list(csv.DictReader(handle))
    found = check_manifest(path, LABELS, LABELS, extra_columns=["age"])
    for column in [*LABELS, "age", "path", "split"]:
        assert found.table[column].tolist() == [row[column] for row in raw], column
    assert all(found.table[c].dtype == object for c in LABELS)
    assert all(found.table[c].dtype == "str" for c in ("image_id", "path", "split", "patient_id", "age"))
    plain = pd.read_csv(path, dtype=str, keep_default_na=False)
    pd.testing.assert_frame_equal(read_manifest_table(path), plain)


def test_ids_are_stripped_as_the_plain_reading_strips_them(tmp_path):
    path = tmp_path / "m.csv"
    path.write_text("image_id,path,split,patient_id,Nodule\n img0 ,a.png,train,\tp0 ,1\nimg1,b.png,test,p1,\n")
    table = read_manifest_table(path)
    assert table["image_id"].tolist() == ["img0", "img1"] and table["patient_id"].tolist() == ["p0", "p1"]
    assert check_manifest(path, ["Nodule"], ["Nodule"], check_files=False).table["image_id"].tolist() == [
        "img0",
        "img1",
    ]


def test_patients_in_several_splits_match_a_groupby():
    rng = np.random.default_rng(5)
    for _ in range(5):
        n = int(rng.integers(1, 400))
        table = pd.DataFrame({"patient_id": pd.array([f"p{i}" for i in rng.integers(0, 60, n)], dtype="str"),
                              "split": pd.array(rng.choice(["train", "val", "test", "training"], n), dtype="str")})  # fmt: skip
        spread = table.groupby("patient_id")["split"].nunique()
        assert patients_in_several_splits(table) == spread[spread > 1].index.tolist()


def _reference_missing(root: Path, paths) -> list[int]:
    return [i for i, rel in enumerate(paths) if not (root / rel).is_file()]


@pytest.fixture
def tree(tmp_path):
    """Files, folders named like files, links (to a file, a folder, nowhere), nested and sibling folders."""
    root = tmp_path / "data"
    for folder in ("a", "a/b", "c", "big"):
        (root / folder).mkdir(parents=True)
    for rel in ("top.png", "a/1.png", "a/2.png", "a/b/3.png", "c/4.png", *[f"big/{i}.png" for i in range(50)]):
        (root / rel).write_bytes(b"x")
    (root / "a" / "dir.png").mkdir()
    os.symlink(root / "a" / "1.png", root / "a" / "link.png")
    os.symlink(root / "a" / "b", root / "a" / "linkdir.png")
    os.symlink(root / "nowhere.png", root / "a" / "broken.png")
    os.symlink(root / "a", root / "linked")
    outside = tmp_path / "outside.png"
    outside.write_bytes(b"x")
    paths = ["top.png", "a/1.png", "a/2.png", "a/b/3.png", "c/4.png", "big/0.png", "big/49.png", "big/50.png",
             "a/dir.png", "a/link.png", "a/linkdir.png", "a/broken.png", "linked/2.png", "linked/none.png",
             "a//1.png", "./top.png", "a/./2.png", "a/b/../1.png", "a/1.png/", "a/", "", ".", "a/..",
             "missing/1.png", "a/missing.png", str(root / "a" / "1.png"), str(outside), str(tmp_path / "no.png"),
             "A/1.png", "a/1.PNG"]  # fmt: skip
    return root, paths


@pytest.mark.parametrize("ratio", [0, 1, 4, 1000])
def test_missing_files_match_a_stat_per_path(tree, monkeypatch, ratio):
    """Whether a folder is listed (ratio large) or each path is asked (ratio 0), the answer is the plain one."""
    root, paths = tree
    monkeypatch.setattr(manifest_module, "LISTING_RATIO", ratio)
    assert missing_files(root, paths) == _reference_missing(root, paths)
    assert missing_files(root, paths[::-1]) == _reference_missing(root, paths[::-1])


def test_missing_files_when_the_root_is_missing(tmp_path):
    paths = ["a.png", "b/c.png"]
    assert missing_files(tmp_path / "nothing", paths) == [0, 1]


def test_a_missing_image_is_named_with_its_line(tree, tmp_path):
    root, paths = tree
    n = len(paths)
    table = pd.DataFrame({"image_id": [f"i{k}" for k in range(n)], "path": paths, "split": ["train"] * n,
                          "patient_id": [f"p{k}" for k in range(n)], "Nodule": ["0"] * n})  # fmt: skip
    path = tmp_path / "m.csv"
    table.to_csv(path, index=False)
    found = check_manifest(path, ["Nodule"], ["Nodule"], root=root, splits=("train",))
    expected = [f"line {i + 2}, column 'path': image file not found: {root / paths[i]}"
                for i in _reference_missing(root, paths)]  # fmt: skip
    shown = expected[: manifest_module.MAX_LISTED]
    assert found.problems == shown + [f"... and {len(expected) - len(shown)} more missing images"] * (expected != shown)


def test_outside_roots_match_parsing_every_path(tmp_path):
    root = tmp_path / "data"
    root.mkdir()
    (tmp_path / "link").symlink_to(root)
    paths = pd.Series(["a.png", "a/../b.png", "..", "../x.png", "a..b/c.png", "..a/b.png", "a/..", str(root / "x.png"),
                       str(tmp_path / "link" / "x.png"), "/etc/passwd", "/", f"{root}/../data/x.png", "./a.png",
                       "a/b/c.png", "x..png"], index=range(10, 25), dtype="str")  # fmt: skip
    roots = [tmp_path / "link"]
    folders = {Path(os.path.abspath(r)) for r in roots} | {Path(r).resolve() for r in roots}

    def leaves(text):
        path = Path(text)
        return ".." in path.parts or (path.is_absolute() and not any(path.is_relative_to(f) for f in folders))

    assert outside_roots(paths, roots).tolist() == [i for i, p in paths.items() if leaves(p)]
    assert outside_roots(paths[paths == "a.png"], roots).tolist() == []
