"""Reading a multi-reader benchmark from disk: the REVEAL-CXR release as distributed, or a generic reader table.

Two layouts, described in ``configs/benchmark/reveal.yaml`` (column names are configuration, because the public
release may spell them differently from the paper): **release**, one row per study with the majority labels
and the agreement level; **readers**, one row per (image, reader), optionally with an adjudicated table (how
local stand-ins such as the NIH expert relabelling are read). See docs/benchmarks.md, "Reading the data".

Ids (images, readers, patients) are text throughout: a reader id such as ``4295232296`` or a patient ``0042``
must never become a number. Everything a user can get wrong in a table is one :class:`BadInput` naming the file,
the line and the column.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from apps.benchmarks.framework.protocol import BadInput
from apps.benchmarks.reveal.agreement import majority
from apps.benchmarks.reveal.ratings import RATINGS
from training.data.manifest import parse_labels

MISSING = -1
"""Code of a read (or a reference) that is not there: blank, hedged, not asked, or a tied vote."""

RATING_AGREE_ALL, RATING_AGREE_MOSTLY = RATINGS[0], RATINGS[1]


@dataclass(frozen=True)
class ReleaseLayout:
    """Where the release keeps what (``release:`` in the YAML).

    Attributes:
        agreement: column with the number of readers who rated "Agree all" (``3``, ``3/3``, ``3 of 3``), or ``None``.
        ratings: columns of each reader's rating (blank: not rated); when given they decide the agreement level and
            give the readers' rating kappa.
        path: column with each study's image path relative to the root, or ``None`` to look under ``images``
            (``<images>/<study id>/*.dcm``).
        subset: column naming each study's subset (released / holdout), compared on acquisition, or ``None``.
    """

    table: str
    id: str
    labels: Mapping[str, str]
    agreement: str | None = None
    ratings: Sequence[str] = ()
    path: str | None = None
    images: str = "images"
    patient: str | None = None
    subset: str | None = None


@dataclass(frozen=True)
class ReaderTableLayout:
    """Where a generic multi-reader table keeps what (``readers:`` in the YAML).

    Attributes:
        image: the image path column (relative to the root); it is also the study id.
        findings: table column -> the benchmark label(s) it reads (a combined ``nodule/mass`` column reads both).
        ignore: finding columns the readers gave that are not benchmark labels (read, then left aside).
        hedged: a column naming which findings a reader hedged (informational; the cell itself is blank).
        adjudicated: optional table with one row per image: the adjudicated reference and study attributes.
    """

    table: str
    image: str
    reader: str
    findings: Mapping[str, Sequence[str]]
    ignore: Sequence[str] = ()
    patient: str | None = None
    hedged: str | None = None
    adjudicated: str | None = None
    subset: str | None = None


@dataclass(frozen=True, eq=False)
class ReaderStudy:
    """A benchmark's studies, their reference and (when known) every reader's reads.

    Attributes:
        table: one row per study, sorted by id, with ``stratum`` (``"3 of 3"``: readers agreeing with the
            reference on every label).
        reference: ``(N, K)`` 0/1, :data:`MISSING` where there is none (a tie, no reads).
        reads: ``(N, R, K)`` 0/1/:data:`MISSING`, or ``None``; readers are sorted as text.
        absent: benchmark label -> why this data has no reference for it.
        ratings: ``(N, R')`` rating codes of :data:`~apps.benchmarks.reveal.ratings.RATINGS` (-1: not rated), or
            ``None`` (``no_ratings`` says why).
    """

    table: pd.DataFrame
    names: tuple[str, ...]
    reference: np.ndarray
    readers: tuple[str, ...] = ()
    reads: np.ndarray | None = None
    blanks: pd.DataFrame = field(default_factory=pd.DataFrame)
    absent: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    ratings: np.ndarray | None = None
    raters: tuple[str, ...] = ()
    no_ratings: str = ""
    source: str = ""


def read_text_table(path: Path) -> pd.DataFrame:
    """A CSV with every cell as text (empty cell = ``""``), or a named error."""
    if not path.is_file():
        raise BadInput(f"{path}: file not found")
    try:
        return pd.read_csv(path, dtype=str, keep_default_na=False)
    except (pd.errors.ParserError, UnicodeDecodeError, pd.errors.EmptyDataError) as error:
        raise BadInput(f"{path}: not a readable CSV table ({error})") from error


def require_columns(path: Path, table: pd.DataFrame, columns: Sequence[str | None]) -> None:
    missing = [c for c in columns if c is not None and c not in table.columns]
    if missing:
        raise BadInput(f"{path}: no column(s) {', '.join(missing)} (columns: {', '.join(table.columns)}); "
                       f"the names are set in configs/benchmark/reveal.yaml")  # fmt: skip


def parse_reads(path: Path, table: pd.DataFrame, column: str) -> np.ndarray:
    """A 0/1 column as int with :data:`MISSING` for blanks; any other value is an error naming its line."""
    values, bad = parse_labels(table[column])
    if len(bad):
        first = bad[0]
        raise BadInput(f"{path} line {int(first) + 2}, column {column}: {table[column][first]!r} is not 0/1 or "
                       f"empty (yes/no and true/false are read as 1/0; {len(bad)} such cell(s))")  # fmt: skip
    return np.where(np.isnan(values), MISSING, values).astype(int)


def check_images(root: Path, table_path: Path, paths: Sequence[str]) -> None:
    """Every image is on disk, and every DICOM file is one and has pixel data (checked before any encoding, so a
    bad file is named at once instead of failing a batch halfway through the model)."""
    missing = [p for p in paths if not (root / p).is_file()]
    if missing:
        shown = ", ".join(missing[:3]) + (", ..." if len(missing) > 3 else "")
        raise BadInput(f"{table_path}: {len(missing)} image(s) not found under {root}: {shown}")
    for rel in paths:
        if str(rel).lower().endswith((".dcm", ".dicom")):
            check_dicom(root / rel)


def check_dicom(path: Path) -> None:
    import pydicom
    from pydicom.errors import InvalidDicomError

    try:
        dataset = pydicom.dcmread(path, defer_size=256)  # large values (the pixels) stay on disk
    except (InvalidDicomError, OSError, ValueError) as error:
        raise BadInput(f"{path}: not a readable DICOM file ({error})") from error
    if "PixelData" not in dataset and "FloatPixelData" not in dataset and "DoubleFloatPixelData" not in dataset:
        raise BadInput(f"{path}: DICOM file without pixel data (a report or structured document, not an image)")


def strata(reads: np.ndarray, reference: np.ndarray) -> list[str]:
    """Per study ``"k of n"``: of the ``n`` readers who read it, ``k`` agree with the reference on every label both
    have (the reader-table analogue of the release's "Agree all" count)."""
    read_any = (reads != MISSING).any(axis=2)  # (N, R)
    comparable = (reads != MISSING) & (reference[:, None, :] != MISSING)
    agrees = ((reads == reference[:, None, :]) | ~comparable).all(axis=2) & read_any
    return [f"{a} of {n}" for a, n in zip(agrees.sum(axis=1), read_any.sum(axis=1), strict=True)]


def label_columns(findings: Mapping[str, Sequence[str]], labels: Sequence[str]) -> dict[str, str]:
    """Benchmark label -> the one column of the table that reads it (``findings``: the columns the table has).

    A configuration error when two of the table's columns read one label or a label is unknown.
    """
    out: dict[str, str] = {}
    for column, targets in findings.items():
        for label in [targets] if isinstance(targets, str) else targets:
            if label not in labels:
                raise ValueError(
                    f"readers.findings: {column} -> {label!r}, not a benchmark label ({', '.join(labels)})"
                )
            if label in out:
                raise ValueError(f"readers.findings: both {out[label]} and {column} read {label!r}")
            out[label] = column
    return out


def read_reader_table(root: Path, layout: ReaderTableLayout, labels: Sequence[str],
                      reference: str = "majority") -> ReaderStudy:  # fmt: skip
    """The studies of a generic multi-reader table; ``reference`` is ``majority`` or ``adjudicated``."""
    path = root / layout.table
    reads_table = read_text_table(path)
    require_columns(path, reads_table, [layout.image, layout.reader, layout.patient, layout.hedged])
    known = {layout.image, layout.reader, layout.patient, layout.hedged, *layout.findings, *layout.ignore}
    unknown = [c for c in reads_table.columns if c not in known]
    if unknown:
        raise BadInput(f"{path}: column(s) {', '.join(unknown)} are not findings this benchmark knows; map them "
                       f"under readers.findings (to one of: {', '.join(labels)}) or list them under readers.ignore "
                       f"in configs/benchmark/reveal.yaml")  # fmt: skip
    columns = label_columns({c: v for c, v in layout.findings.items() if c in reads_table.columns}, labels)
    if not columns:
        raise BadInput(f"{path}: none of the finding columns of readers.findings is there "
                       f"({', '.join(layout.findings)})")  # fmt: skip
    duplicated = reads_table.duplicated([layout.image, layout.reader], keep=False)
    if duplicated.any():
        rows = reads_table[duplicated]
        first = rows.iloc[0]
        raise BadInput(f"{path} lines {', '.join(str(i + 2) for i in rows.index[:6])}: reader {first[layout.reader]} "
                       f"read image {first[layout.image]} more than once ({int(duplicated.sum())} duplicated rows)")  # fmt: skip
    for column in (layout.image, layout.reader):
        empty = reads_table.index[reads_table[column].str.strip() == ""]
        if len(empty):
            raise BadInput(f"{path} line {int(empty[0]) + 2}: empty {column}")
    images = sorted(reads_table[layout.image].unique())
    check_images(root, path, images)
    readers = tuple(sorted(reads_table[layout.reader].unique()))
    names = tuple(label for label in labels if label in columns)
    row = reads_table[layout.image].map({image: i for i, image in enumerate(images)}).to_numpy()
    col = reads_table[layout.reader].map({reader: r for r, reader in enumerate(readers)}).to_numpy()
    reads = np.full((len(images), len(readers), len(names)), MISSING, dtype=int)
    parsed = {column: parse_reads(path, reads_table, column) for column in dict.fromkeys(columns.values())}
    for k, label in enumerate(names):
        reads[row, col, k] = parsed[columns[label]]
    blanks = pd.DataFrame(
        [{"reader": reader, "label": label, "asked": int((col == r).sum()),
          "blank": int((parsed[columns[label]][col == r] == MISSING).sum())}
         for r, reader in enumerate(readers) for label in names]
    )  # fmt: skip
    first = reads_table.drop_duplicates(layout.image).set_index(layout.image)
    studies = pd.DataFrame({"study_id": images, "path": images})
    studies["patient_id"] = first.loc[images, layout.patient].to_numpy() if layout.patient else studies["study_id"]
    consensus = majority(reads)
    notes = [f"{len(images)} studies, {len(readers)} readers, {len(reads_table)} reads from {layout.table}"]
    shared = {c: [lab for lab, col_ in columns.items() if col_ == c] for c in set(columns.values())}
    notes += [f"column {c} is read as {' and as '.join(ls)} (one finding in this data, two benchmark labels)"
              for c, ls in sorted(shared.items()) if len(ls) > 1]  # fmt: skip
    if layout.ignore:
        notes.append(f"read but not benchmark labels: {', '.join(layout.ignore)}")
    reference_labels = consensus
    if layout.adjudicated:
        studies, reference_labels = join_adjudicated(root, layout, columns, names, studies, consensus, reference)
        notes.append(f"reference: {'the adjudicated labels of ' + layout.adjudicated if reference == 'adjudicated' else 'majority of the readers'}")  # fmt: skip
    elif reference == "adjudicated":
        raise ValueError("reference: adjudicated needs readers.adjudicated (a table of adjudicated labels)")
    ties = int(((consensus == MISSING) & (reads != MISSING).any(axis=1)).sum())
    if ties:
        notes.append(f"{ties} (study, label) majority vote(s) tied after blanks: no reference there")
    studies["stratum"] = strata(reads, reference_labels)
    if layout.subset:
        if layout.subset not in studies.columns:
            raise BadInput(f"readers.subset: no column {layout.subset} in the study table "
                           f"({', '.join(studies.columns)})")  # fmt: skip
        studies = studies.rename(columns={layout.subset: "subset"})
    absent = {label: f"{path.name} has no column for it" for label in labels if label not in names}
    no_ratings = (f"{path.name} holds each reader's 0/1 reads of the findings: its readers rated no suggested "
                  f"labels as Agree all, Agree mostly or Disagree")  # fmt: skip
    source = " and ".join(dict.fromkeys([path.name, *([str(layout.adjudicated)] if layout.adjudicated else [])]))
    return ReaderStudy(studies, names, reference_labels, readers, reads, blanks, absent, notes,
                       no_ratings=no_ratings, source=source)  # fmt: skip


def join_adjudicated(root: Path, layout: ReaderTableLayout, columns: Mapping[str, str], names: Sequence[str],
                     studies: pd.DataFrame, consensus: np.ndarray, reference: str) -> tuple[pd.DataFrame, np.ndarray]:  # fmt: skip
    """Study attributes from the adjudicated table, and its labels when they are the reference."""
    path = root / str(layout.adjudicated)
    table = read_text_table(path)
    require_columns(path, table, [layout.image])
    duplicated = table[layout.image].duplicated()
    if duplicated.any():
        raise BadInput(f"{path} line {int(table.index[duplicated][0]) + 2}: image "
                       f"{table[layout.image][duplicated].iloc[0]} appears twice")  # fmt: skip
    missing = sorted(set(studies["study_id"]) - set(table[layout.image]))
    if missing:
        raise BadInput(f"{path}: no row for {len(missing)} read image(s), e.g. {missing[0]}")
    table = table.set_index(layout.image).loc[studies["study_id"]]
    extra = [c for c in table.columns if c not in studies.columns and c not in columns.values()]
    studies = pd.concat([studies, table[extra].reset_index(drop=True)], axis=1)
    if reference != "adjudicated":
        return studies, consensus
    require_columns(path, table.reset_index(), [columns[label] for label in names])
    labels = np.stack([parse_reads(path, table.reset_index(), columns[label]) for label in names], axis=1)
    return studies, labels


def agreement_stratum(value: str, readers: int = 3) -> str:
    """``"3"``, ``"3/3"``, ``"3 of 3"`` -> ``"3 of 3"`` (the release's agreement level)."""
    text = str(value).strip().lower().replace("/", " of ")
    parts = text.split()
    if not parts or not parts[0].isdigit() or (len(parts) > 1 and (len(parts) != 3 or parts[1] != "of")):
        raise ValueError(value)
    return f"{int(parts[0])} of {int(parts[2]) if len(parts) == 3 else readers}"


def rating_codes(path: Path, table: pd.DataFrame, columns: Sequence[str]) -> np.ndarray:
    """``(N, R)`` each rating column as its code in :data:`~apps.benchmarks.reveal.ratings.RATINGS` (any case), -1
    for a blank cell (not rated); any other text is an error naming its line."""
    codes = np.full((len(table), len(columns)), MISSING, dtype=int)
    for r, column in enumerate(columns):
        text = table[column].str.strip().str.lower()
        bad = text.index[~text.isin((*RATINGS, ""))]
        if len(bad):
            raise BadInput(f"{path} line {int(bad[0]) + 2}, column {column}: rating {table[column][bad[0]]!r} is "
                           f"not Agree all / Agree mostly / Disagree (or blank: not rated)")  # fmt: skip
        codes[:, r] = text.map({rating: i for i, rating in enumerate(RATINGS)}).fillna(MISSING).to_numpy()
    return codes


def rating_strata(codes: np.ndarray, merge_agree_mostly: bool) -> list[str]:
    """Per study ``"k of n"`` readers rating "Agree all" (and "Agree mostly" too unless it is merged into
    "Disagree", the paper's choice); ``n`` is the number of rating columns."""
    agreeing = [RATINGS.index(RATING_AGREE_ALL)] + ([] if merge_agree_mostly else [RATINGS.index(RATING_AGREE_MOSTLY)])
    counts = np.isin(codes, agreeing).sum(axis=1)
    return [f"{c} of {codes.shape[1]}" for c in counts]


def study_image(root: Path, folder: str, study: str) -> str | None:
    """The study's frontal DICOM file (ViewPosition PA or AP), else its first file by name; ``None`` if none."""
    import pydicom

    files = sorted((root / folder / study).glob("*.dcm"))
    for file in files:
        view = str(
            pydicom.dcmread(file, stop_before_pixels=True, specific_tags=["ViewPosition"]).get("ViewPosition", "")
        )
        if view.strip().upper() in ("PA", "AP"):
            return str(file.relative_to(root))
    return str(files[0].relative_to(root)) if files else None


def read_release(
    root: Path, layout: ReleaseLayout, labels: Sequence[str], merge_agree_mostly: bool = True
) -> ReaderStudy:
    """The studies of the release's label table (the reference is the table's labels: the readers' majority)."""
    path = root / layout.table
    table = read_text_table(path)
    unknown = [label for label in layout.labels if label not in labels]
    if unknown:
        raise ValueError(f"release.labels: {', '.join(unknown)} are not benchmark labels ({', '.join(labels)})")
    require_columns(path, table, [layout.id, layout.agreement, *layout.ratings, layout.path, layout.patient,
                                  layout.subset])  # fmt: skip
    duplicated = table[layout.id].duplicated()
    if duplicated.any():
        raise BadInput(f"{path} line {int(table.index[duplicated][0]) + 2}: study "
                       f"{table[layout.id][duplicated].iloc[0]} appears twice")  # fmt: skip
    table = table.sort_values(layout.id, ignore_index=True)
    names = tuple(label for label in labels if layout.labels.get(label) in table.columns)
    if not names:
        raise BadInput(
            f"{path}: none of the label columns of release.labels is there ({', '.join(layout.labels.values())})"
        )
    reference = np.stack([parse_reads(path, table, layout.labels[label]) for label in names], axis=1)
    studies = pd.DataFrame({"study_id": table[layout.id]})
    notes = [f"{len(table)} studies from {layout.table}; reference: the release's labels (the readers' majority)"]
    if layout.path:
        studies["path"] = table[layout.path]
    else:
        found = {study: study_image(root, layout.images, study) for study in studies["study_id"]}
        without = [study for study, file in found.items() if file is None]
        if without:
            raise BadInput(f"{root / layout.images}: no DICOM file for {len(without)} study(ies), e.g. "
                           f"{layout.images}/{without[0]}/*.dcm")  # fmt: skip
        studies["path"] = studies["study_id"].map(found)
        several = sum(len(list((root / layout.images / s).glob("*.dcm"))) > 1 for s in studies["study_id"])
        if several:
            notes.append(f"{several} studies have several DICOM files: the frontal one (PA/AP) is scored")
    check_images(root, path, studies["path"].tolist())
    studies["patient_id"] = table[layout.patient] if layout.patient else studies["study_id"]
    ratings = rating_codes(path, table, layout.ratings) if layout.ratings else None
    if ratings is not None:
        studies["stratum"] = rating_strata(ratings, merge_agree_mostly)
        notes.append("agreement level: readers rating Agree all" + (
            " (Agree mostly merged into Disagree, as in the paper)" if merge_agree_mostly else " or Agree mostly"))  # fmt: skip
    elif layout.agreement:
        levels = []
        for i, value in enumerate(table[layout.agreement]):
            try:
                levels.append(agreement_stratum(value))
            except ValueError:
                raise BadInput(f"{path} line {i + 2}, column {layout.agreement}: agreement {value!r} is not a "
                               f"reader count such as 3, 3/3 or '3 of 3'") from None  # fmt: skip
        studies["stratum"] = levels
    else:
        studies["stratum"] = "all"
        notes.append("no agreement level in the table: one stratum")
    if layout.subset:
        studies["subset"] = table[layout.subset]
    used = {layout.id, *layout.labels.values(), layout.agreement, *layout.ratings, layout.path, layout.patient,
            layout.subset}  # fmt: skip
    for column in table.columns:  # the release's other columns (view, site, ...) stay with their study
        if column not in used and column not in studies.columns:
            studies[column] = table[column].to_numpy()
    absent = {label: f"{path.name} has no column {layout.labels[label]}" if label in layout.labels
              else "release.labels names no column for it" for label in labels if label not in names}  # fmt: skip
    notes.append("per-reader 0/1 reads are not in the release table: the readers' label kappa needs the readers "
                 "layout")  # fmt: skip
    no_ratings = "" if ratings is not None else (
        f"{path.name} has no per-reader rating columns (release.ratings is empty), only the agreement level")  # fmt: skip
    return ReaderStudy(studies, names, reference, absent=absent, notes=notes, ratings=ratings,
                       raters=tuple(layout.ratings), no_ratings=no_ratings, source=path.name)  # fmt: skip
