"""PadChest's own label table (Bustos et al. 2020, all 160,861 rows as released) as a CXR-LT 2026 manifest.

Public entry points (kept stable for other tools, e.g. a full-size rehearsal release built from it):
``PadChestSource(...).prepare()`` (``build()`` gives the rows before splits, ``summary`` what was kept out and
why), and :func:`parse_labels` / :func:`roll_up` on a bare ``Labels`` column.

The defaults reproduce the images and labels of the organisers' ``CXRLT_2026_training.csv``, built from this same
table, so PadChest images added to a CXR-LT run carry the labels the challenge scores. ``Removal.csv`` images are
dropped before any other rule, so no later choice can bring one back. A class no PadChest name feeds is written
empty ("not labelled"), never negative. Every rule: docs/data.md, "PadChest's own table".
"""

from __future__ import annotations

import ast
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from training.data.adapters.base import UNASSIGNED, AdapterError, AdapterSource
from training.data.adapters.cxrlt2026_files import REMOVAL, release_file, removal_ids
from training.data.adapters.padchest_hierarchy import EXCLUDE, ROLLUP, SUBOPTIMAL, pairs
from training.data.adapters.spreadsheets import id_problems, raise_if
from training.data.findings import CXRLT_FINDINGS
from training.data.manifest import csv_line, listed
from training.data.splits import patient_split

log = logging.getLogger(__name__)

TABLE_GLOB = "PADCHEST_chest_x_ray_images_labels_*.csv*"
COLUMNS = ("ImageID", "ImageDir", "StudyID", "PatientID", "Projection", "MethodLabel", "Labels")
#: ``data.source.label_method`` -> the ``MethodLabel`` values kept.
LABEL_METHODS: dict[str, tuple[str, ...]] = {
    "all": ("Physician", "RNN_model"),
    "physician": ("Physician",),
    "rnn": ("RNN_model",),
}
#: The release's projections -> manifest view (``""``: no view; None: kept out). The data config's ``views``
#: overrides it. Every projection is kept because the organisers' training table keeps every one.
VIEWS: dict[str, str | None] = {
    "PA": "PA", "AP": "AP", "AP_horizontal": "AP Supine", "L": "LATERAL", "COSTAL": "COSTAL", "EXCLUDE": "", "UNK": "",
}  # fmt: skip
#: ``data.source.unlabelled``: what becomes of a row that names no finding.
UNLABELLED = ("zeros", "drop")
REMOVAL_REASON = "in Removal.csv"


@dataclass
class ParsedLabels:
    """The ``Labels`` column read: one name per row of ``names`` (indexed by table row), and what failed.

    Attributes:
        names: the stripped, non-empty names, index = table row (a row repeats once per name).
        unparsed: table rows whose value is not a Python list of strings.
        empty_names: table rows that hold an empty name (one entry per empty name).
        no_names: parsed rows with no non-empty name at all.
    """

    names: pd.Series
    unparsed: pd.Index
    empty_names: pd.Index
    no_names: pd.Index


def _literal_list(text: str) -> list[str] | None:
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return None
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        return None
    return value


def parse_labels(labels: pd.Series) -> ParsedLabels:
    """Read every ``Labels`` cell; each distinct text is evaluated once (the release has ~29k for 160k rows)."""
    distinct = labels.drop_duplicates()
    lists = labels.map(dict(zip(distinct, map(_literal_list, distinct), strict=True)))
    unparsed = labels.index[lists.isna()]
    exploded = lists.drop(unparsed).explode().dropna().str.strip()
    empty = exploded == ""
    names = exploded[~empty]
    parsed = labels.index.difference(unparsed)
    return ParsedLabels(names=names, unparsed=unparsed, empty_names=exploded.index[empty],
                        no_names=parsed.difference(names.index.unique()))  # fmt: skip


