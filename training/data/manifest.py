"""Loading and validating the manifest: the one table every dataset is turned into (docs/rules.md §6).

Validation runs before any model is built, so a broken dataset fails in seconds with every problem listed by
row and column, instead of training silently on half the data.
"""

from __future__ import annotations

import difflib
import hashlib
import itertools
import os
import re
import warnings
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from training.errors import UserError

META_COLUMNS = ("image_id", "path", "split", "patient_id", "source", "view")
REQUIRED_COLUMNS = ("image_id", "path", "split", "patient_id")
SPLITS = ("train", "val", "test")
MAX_LISTED = 10  # problems listed per kind before summarising
#: A manifest's label cells, exactly as written (docs/rules.md §6): what adapters write and what a hand-written
#: manifest holds. ``1.0``/``0.0`` are what pandas writes for a label column with empty cells. Nothing else is
#: guessed at: a ``yes``, ``TRUE `` or CheXpert's ``-1`` (uncertain) is refused with its line, not given a meaning.
MANIFEST_LABELS = {"1": 1.0, "1.0": 1.0, "0": 0.0, "0.0": 0.0, "": np.nan}
_SPELLINGS = pd.Index(list(MANIFEST_LABELS), dtype=object)
_MEANINGS = np.array([*MANIFEST_LABELS.values(), np.nan])  # indexed by position in _SPELLINGS; -1 (last): bad
_LABEL_CELLS = pd.CategoricalDtype(list(MANIFEST_LABELS))
NOT_A_MANIFEST_LABEL = ("is not a manifest label: 1, 0 (or 1.0, 0.0) or an empty cell for not labelled, exactly as "
                        "written; convert other spellings first (data=csv reads yes/no and true/false)")  # fmt: skip
#: The spellings of tables made elsewhere (compared lower-cased, spaces stripped), which the adapters convert
#: (data=csv, the CXR-LT release) and reader-study tables use; an empty cell means "not labelled".
POSITIVE, NEGATIVE = ("1", "1.0", "true", "yes"), ("0", "0.0", "false", "no")
NOT_A_LABEL = "is not 0/1 or empty (yes/no and true/false are read as 1/0)"
#: "1.23457E+11" or "1e5": what a spreadsheet makes of a long numeric id. Such an id is refused, never read as a
#: number: the digits the spreadsheet dropped are gone, and two images could end up with one id.
SCIENTIFIC = re.compile(r"^[+-]?\d+(\.\d+)?[eE][+-]?\d+$")


class ManifestError(UserError, ValueError):
    """A manifest that cannot be trained on; the message lists each problem with its file, row and column."""


@dataclass(frozen=True)
class Manifest:
    """A validated manifest.

    Attributes:
        table: one row per image, metadata columns as strings, label columns as float (1, 0, NaN = not labelled).
        root: folder the ``path`` column is relative to.
        labels: the label columns selected for the task, in task order.
        fingerprint: short content hash of the manifest file, recorded with every run so results can be traced
            back to the exact data they came from.
        source_file: the CSV the table was read from.
    """

    table: pd.DataFrame
    root: Path
    labels: tuple[str, ...]
    fingerprint: str
    source_file: Path

    def split(self, name: str) -> pd.DataFrame:
        """Rows of one split, index reset."""
        return self.table[self.table["split"] == name].reset_index(drop=True)

    def positions(self, name: str) -> np.ndarray:
        """Row positions (0-based, file order) of a split's images: their keys in the preprocessing cache."""
        return np.flatnonzero((self.table["split"] == name).to_numpy())

    def targets(self, name: str) -> np.ndarray:
        """``(N, C)`` float32 targets of a split with -1 where a label is missing (the metrics' ``ignore_index``)."""
        values = self.split(name)[list(self.labels)].to_numpy(dtype=np.float32)
        return np.where(np.isnan(values), -1.0, values).astype(np.float32)

    def class_counts(self, name: str = "train") -> np.ndarray:
        """Positive count per task label on a split, ``(C,)`` int64."""
        return (self.targets(name) == 1).sum(axis=0).astype(np.int64)


