"""The files of the CXR-LT 2026 release as the organisers ship them: their names, their id columns, their readers.

Everything here is read from the folder participants download (docs/data.md, "The CXR-LT 2026 release"), names
unchanged. The readers are shared by the release adapter, the PadChest adapter (which must drop ``Removal.csv``'s
images too) and ``make submit``/``make score`` (the test lists and Task 2's class file).
"""

from __future__ import annotations

import csv
import gzip
from pathlib import Path

import pandas as pd

from training.data.adapters.base import AdapterError

TRAINING_TABLE = "CXRLT_2026_training.csv"
REMOVAL = "Removal.csv"
TEST_LISTS: dict[str, str] = {"task1": "CXRLT_2026_TEST_ALL_TASK1.csv", "task2": "CXRLT_2026_TEST_ALL_TASK2.csv"}
TASK2_CLASSES = "Eval_Class_Task2.txt"
#: The three columns every table of the release opens with.
ID_COLUMNS = ("ImageID", "StudyDate_DICOM", "PatientID")
PADCHEST_ID, PADCHEST_PATIENT = "ImageID", "PatientID"


def header(path: Path) -> list[str]:
    """The first line of a CSV, cells as written (empty ones stay empty, a trailing newline or none)."""
    try:
        with open(path, newline="", encoding="utf-8-sig") as handle:
            return next(csv.reader(handle), [])
    except FileNotFoundError:
        raise AdapterError(f"{path}: no such file") from None
    except UnicodeDecodeError as error:
        raise AdapterError(f"{path}: not UTF-8 text ({error.reason} at byte {error.start})") from None


def read_release_table(path: Path) -> pd.DataFrame:
    """A table of the release, every cell as text: the three id columns first, then its class columns (named in
    the training table, empty-headed in the test lists, absent in ``Removal.csv``).

    Empty header cells are renamed ``""`` (pandas would call them ``Unnamed: 3``), so a caller sees that the
    columns are unnamed rather than a made-up name.

    Raises:
        AdapterError: the file is missing, unreadable, or does not open with ``ImageID,StudyDate_DICOM,PatientID``.
    """
    names = header(path)
    if tuple(c.strip() for c in names[: len(ID_COLUMNS)]) != ID_COLUMNS:
        raise AdapterError(f"{path}, line 1: expected the release's id columns {list(ID_COLUMNS)} first, found "
                           f"{names[:3]}")  # fmt: skip
    try:
        table = pd.read_csv(path, dtype=str, keep_default_na=False, header=0, names=range(len(names)))
    except (pd.errors.ParserError, UnicodeDecodeError) as error:
        raise AdapterError(f"{path}: not a readable table: {error}") from None
    table.columns = [c.strip() for c in names]
    table[list(ID_COLUMNS)] = table[list(ID_COLUMNS)].apply(lambda column: column.str.strip())
    return table


def release_file(folder_or_file: Path, name: str) -> Path:
    """``name`` in the release folder, or the file itself when one was given."""
    path = Path(folder_or_file).expanduser()
    return path if path.is_file() else path / name


def removal_ids(folder_or_file: Path) -> frozenset[str]:
    """The ImageIDs of ``Removal.csv`` (the release folder or the file): images no training may use."""
    table = read_release_table(release_file(folder_or_file, REMOVAL))
    return frozenset(table["ImageID"][table["ImageID"] != ""])


def class_list(path: Path) -> list[str]:
    """The class names of ``Eval_Class_Task2.txt`` / ``Train_CLASS.txt``: one per line, the tab each line ends with
    (and any other surrounding blank) stripped, empty lines skipped."""
    try:
        lines = Path(path).read_text(encoding="utf-8-sig").splitlines()
    except FileNotFoundError:
        raise AdapterError(f"{path}: no such file") from None
    return [line.strip() for line in lines if line.strip()]


def padchest_patients(table: Path) -> pd.Series:
    """PadChest's own ``PatientID`` by ``ImageID``, from its label table (``PADCHEST_..._160K_01.02.19.csv[.gz]``,
    or the folder holding it): the true patient of each image, which the release's spreadsheet-rounded column is
    not."""
    path = Path(table).expanduser()
    if path.is_dir():
        found = sorted(path.glob("PADCHEST_chest_x_ray_images_labels_*.csv*"))
        if not found:
            raise AdapterError(f"data.padchest_table={path}: no PADCHEST_chest_x_ray_images_labels_*.csv[.gz] in it")
        path = found[0]
    if not path.is_file():
        raise AdapterError(f"data.padchest_table={path}: no such file")
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rt", encoding="utf-8") as handle:
            ids = pd.read_csv(handle, dtype=str, keep_default_na=False, usecols=[PADCHEST_ID, PADCHEST_PATIENT])
    except ValueError as error:
        raise AdapterError(f"{path}: not PadChest's label table ({error})") from None
    ids = ids.apply(lambda column: column.str.strip())
    return ids.drop_duplicates(PADCHEST_ID).set_index(PADCHEST_ID)[PADCHEST_PATIENT]
