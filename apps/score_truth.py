"""The ground truth ``make score`` scores against, and which test each row belongs to.

Two kinds of file are ground truth, told apart by their columns:

- a platform manifest (``image_id``, ``path``, ``split``, ...: what every adapter writes, docs/rules.md §6): the
  rows of ``--split``, their ``source`` column when there is one;
- the challenge's own label table as released (``configs/data/<data>.yaml``'s ``source`` block says how it is
  spelt: the id column ``ImageID``, the split column and the release's split names, the organisers' class
  spelling), or the release folder holding it (one table, or one table per split). The release's split
  information is the source of truth for internal and external: rows of an ``external_splits`` split (the NIH
  ``external_test``) are the external test, every other test row the internal one (PadChest-GR).

Why the release table is read here rather than through the adapter: scoring needs labels and ids only, and the
organisers' table comes without the images an adapter checks, so a team scores a file without a local copy of
the test images.

Which centre is internal is a definition (docs/rules.md §1): the data config's ``internal_source``. With ``--data``
that config's; otherwise the ``internal_source`` of the project's data configs that names one of the file's
sources, when exactly one does.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from pathlib import Path

import numpy as np
import pandas as pd
from omegaconf import OmegaConf

from evaluation.prediction_columns import ID_COLUMN, label_columns
from training.config_files import CONFIGS
from training.data.adapters.table import CXRLT_SPLIT_NAMES, split_key
from training.data.findings import KNOWN_FINDINGS
from training.data.manifest import load_manifest
from training.errors import UserError

#: The data config whose release table ``make score`` reads when none is named.
RELEASE_DATA = "cxrlt2026"
MANIFEST_COLUMNS = frozenset({ID_COLUMN, "path", "split"})


class TruthError(UserError):
    """Ground truth that cannot be scored against; the message names the file, line and column."""


@dataclass(frozen=True)
class Truth:
    """The scored rows: ``image_id`` plus one column per label (1, 0, NaN for not labelled), each row's source
    (None when the file has none), and the internal source (None when none is defined for these sources)."""

    frame: pd.DataFrame
    sources: np.ndarray | None
    internal: str | None
    described: str


@cache
def data_config(name: str) -> dict:
    """``configs/data/<name>.yaml`` as plain values, interpolations (``${data.root}``) left as text (read once)."""
    path = CONFIGS / "data" / f"{name}.yaml"
    if not path.is_file():
        names = sorted(p.stem for p in path.parent.glob("*.yaml"))
        raise TruthError(f"--data {name}: no {path}; data configs: {names}")
    return OmegaConf.to_container(OmegaConf.load(path), resolve=False)


def internal_source(sources: np.ndarray | None, data: str | None) -> str | None:
    """The internal source of these rows by definition (module docstring), or None."""
    if sources is None:
        return None
    present = set(sources)
    if data is not None:
        value = data_config(data).get("internal_source")
        return str(value) if value in present else None
    named = {str(value) for p in (CONFIGS / "data").glob("*.yaml")
             if (value := data_config(p.stem).get("internal_source")) not in (None, "")}  # fmt: skip
    found = sorted(named & present)
    return found[0] if len(found) == 1 else None


def read_truth(path: Path, labels: list[str], split: str, data: str | None = None) -> Truth:
    """The ground truth of ``split`` in ``path`` (a manifest, a release table or a release folder) for ``labels``.

    Raises:
        TruthError / ManifestError: a missing file, a table without the id or split column, an unknown split
            name, a class column missing, or a label cell that is not 0, 1 or empty; each names file, line, column.
    """
    path = Path(path)
    if not path.exists():
        raise TruthError(f"ground truth not found: {path}")
    if path.is_file():
        try:
            header = pd.read_csv(path, nrows=0).columns
        except (pd.errors.EmptyDataError, pd.errors.ParserError, UnicodeDecodeError) as error:
            raise TruthError(f"{path}: not a readable CSV table: {error}") from None
        if set(header) >= MANIFEST_COLUMNS:
            return _manifest_truth(path, labels, split, data)
    return _release_truth(path, labels, split, data or RELEASE_DATA)


def _manifest_truth(path: Path, labels: list[str], split: str, data: str | None) -> Truth:
    # Only the scored split must have images: an organisers' test-only manifest scores as well as a full one.
    manifest = load_manifest(path, labels, KNOWN_FINDINGS, check_files=False, splits=(split,),
                             refused="nothing was scored")  # fmt: skip
    rows = manifest.split(split)
    sources = rows["source"].astype(str).to_numpy() if "source" in rows else None
    return Truth(rows, sources, internal_source(sources, data), f"{path} [{split}]")


def _release_tables(path: Path, source: dict, names: dict[str, str]) -> dict[str | None, Path]:
    """``{release split or None: table path}``: the file itself; in a folder the config's ``table`` (one table, or
    one per split), else one ``<release split>_labels.csv`` per split (the config's one-table-per-split layout)."""
    if path.is_file():
        return {None: path}
    table = source.get("table")
    tables = table if isinstance(table, dict) else {None: table}
    if all((path / str(name)).is_file() for name in tables.values()):
        return {split: path / str(name) for split, name in tables.items()}
    per_split = {f.name[: -len("_labels.csv")]: f for f in sorted(path.glob("*_labels.csv"))}
    per_split = {split: file for split, file in per_split.items() if split_key(split) in names}
    if not per_split:
        raise TruthError(f"{path}: no {sorted(map(str, tables.values()))} and no <split>_labels.csv (the release's "
                         "label table(s), configs/data's source.table)")  # fmt: skip
    return per_split


def _release_truth(path: Path, labels: list[str], split: str, data: str) -> Truth:
    source = data_config(data).get("source") or {}
    id_column, split_column = source.get("id_column", "ImageID"), source.get("split_column")
    names = {split_key(k): v for k, v in (source.get("split_names") or CXRLT_SPLIT_NAMES).items()}
    external = {split_key(s) for s in source.get("external_splits") or ()}
    inside, outside = source.get("source_label", "padchest"), source.get("external_source", "nih")
    frames = []
    for given, file in _release_tables(path, source, names).items():
        table = pd.read_csv(file, dtype=str, keep_default_na=False)
        if id_column not in table:
            raise TruthError(f"{file}: line 1: no id column {id_column!r} (columns: {list(table.columns)[:8]}); "
                             f"neither a manifest ({sorted(MANIFEST_COLUMNS)}) nor the release's table ({data})")  # fmt: skip
        if given is None and (split_column is None or split_column not in table):
            raise TruthError(f"{file}: line 1: no split column {split_column!r}: the release's split information "
                             "says which rows are the internal and the external test")  # fmt: skip
        release = table[split_column] if given is None else pd.Series(given, index=table.index)
        keys = release.map(split_key)
        unknown = keys[~keys.isin(names)]
        if len(unknown):
            line = int(unknown.index[0]) + 2
            raise TruthError(f"{file}: line {line}, column {split_column!r}: unknown split {release[unknown.index[0]]!r}"
                             f" (known: {sorted(names)})")  # fmt: skip
        rows = table[keys.map(names) == split]
        frames.append((file, rows, keys[rows.index].isin(external).map({True: outside, False: inside})))
    truth, origins = [], []
    for file, rows, sources in frames:
        found, missing = label_columns(rows.columns, labels)
        if missing and len(rows):
            raise TruthError(f"{file}: line 1: no column for the class(es) {missing} (any spelling); the table "
                             f"has {[c for c in rows.columns if c not in (id_column, split_column)][:8]}")  # fmt: skip
        part = pd.DataFrame({ID_COLUMN: rows[id_column].astype(str).to_numpy()})
        for label, column in found.items():
            part[label] = _labels(rows[column], file, column)
        truth.append(part)
        origins.append(sources.to_numpy())
    frame = pd.concat(truth, ignore_index=True) if truth else pd.DataFrame(columns=[ID_COLUMN, *labels])
    if len(frame) == 0:
        raise TruthError(f"{path}: no row of the release's splits maps to {split!r} (configs/data/{data}.yaml "
                         "split_names)")  # fmt: skip
    sources = np.concatenate(origins).astype(str)
    return Truth(frame, sources, internal_source(sources, data), f"{path} [{split}, {data} release table]")


def _labels(cells: pd.Series, file: Path, column: str) -> np.ndarray:
    """0/1 label cells as floats, empty as NaN (not labelled); anything else is named by line and column."""
    text = cells.str.strip()
    values = pd.to_numeric(text.where(text != ""), errors="coerce")
    bad = (text != "") & ~values.isin((0, 1))
    if bad.any():
        row = bad[bad].index[0]
        raise TruthError(f"{file}: line {int(row) + 2}, column {column!r}: {cells[row]!r} is not a label (1, 0 or "
                         "empty for not labelled)")  # fmt: skip
    return values.to_numpy(dtype=float)