def file_fingerprint(path: Path) -> str:
    """First 12 hex digits of the SHA-256 of a file."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()[:12]


def read_manifest_table(csv_path: str | Path) -> pd.DataFrame:
    """Every cell of a manifest as text, nothing converted (``000123`` stays ``000123``, ``1e5`` stays ``1e5``),
    the ids stripped of surrounding spaces: ``img1`` and ``img1 `` look alike and are one image, so they compare
    equal (and a repeated one is refused as duplicated).

    Raises:
        ManifestError: the file is missing, empty or not a CSV, named with pandas' reason (which carries the line).
    """
    return _stripped_ids(_read_csv(Path(csv_path), dtype=str))


def _read_csv(csv_path: Path, **options) -> pd.DataFrame:
    """``pandas.read_csv`` of a manifest, nothing taken for missing (an empty cell stays ``""``), its failures
    named."""
    if not csv_path.is_file():
        raise ManifestError(f"manifest not found: {csv_path}")
    try:
        return pd.read_csv(csv_path, keep_default_na=False, **options)
    except pd.errors.EmptyDataError:
        raise ManifestError(f"{csv_path}: empty file, not even a header line; a manifest needs the columns "
                            f"{list(REQUIRED_COLUMNS)} and one column per finding") from None  # fmt: skip
    except UnicodeDecodeError:  # pandas' offset is into one of its chunks: find the byte in the whole file
        data = csv_path.read_bytes()
        try:
            data.decode("utf-8")
        except UnicodeDecodeError as error:
            line = data[: error.start].count(b"\n") + 1
            raise ManifestError(f"{csv_path}, line {line}: not UTF-8 text ({error.reason}: "
                                f"{data[error.start : error.end]!r}); save the file as UTF-8") from None  # fmt: skip
        raise
    except pd.errors.ParserError as error:
        raise ManifestError(f"{csv_path}: not a readable CSV file: {error}") from None


def _read_labelled(csv_path: Path, labels_of) -> tuple[pd.DataFrame, list[str]]:
    """The manifest as text, its label columns (``labels_of(header)``) as a category of their spellings.

    A label column is first parsed as a category of :data:`MANIFEST_LABELS`' spellings, which the CSV parser
    matches per cell in C (no Python string per cell, nothing left to look up). A cell of any other text fails
    that reading, and the file is read again with the label columns as the strings written (object), for
    :func:`check_manifest` to name each such cell: a broken manifest pays the second read, a valid one does not.
    """
    header = _read_csv(csv_path, nrows=0, dtype=str).columns
    labels = [c for c in labels_of(header) if c in header]
    cells = _coded(csv_path, header, labels)
    if cells is None:
        cells = _read_csv(csv_path, dtype={c: (object if c in labels else str) for c in header})
    return _stripped_ids(cells), labels


def _coded(csv_path: Path, header: pd.Index, labels: list[str]) -> pd.DataFrame | None:
    """The manifest with ``labels`` read as :data:`_LABEL_CELLS`; None when a label cell is none of its spellings
    (or the file does not parse: the reading as text names why)."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", pd.errors.Pandas4Warning)  # an unknown category: pandas 3 warns, 4 raises
        try:
            cells = pd.read_csv(csv_path, keep_default_na=False,
                                dtype={c: (_LABEL_CELLS if c in labels else str) for c in header})  # fmt: skip
        except (pd.errors.Pandas4Warning, ValueError, UnicodeDecodeError):
            return None
    return None if cells[labels].isna().to_numpy().any() else cells


def _stripped_ids(table: pd.DataFrame) -> pd.DataFrame:
    for column in ("image_id", "patient_id"):
        if column in table.columns:
            table[column] = table[column].str.strip()
    return table