def roll_up(names: pd.Series, index: pd.Index, classes=CXRLT_FINDINGS,
            rollup: Mapping[str, tuple[str, ...]] = ROLLUP) -> pd.DataFrame:  # fmt: skip
    """``(len(index), len(classes))`` 0/1 frame: a class is 1 where any of its children is named.

    A class that no name of ``rollup`` feeds is NaN throughout: the table says nothing about it.

    Raises:
        AdapterError: through the caller's check, never here; names outside ``rollup`` must be refused first.
    """
    mapping = pd.DataFrame(pairs(dict(rollup)), columns=["name", "label"])
    mapping = mapping[mapping["label"].isin(classes)]
    column = {label: i for i, label in enumerate(classes)}
    hits = pd.DataFrame({"row": names.index, "name": names.to_numpy()}).merge(mapping, on="name")
    values = np.zeros((len(index), len(classes)), dtype=np.float64)
    rows, columns = index.get_indexer(hits["row"]), hits["label"].map(column).to_numpy(dtype=np.intp)  # no hit: []
    values[rows, columns] = 1.0
    values[:, [column[c] for c in classes if c not in set(mapping["label"])]] = np.nan
    return pd.DataFrame(values, index=index, columns=list(classes))


@dataclass
class PadChestSummary:
    """What one build read and kept out, for the log, ``make data-check`` and ``<manifest>-unlabelled.csv``."""

    rows: int = 0
    kept: int = 0
    kept_out: dict[str, int] = field(default_factory=dict)  # reason -> rows, in the order they were applied
    removal: str | None = None  # the Removal.csv read, or None when data.source.removal is not set
    removal_listed: int = 0  # ImageIDs it lists (some may be absent from this table)
    unlabelled: dict[str, int] = field(default_factory=dict)  # reason -> rows written as all-zero rows
    excluded_kept: int = 0
    empty_names: int = 0
    suboptimal: int = 0
    methods: dict[str, int] = field(default_factory=dict)
    projections: dict[str, int] = field(default_factory=dict)
    listing: pd.DataFrame | None = None  # line, ImageID, PatientID, reason, Labels of every unlabelled row
    listing_path: Path | None = None

    def render(self, rows: int = 5) -> str:
        """The counts, then the first ``rows`` unlabelled rows with their line and ImageID."""
        lines = [f"{self.rows} rows read, {self.kept} in the manifest"]
        if self.removal is None:
            lines.append("  Removal.csv: not given (data.source.removal): nothing dropped for CXR-LT 2026")
        else:
            lines.append(f"  Removal.csv: {self.removal_listed} ImageIDs listed ({self.removal})")
        lines += [f"  kept out, {reason}: {count}" for reason, count in self.kept_out.items()]
        lines += [f"  unlabelled, {reason}: {count} (kept as all-zero rows)" for reason, count in
                  self.unlabelled.items()]  # fmt: skip
        if self.excluded_kept:
            lines.append(f"  labelled 'exclude', kept (drop_excluded=false): {self.excluded_kept}")
        lines.append(f"  empty label names ignored beside others: {self.empty_names}")
        lines.append(f"  suboptimal studies kept (column 'suboptimal'): {self.suboptimal}")
        lines.append("  MethodLabel: " + ", ".join(f"{k} {v}" for k, v in self.methods.items()))
        lines.append("  Projection: " + ", ".join(f"{k} {v}" for k, v in self.projections.items()))
        if self.listing is not None and len(self.listing):
            unlabelled = self.listing[self.listing["reason"] != "empty name ignored"]
            lines += [f"  line {r.line}, ImageID {r.ImageID!r}: {r.reason} (Labels {r.Labels!r})"
                      for r in unlabelled.head(rows).itertuples()]  # fmt: skip
            if 0 < rows < len(unlabelled):
                lines.append(f"  ... {len(unlabelled) - rows} more unlabelled rows")
        if self.listing_path is not None:
            lines.append(f"  every unlabelled row and empty name, with its line and ImageID: {self.listing_path}")
        return "\n".join(lines)


