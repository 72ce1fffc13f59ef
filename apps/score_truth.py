"""The ground truth ``make score`` scores against, and which test each row belongs to.

Two kinds of file, told apart by their header: a platform manifest (the rows of ``--split``, docs/rules.md §6),
or a table in the organisers' layout (the rows whose ids the predictions hold, all of the internal source,
since the organisers' tables say nothing of centres). The latter is read here rather than through the adapter
because scoring needs labels and ids only: a team scores a file without a local copy of the images. Which
centre is internal is a definition (docs/rules.md §1): ``--data``'s ``internal_source``, else that of the one
project data config naming one of the file's sources.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import numpy as np
import pandas as pd
from omegaconf import OmegaConf

from evaluation.prediction_columns import ID_COLUMN, label_columns
from training.config_files import CONFIGS
from training.data.adapters.cxrlt2026_files import ID_COLUMNS, read_release_table
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


def read_truth(path: Path, labels: list[str], split: str, data: str | None = None,
               ids: Sequence[str] | None = None) -> Truth:  # fmt: skip
    """The ground truth of ``split`` in ``path`` (a manifest, or a table in the organisers' layout: of that table the
    rows in ``ids``, the predicted images) for ``labels``.

    Raises:
        TruthError / ManifestError: a missing file, a table without the id or split column, an unknown split
            name, a class column missing, or a label cell that is not 0, 1 or empty; each names file, line, column.
    """
    path = Path(path)
    if not path.is_file():
        raise TruthError(f"ground truth not found: {path} (a manifest, or a label table in the organisers' layout)")
    try:
        header = pd.read_csv(path, nrows=0).columns
    except (pd.errors.EmptyDataError, pd.errors.ParserError, UnicodeDecodeError) as error:
        raise TruthError(f"{path}: not a readable CSV table: {error}") from None
    if set(header) >= MANIFEST_COLUMNS:
        return _manifest_truth(path, labels, split, data)
    if tuple(header[: len(ID_COLUMNS)]) == ID_COLUMNS:
        return _organiser_truth(path, labels, ids, data)
    raise TruthError(f"{path}, line 1: neither a manifest ({sorted(MANIFEST_COLUMNS)}) nor a table in the organisers' "
                     f"layout ({','.join(ID_COLUMNS)}, then class columns); columns: {list(header)[:6]}")  # fmt: skip


def _manifest_truth(path: Path, labels: list[str], split: str, data: str | None) -> Truth:
    # Only the scored split must have images: an organisers' test-only manifest scores as well as a full one.
    manifest = load_manifest(path, labels, KNOWN_FINDINGS, check_files=False, splits=(split,),
                             refused="nothing was scored")  # fmt: skip
    rows = manifest.split(split)
    sources = rows["source"].astype(str).to_numpy() if "source" in rows else None
    return Truth(rows, sources, internal_source(sources, data), f"{path} [{split}]")


def _organiser_truth(path: Path, labels: list[str], ids: Sequence[str] | None, data: str | None) -> Truth:
    """A table in the organisers' layout: its rows the predictions name (all rows without ``ids``), one source."""
    table = read_release_table(path)
    classes = [c for c in table.columns if c not in ID_COLUMNS]
    if classes and not any(classes):
        raise TruthError(f"{path}, line 1: its class columns have no names (an evaluation list without labels); "
                         "score against a label table")  # fmt: skip
    found, missing = label_columns(classes, labels)
    if missing:
        raise TruthError(f"{path}, line 1: no column for the class(es) {missing} (any spelling); the table has "
                         f"{classes[:8]}{'...' if len(classes) > 8 else ''}")  # fmt: skip
    duplicated = table["ImageID"][table["ImageID"].duplicated()]
    if len(duplicated):
        raise TruthError(f"{path}, line {int(duplicated.index[0]) + 2}, column 'ImageID': {duplicated.iloc[0]!r} "
                         "appears twice")  # fmt: skip
    rows = table if ids is None else table[table["ImageID"].isin(set(map(str, ids)))]
    frame = pd.DataFrame({ID_COLUMN: rows["ImageID"].to_numpy()})
    for label, column in found.items():
        frame[label] = _labels(rows[column], path, column)
    if not len(frame):
        raise TruthError(f"{path}: none of the predicted ids is in this table")
    sources = np.full(len(frame), str(data_config(data or RELEASE_DATA).get("internal_source") or "padchest"))
    scored = f"{len(frame)} of its {len(table)} rows" if len(frame) < len(table) else f"all {len(table)} rows"
    return Truth(frame, sources, None, f"{path} [organisers' layout, {scored}]")


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