def parse_manifest_labels(values: pd.Series) -> tuple[np.ndarray, pd.Index]:
    """A manifest's label column as float (1, 0, NaN for an empty cell) and the index of every cell that is none
    of :data:`MANIFEST_LABELS`, compared exactly as written.

    Each distinct cell text is judged once, not each cell: a release's label column holds a handful of distinct
    texts over 100k+ rows, so the column is factorised (one hash per cell, in C) and only its distinct values are
    looked up. A column that is not all text is first turned into text cell by cell, as ``str`` spells each value
    (``1.0`` reads as ``"1.0"``, ``True`` as ``"True"``: factorising would take ``True`` for ``1``); a missing
    value (None, NaN) is a bad cell.
    """
    if isinstance(values.dtype, pd.CategoricalDtype):  # already coded: a cell's str is its category's
        codes, distinct = values.cat.codes.to_numpy(), values.cat.categories.astype(str)
    else:
        if pd.api.types.infer_dtype(values, skipna=False) != "string":
            values = values.astype(str)
        codes, distinct = pd.factorize(values)  # codes[i] indexes distinct; -1 for a missing value
    spelling = _SPELLINGS.get_indexer(pd.Index(distinct, dtype=object))  # -1: not a manifest label
    per_cell = np.append(spelling, -1)[codes]  # a missing value's code -1 picks the appended "not a label"
    return _MEANINGS[per_cell], values.index[per_cell < 0]


def parse_labels(values: pd.Series) -> tuple[np.ndarray, pd.Index]:
    """A label column of a table made elsewhere as float (1, 0, NaN for an empty cell) and the index of every cell
    that is none of those.

    The spellings are :data:`POSITIVE` and :data:`NEGATIVE`, case and surrounding spaces ignored: exports say
    ``TRUE`` or ``yes``. Adapters convert them and write 1/0 into the manifest, which reads only
    :func:`parse_manifest_labels`' spellings.
    """
    text = values.astype(str).str.strip().str.lower()
    positive, negative = text.isin(POSITIVE), text.isin(NEGATIVE)
    parsed = np.where(positive, 1.0, np.where(negative, 0.0, np.nan))
    return parsed, text.index[~(positive | negative | (text == ""))]


def mangled_ids(values: pd.Series) -> pd.Index:
    """Index of the ids that look like a number a spreadsheet rewrote in scientific notation (``1.23457E+11``)."""
    return values.index[values.str.strip().str.match(SCIENTIFIC)]


def mangled_id_problem(where: str, value: str) -> str:
    """The message for one mangled id, the same for manifests and adapters (``where`` names line and column)."""
    return (f"{where}: {value!r} looks like a number a spreadsheet rewrote in scientific notation (digits may be "
            "lost); ids are text: re-export the table with this column formatted as text")  # fmt: skip


@dataclass(frozen=True)
class ManifestCheck:
    """What :func:`check_manifest` found: the table as read, its label columns, and every problem.

    Attributes:
        table: every cell as text (None when the required columns are missing and nothing else could be checked):
            the label columns as the parser's Python strings (object dtype), every other column as pandas' ``str``.
        labels: the label columns found: the task's labels and every other known finding present.
        problems: one line per problem, each naming its CSV line and column.
        values: the label columns of ``table`` that are present, parsed once (:func:`parse_manifest_labels`:
            1, 0, NaN for not labelled or for a bad cell, which ``problems`` lists); None with ``table``.
    """

    table: pd.DataFrame | None
    labels: tuple[str, ...]
    problems: list[str]
    values: pd.DataFrame | None = None