class PadChestSource(AdapterSource):
    """PadChest's released table as a manifest with the 36 CXR-LT 2026 classes (see the module docstring).

    Args:
        image_subdirs: True: images are ``<image_dir>/<ImageDir>/<ImageID>`` as released; False: one folder.
        views: Projection -> manifest view, None to keep that projection out; default :data:`VIEWS`.
        unlabelled: ``zeros`` (as in the organisers' table) or ``drop``; counted and listed either way.
        removal: the CXR-LT 2026 release folder or its ``Removal.csv``. None: nothing is dropped.
        stratify: iterative stratification over patients (tens of seconds at this size) instead of the
            order-independent hash split of :func:`training.data.splits.patient_split`.
    """

    extra_columns = ("study_id", "projection", "label_method", "suboptimal")

    def __init__(self, root: str, name: str = "padchest", table: str | None = None, image_dir: str = "",
                 image_subdirs: bool = True, views: Mapping[str, str | None] | None = None,
                 label_method: str = "all", unlabelled: str = "zeros", removal: str | None = None,
                 drop_excluded: bool = False, drop_suboptimal: bool = False, stratify: bool = False,
                 **kwargs):  # fmt: skip
        super().__init__(root, name, **kwargs)
        if label_method not in LABEL_METHODS:
            raise AdapterError(f"data.source.label_method={label_method!r}: expected one of {sorted(LABEL_METHODS)}")
        if unlabelled not in UNLABELLED:
            raise AdapterError(f"data.source.unlabelled={unlabelled!r}: expected one of {list(UNLABELLED)}")
        self.table, self.image_dir, self.image_subdirs = table, image_dir, image_subdirs
        self.views = dict(VIEWS if views is None else views)
        self.label_method, self.drop_excluded, self.drop_suboptimal = label_method, drop_excluded, drop_suboptimal
        self.unlabelled = unlabelled
        self.removal = None if removal in (None, "") else Path(removal).expanduser()
        self.stratify = stratify
        self.summary = PadChestSummary()
        self.table_only = False

    @property
    def labels(self) -> tuple[str, ...]:
        return CXRLT_FINDINGS

    def key(self) -> dict:
        return {**super().key(), "table": self.table, "image_dir": self.image_dir, "subdirs": self.image_subdirs,
                "views": self.views, "method": self.label_method, "drop_excluded": self.drop_excluded,
                "drop_suboptimal": self.drop_suboptimal, "stratify": self.stratify, "unlabelled": self.unlabelled,
                "removal": None if self.removal is None else str(self.removal.resolve())}  # fmt: skip

    @property
    def run_tags(self) -> dict[str, str]:
        """What the run records about the organisers' Removal.csv (read once the manifest is built): whether it was
        applied, and to how many of this table's rows."""
        if self.removal is None:
            return {"padchest.removal": "not given"}
        return {"padchest.removal": str(self.summary.removal or self.removal),
                "padchest.removed_in_removal": str(self.summary.kept_out.get(REMOVAL_REASON, 0))}  # fmt: skip

    @property
    def check_sections(self) -> dict[str, str]:
        """Sections ``make data-check`` prints before its counts."""
        return {"PadChest table": self.summary.render()}

    @property
    def table_only_note(self) -> str | None:
        """Why ``make data-check`` opens no image, or None when the images are there."""
        if not self.table_only:
            return None
        return (f"not checked: table only (no PNG under {self.root / self.image_dir}); the counts come from the "
                "label table alone; training needs the images")  # fmt: skip

    def table_path(self) -> Path:
        if self.table:
            return self.root / self.table
        found = sorted(self.root.glob(TABLE_GLOB))
        if not found:
            raise AdapterError(f"{self.root}: no {TABLE_GLOB} label table (set data.source.table)")
        return found[0]

    def prepare(self) -> Path:
        manifest = super().prepare()
        listing = manifest.with_name(f"{manifest.stem}-unlabelled.csv")
        self.summary.listing.to_csv(listing, index=False)
        self.summary.listing_path = listing
        return manifest

    def assign_splits(self, table: pd.DataFrame) -> pd.DataFrame:
        if self.stratify:
            return super().assign_splits(table)
        fractions = {"train": 1.0 - self.val_fraction - self.test_fraction, "val": self.val_fraction,
                     "test": self.test_fraction}  # fmt: skip
        table = table.reset_index(drop=True)
        table["split"] = patient_split(table["patient_id"].to_numpy(), {k: v for k, v in fractions.items() if v > 0},
                                       seed=self.seed)  # fmt: skip
        return table

    def build(self) -> pd.DataFrame:
        path = self.table_path()
        raw = self._read(path)
        summary = PadChestSummary(rows=len(raw))
        raw = self._drop_removal(raw, summary)
        summary.methods = raw["MethodLabel"].value_counts().to_dict()
        summary.projections = raw["Projection"].value_counts().to_dict()
        problems = id_problems(raw, "ImageID", path) + id_problems(raw, "PatientID", path, unique=False)
        unknown_views = raw.index[~raw["Projection"].isin(list(self.views))]
        problems += listed("unknown projections", [
            f"{path}, line {csv_line(i)}, column 'Projection': {raw.at[i, 'Projection']!r} is not in "
            f"data.source.views {sorted(self.views)} (map it to a view, or to null to keep it out)"
            for i in unknown_views])  # fmt: skip
        methods = {m for ms in LABEL_METHODS.values() for m in ms}
        problems += listed("unknown label methods", [
            f"{path}, line {csv_line(i)}, column 'MethodLabel': {raw.at[i, 'MethodLabel']!r} is not one of "
            f"{sorted(methods)}" for i in raw.index[~raw["MethodLabel"].isin(methods)]])  # fmt: skip

        parsed = parse_labels(raw["Labels"])
        unknown = parsed.names[~parsed.names.isin(list(ROLLUP))]
        problems += listed("unknown label names", [
            f"{path}, line {csv_line(i)}, column 'Labels': {name!r} is not in PadChest's roll-up table "
            "(training/data/adapters/padchest_hierarchy.py): map it to its classes or to () there"
            for i, name in unknown.items()])  # fmt: skip
        raise_if(problems, str(path))

        drop = self.unlabelled == "drop"
        fate = "unlabelled, kept out" if drop else "unlabelled, all-zero row"
        beside = parsed.empty_names[~parsed.empty_names.isin(parsed.no_names)]  # empty names beside real ones
        summary.listing = pd.concat([
            self._listing(raw, parsed.unparsed, f"Labels does not parse: {fate}"),
            self._listing(raw, parsed.no_names, f"no label name: {fate}"),
            self._listing(raw, beside.unique(), "empty name ignored"),
        ]).sort_values("line", kind="stable")  # fmt: skip
        summary.empty_names = len(beside)
        excluded = pd.Series(raw.index.isin(parsed.names.index[parsed.names == EXCLUDE]), index=raw.index)
        suboptimal = pd.Series(raw.index.isin(parsed.names.index[parsed.names == SUBOPTIMAL]), index=raw.index)
        unparsed, no_names = raw.index.isin(parsed.unparsed), raw.index.isin(parsed.no_names)

        reasons = {  # applied in this order; each row is counted under the first reason that keeps it out
            "Labels does not parse": unparsed & drop,
            "no label name": no_names & drop,
            "Projection mapped to null": raw["Projection"].map(self.views).isna().to_numpy(),
            f"MethodLabel not kept by label_method={self.label_method}":
                ~raw["MethodLabel"].isin(LABEL_METHODS[self.label_method]).to_numpy(),
            "labelled 'exclude'": excluded.to_numpy() & self.drop_excluded,
            "labelled 'suboptimal study'": suboptimal.to_numpy() & self.drop_suboptimal,
        }  # fmt: skip
        out = np.zeros(len(raw), dtype=bool)
        for reason, rows in reasons.items():
            fresh = rows & ~out
            if fresh.any():
                summary.kept_out[reason] = int(fresh.sum())
            out |= fresh
        keep = raw.index[~out]
        for reason, rows in {"Labels does not parse": unparsed, "no label name": no_names}.items():
            if not drop and (rows & ~out).any():
                summary.unlabelled[reason] = int((rows & ~out).sum())
        summary.excluded_kept = int((excluded.to_numpy() & ~out).sum())

        labels = roll_up(parsed.names[parsed.names.index.isin(keep)], keep)
        kept = raw.loc[keep]
        table = pd.DataFrame({
            "image_id": kept["ImageID"], "path": self._paths(kept), "split": UNASSIGNED,
            "patient_id": kept["PatientID"], "source": self.name, "view": kept["Projection"].map(self.views),
            "study_id": kept["StudyID"], "projection": kept["Projection"], "label_method": kept["MethodLabel"],
            "suboptimal": suboptimal[keep].astype(int).astype(str),
        })  # fmt: skip
        table = pd.concat([table, labels], axis=1)
        summary.kept, summary.suboptimal = len(table), int(suboptimal[keep].sum())
        self.summary = summary
        self.table_only = not self._has_images()
        log.info("%s: %s", self.name, summary.render(rows=0).replace("\n ", ";"))
        if len(parsed.unparsed) or len(parsed.no_names):
            log.warning("%s: %d row(s) whose Labels do not parse and %d with no label name: %s "
                        "(data.source.unlabelled=%s; listed in <manifest>-unlabelled.csv)", self.name,
                        len(parsed.unparsed), len(parsed.no_names),
                        "kept out" if drop else "written as all-zero rows", self.unlabelled)  # fmt: skip
        return table

    def _drop_removal(self, raw: pd.DataFrame, summary: PadChestSummary) -> pd.DataFrame:
        """``raw`` without the images of the organisers' ``Removal.csv``: dropped before any other rule, so that no
        later choice (unlabelled rows, views, splits) can bring one back; the index keeps each row's line."""
        if self.removal is None:
            log.warning("%s: data.source.removal is not set: the images of the organisers' Removal.csv are not "
                        "dropped, and training a CXR-LT 2026 submission on them disqualifies it", self.name)  # fmt: skip
            return raw
        removal = release_file(self.removal, REMOVAL)
        if not removal.is_file():
            raise AdapterError(f"data.source.removal={self.removal}: no {REMOVAL} there (give the CXR-LT 2026 "
                               "release folder or the file itself)")  # fmt: skip
        removed = removal_ids(removal)
        summary.removal, summary.removal_listed = str(removal), len(removed)
        hit = raw["ImageID"].isin(removed)
        summary.kept_out[REMOVAL_REASON] = int(hit.sum())
        log.info("%s: %d image(s) kept out, in %s (%d ImageIDs listed)", self.name, int(hit.sum()), removal,
                 len(removed))  # fmt: skip
        return raw[~hit]

    def _read(self, path: Path) -> pd.DataFrame:
        if not path.is_file():
            raise AdapterError(f"label table not found: {path}")
        try:
            header = pd.read_csv(path, nrows=0).columns
            missing = [c for c in COLUMNS if c not in header]
            if missing:
                raise AdapterError(f"{path}: missing column(s) {missing}; the table has {list(header)}")
            raw = pd.read_csv(path, dtype=str, keep_default_na=False, usecols=list(COLUMNS))
        except pd.errors.EmptyDataError:
            raise AdapterError(f"{path}: empty file, not even a header line") from None
        except (pd.errors.ParserError, UnicodeDecodeError, OSError, EOFError) as error:
            raise AdapterError(f"{path}: not a readable table: {error}") from None
        for column in ("ImageID", "ImageDir", "StudyID", "PatientID", "Projection", "MethodLabel"):
            raw[column] = raw[column].str.strip()
        return raw.reset_index(drop=True)

    def _paths(self, kept: pd.DataFrame) -> pd.Series:
        prefix = f"{self.image_dir.strip('/')}/" if self.image_dir.strip("/") else ""
        if self.image_subdirs:
            return prefix + kept["ImageDir"] + "/" + kept["ImageID"]
        return prefix + kept["ImageID"]

    def _has_images(self) -> bool:
        folder = self.root / self.image_dir
        return any(folder.glob("*.png")) or any(folder.glob("*/*.png"))

    @staticmethod
    def _listing(raw: pd.DataFrame, rows, reason: str) -> pd.DataFrame:
        rows = pd.Index(rows)
        return pd.DataFrame({"line": [csv_line(i) for i in rows], "ImageID": raw.loc[rows, "ImageID"].to_numpy(),
                             "PatientID": raw.loc[rows, "PatientID"].to_numpy(), "reason": reason,
                             "Labels": raw.loc[rows, "Labels"].to_numpy()})  # fmt: skip