def check_manifest(
    csv_path: str | Path,
    labels: Sequence[str] | None,
    known_findings: Sequence[str],
    root: str | Path | None = None,
    extra_columns: Sequence[str] = (),
    check_files: bool = True,
    splits: Sequence[str] = SPLITS,
    image_roots: Sequence[str | Path] | None = None,
) -> ManifestCheck:
    """The one manifest validation, shared by training, ``make data-check``, ``make prepare`` and ``make score``.

    One function for all of them, so a manifest that the data check passes is one that training accepts: they
    differ only in what they are given (training knows its task's labels and needs all three splits; the data
    check knows no task; scoring needs only the scored split).

    Args:
        csv_path: the manifest file.
        labels: the task's label columns, each of which must be present; None (no task known): the columns that
            are known findings.
        known_findings: every finding name the platform knows; any other non-metadata column is reported as an
            unknown label column (usually a typo or a spelling from another release), with the closest known name.
        root: folder image paths are relative to; defaults to the manifest's folder.
        extra_columns: additional non-label columns the dataset carries (age, sex, ...), declared so they are not
            mistaken for labels.
        check_files: verify every image file exists (cheap: one ``stat`` per row).
        splits: the splits that must hold at least one image.
        image_roots: folders every image path must lie under (:func:`training.data.sources.image_roots`: the data
            root, and any further folder the adapter declares), for the commands that read the images; None: paths
            are not judged (``make score`` reads none; ``data.allow_outside_root=true``). See
            :func:`outside_roots`.

    Raises:
        ManifestError: only when the file cannot be read as a table at all; everything else is in ``problems``.
    """
    csv_path = Path(csv_path)
    task = tuple(labels or ())
    names = set(known_findings) | set(task)

    def label_columns(header) -> tuple[str, ...]:  # the task's labels first, in task order, then other findings
        return task + tuple(c for c in header if c in names and c not in (*META_COLUMNS, *extra_columns, *task))

    table, present = _read_labelled(csv_path, label_columns)
    root = Path(root) if root is not None else csv_path.parent
    missing_meta = [c for c in REQUIRED_COLUMNS if c not in table.columns]
    if missing_meta:
        return ManifestCheck(None, (), [f"line 1: missing required column(s) {missing_meta}; a manifest needs "
                                        f"{list(REQUIRED_COLUMNS)} (columns found: {list(table.columns)[:8]})"])  # fmt: skip
    ordered = label_columns(table.columns)
    parsed = {label: parse_manifest_labels(table[label]) for label in present}
    values = pd.DataFrame({label: value for label, (value, _) in parsed.items()}, index=table.index)
    table = table.astype(dict.fromkeys(present, object))  # the label cells as text, whichever way they were read
    if table.empty:
        return ManifestCheck(table, ordered, ["line 1: a header without rows; the manifest lists no image"], values)
    problems = _column_problems(table, task, known_findings, extra_columns)
    problems += _id_problems(table)
    problems += _split_problems(table, splits)
    for label, (_, bad) in parsed.items():
        problems += listed(f"bad values in {label!r}", [f"line {csv_line(i)}, column {label!r}: {table.at[i, label]!r} "
                                                        f"{NOT_A_MANIFEST_LABEL}" for i in bad])  # fmt: skip
    outside = outside_roots(table["path"], image_roots) if image_roots is not None else table.index[:0]
    if image_roots is not None:
        where = " or ".join(str(r) for r in image_roots)
        problems += listed("paths outside the data root", [
            f"line {csv_line(i)}, column 'path': {table.at[i, 'path']!r} leaves the data root {where} (paths are "
            "relative to it, without '..'); data.allow_outside_root=true reads it anyway" for i in outside])  # fmt: skip
    if check_files:  # a path outside the root is that problem alone, whether or not a file is there
        inside = table["path"].drop(index=outside)
        problems += listed(
            "missing images",
            [f"line {csv_line(inside.index[i])}, column 'path': image file not found: {root / inside.iloc[i]}"
             for i in missing_files(root, inside.to_numpy(dtype=object))],
        )  # fmt: skip
    return ManifestCheck(table, ordered, problems, values)


def load_manifest(
    csv_path: str | Path,
    labels: Sequence[str],
    known_findings: Sequence[str],
    root: str | Path | None = None,
    extra_columns: Sequence[str] = (),
    check_files: bool = True,
    splits: Sequence[str] = SPLITS,
    refused: str = "nothing was trained",
    image_roots: Sequence[str | Path] | None = None,
) -> Manifest:
    """Read a manifest CSV and validate it against the task's labels (:func:`check_manifest`, which documents the
    arguments), then convert the label columns to float. ``refused`` ends the error's first line: what did not
    happen because of it.

    Raises:
        ManifestError: listing every problem found, each naming the file, CSV line and column.
    """
    csv_path = Path(csv_path)
    found = check_manifest(csv_path, labels, known_findings, root, extra_columns, check_files, splits, image_roots)
    if found.problems:
        raise ManifestError(f"{csv_path}: {len(found.problems)} problem(s), {refused}:\n  "
                            + "\n  ".join(found.problems))  # fmt: skip
    table = found.table.assign(**dict(found.values.items()))  # the label columns as the check parsed them
    root = Path(root) if root is not None else csv_path.parent
    return Manifest(table, root, tuple(labels), file_fingerprint(csv_path), csv_path)


def outside_roots(paths: pd.Series, roots: Sequence[str | Path]) -> pd.Index:
    """Index of the paths that leave every one of ``roots``: any with a ``..`` part, or absolute under none of them.

    Judged on the text, not by resolving links: a symlink inside a root is followed, since only whoever can write
    the data folder can make one (a common way to lay out a dataset spread over disks), while a manifest, often
    made or downloaded by someone else, cannot point outside with ``../../`` or ``/home/...``. A root is matched as
    given and resolved, so absolute paths written by an adapter (resolved) match a root given through a link.
    """
    folders = {Path(os.path.abspath(r)) for r in roots} | {Path(r).resolve() for r in roots}

    def leaves(text: str) -> bool:
        path = Path(text)
        if ".." in path.parts:
            return True
        return path.is_absolute() and not any(path.is_relative_to(folder) for folder in folders)

    # Only a path holding ".." or absolute to the OS can leave (Path.is_absolute implies os.path.isabs): the few
    # such paths are parsed, not every row (building a Path per row costs seconds on a full release).
    text = paths.to_numpy(dtype=object)
    suspect = np.flatnonzero([".." in t or os.path.isabs(t) for t in text])
    return paths.index[suspect[[leaves(text[i]) for i in suspect]]] if len(suspect) else paths.index[:0]


#: A folder is listed once when it holds at most this many entries per manifest row naming it; a larger folder
#: (a 10k-row manifest drawn from a folder of a million images) is cheaper asked file by file: an entry listed costs
#: a fraction of a ``stat``, but a huge folder's listing is mostly names no row asks for (docs/measurements.md,
#: ``make bench-scale``).
LISTING_RATIO = 16


def missing_files(root: Path, paths: Sequence[str]) -> list[int]:
    """Positions of the ``paths`` that are no file under ``root``: exactly ``not (root / path).is_file()``.

    Asked one ``stat`` per path, a full release (100k+ images) takes seconds, mostly Python building paths. So
    each folder the paths name is listed once (``os.scandir``, which knows files from folders without a ``stat``
    on most file systems) and a path whose name the listing holds as a file is present. Every other path (not in
    the listing, a folder that cannot be listed or is much larger than the rows naming it, a name the listing
    cannot answer such as ``a/./`` or another case on a case-insensitive disk) is asked exactly as before, so the
    answer is the same; only the confirmed ones are faster.
    """
    present: set[str] = set()  # paths as written (folder + "/" + name) that the listings hold as files
    for folder, rows in Counter([rel[: rel.rfind("/") + 1] for rel in paths]).items():
        names = _files_in(root / folder, LISTING_RATIO * rows)
        present.update([folder + name for name in names] if folder else names)
    return [i for i, rel in enumerate(paths) if rel not in present and not (root / rel).is_file()]


def _files_in(folder: Path, limit: int) -> list[str]:
    """Names of the files (links to files included) directly in ``folder``; none when it cannot be listed or holds
    more than ``limit`` entries (then asking each path is cheaper than the listing)."""
    try:
        with os.scandir(folder) as entries:
            head = list(itertools.islice(entries, limit + 1))
        return [] if len(head) > limit else [entry.name for entry in head if entry.is_file()]
    except OSError:  # not a folder, not readable, or a link in it that cannot be followed: ask each path
        return []


def csv_line(index: int) -> int:
    """CSV line number of a 0-based data row (line 1 is the header)."""
    return index + 2


def listed(kind: str, items: list[str]) -> list[str]:
    """The first :data:`MAX_LISTED` problems of one kind, then a count of the rest (errors stay readable)."""
    shown = items[:MAX_LISTED]
    if len(items) > MAX_LISTED:
        shown.append(f"... and {len(items) - MAX_LISTED} more {kind}")
    return shown


def _column_problems(table, labels, known_findings, extra_columns) -> list[str]:
    problems = []
    known = set(known_findings) | set(labels)
    for column in table.columns:
        if column in META_COLUMNS or column in extra_columns or column in known:
            continue
        close = difflib.get_close_matches(column, sorted(known), n=1, cutoff=0.75)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        problems.append(
            f"line 1, column {column!r}: unknown label column{hint}; declare non-label columns in data.extra_columns "
            "(make pseudo-label: EXTRA_COLUMNS=)"
        )
    for label in labels:
        if label not in table.columns:
            problems.append(f"line 1, column {label!r}: required by the task but absent from the manifest")
    return problems


def _id_problems(table) -> list[str]:
    problems = []
    for column in ("image_id", "patient_id"):
        values = table[column]  # stripped on reading
        empty = values.index[values == ""]
        problems += listed(f"empty {column}s", [f"line {csv_line(i)}, column {column!r}: empty" for i in empty])
        problems += listed(f"mangled {column}s", [mangled_id_problem(f"line {csv_line(i)}, column {column!r}",
                                                                     values[i]) for i in mangled_ids(values)])  # fmt: skip
    duplicated = table[table["image_id"].duplicated(keep=False) & (table["image_id"] != "")]
    problems += listed("duplicated ids", [
        f"column 'image_id': {image_id!r} duplicated on lines {[csv_line(i) for i in rows.index]}"
        for image_id, rows in duplicated.groupby("image_id", sort=False)])  # fmt: skip
    return problems


def _split_problems(table, splits) -> list[str]:
    bad_split = table.index[~table["split"].isin(SPLITS)].tolist()
    problems = listed(
        "bad splits",
        [f"line {csv_line(i)}, column 'split': {table.at[i, 'split']!r} is not one of {SPLITS}" for i in bad_split],
    )
    problems += [f"column 'split': no {name!r} rows; this command needs images in {list(splits)}"
                 for name in splits if not (table["split"] == name).any()]  # fmt: skip
    problems += listed(
        "patients in several splits",
        [
            f"column 'patient_id': patient {p!r} appears in several splits (splits must be patient-disjoint)"
            for p in patients_in_several_splits(table)
        ],
    )
    return problems


def patients_in_several_splits(table: pd.DataFrame) -> list[str]:
    """The patient ids whose rows lie in more than one split, sorted.

    Counted on integer codes (one (patient, split) pair per row, made unique), not by grouping the text columns:
    the same answer as ``groupby("patient_id")["split"].nunique() > 1`` at a fraction of the cost on 100k+ rows.
    """
    patient, names = pd.factorize(table["patient_id"])
    split, kinds = pd.factorize(table["split"])
    known = (patient >= 0) & (split >= 0)  # a missing id or split is in no group, as groupby drops it
    pairs = np.unique(patient[known].astype(np.int64) * max(len(kinds), 1) + split[known])
    per_patient = np.bincount(pairs // max(len(kinds), 1), minlength=len(names))
    return sorted(names[per_patient > 1])
