"""Grounding boxes: where a finding lies on a film, in pixels of a stated frame, checked before anything scores them.

A box is only meaningful next to the width and height it was drawn on: NIH drew its boxes on the 1024 px release
PNGs, while the copies a benchmark reads may be 512 px. A box read in the wrong frame still looks like a box and
silently scores every localisation as a miss, so every box table carries its frame (``frame_width``,
``frame_height``), is checked against it by :func:`validate_boxes`, and is moved to the size a model sees by
``Box.in_frame`` of the benchmark layer (each axis scaled on its own). Errors are a
:class:`~apps.benchmarks.framework.tables.DataContractError` naming the file, line, column and value.

``correspondence_id`` links boxes of one lesion across the prior and current film of a pair (CheXTemporal-style
grounding); it is empty when a box has no counterpart.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from apps.benchmarks.framework.tables import (
    DataContractError,
    as_text,
    cell,
    first_bad,
    line_of,
    match_vocabulary,
    parse_numbers,
    read_text_csv,
    require_columns,
)
from training.data.findings import NIH14_LABELS

BOX_COLUMNS: tuple[str, ...] = (
    "image_id", "path", "finding", "x", "y", "w", "h", "frame_width", "frame_height", "correspondence_id",
)  # fmt: skip
COORDINATES: tuple[str, ...] = ("x", "y", "w", "h")
#: How far (pixels of the box's frame) a box may overshoot its frame: annotation tools round edges outward.
EDGE_TOLERANCE = 1.0
#: NIH drew its boxes on the released PNGs, all 1024 x 1024 (stretched from the original films, whose sizes
#: ``OriginalImage[Width``/``Height]`` in ``Data_Entry`` give; the boxes are not in that frame).
NIH_BOX_FRAME: tuple[int, int] = (1024, 1024)
#: Box-file spelling -> the NIH label table's spelling of the same finding.
NIH_BOX_SPELLING: dict[str, str] = {"Infiltrate": "Infiltration"}


def validate_boxes(table: pd.DataFrame, source: str, findings: Sequence[str] | None = None) -> pd.DataFrame:
    """The box table in canonical form, or the first broken row as a named error.

    Refused: a missing column (``correspondence_id`` may be absent: empty), an empty ``image_id`` or ``path``, a
    coordinate or frame size that is not a number, a frame that is not a positive whole number of pixels, a width or
    height <= 0, a box reaching outside its frame by more than :data:`EDGE_TOLERANCE` pixels, and, when a vocabulary
    is given, a finding outside it (matched case-, space- and alias-insensitively, returned in its spelling).

    Returns:
        A copy with :data:`BOX_COLUMNS` first (coordinates float, frame int, ids and paths text), other columns after.
    """
    source = str(source)
    require_columns(source, table, [c for c in BOX_COLUMNS if c != "correspondence_id"])
    out = table.copy()
    for column in ("image_id", "path", "finding", "correspondence_id"):
        out[column] = as_text(out[column]) if column in out.columns else pd.Series("", index=out.index, dtype=object)
    for column in ("image_id", "path", "finding"):
        first_bad(source, out, (out[column] == "").to_numpy(), column, "empty cell ({value}); it is required")
    numbers = {column: parse_numbers(source, out, column) for column in (*COORDINATES, "frame_width", "frame_height")}
    for column, values in numbers.items():
        first_bad(source, out, np.isnan(values), column, "empty cell ({value}); a box needs all four coordinates "
                  "and its frame size")  # fmt: skip
    for column in ("frame_width", "frame_height"):
        values = numbers[column]
        first_bad(source, out, (values <= 0) | (values != np.round(values)), column,
                  "{value} is not a frame size (a positive whole number of pixels)")  # fmt: skip
    for column in ("w", "h"):
        first_bad(source, out, numbers[column] <= 0, column, "{value}: a box needs a positive width and height")
    x, y, w, h = (numbers[c] for c in COORDINATES)
    width, height = numbers["frame_width"], numbers["frame_height"]
    for column, bad, frame in (
        ("x", x < -EDGE_TOLERANCE, "left"), ("y", y < -EDGE_TOLERANCE, "top"),
        ("w", x + w > width + EDGE_TOLERANCE, "right"), ("h", y + h > height + EDGE_TOLERANCE, "bottom"),
    ):  # fmt: skip
        if bad.any():
            p = int(np.flatnonzero(bad)[0])
            raise DataContractError(
                f"{source} line {line_of(out, p)}, column {column}: {cell(out, column, p)!r} puts box "
                f"(x={x[p]:g}, y={y[p]:g}, w={w[p]:g}, h={h[p]:g}) outside the {frame} edge of its "
                f"{width[p]:g} x {height[p]:g} frame ({int(bad.sum())} such box(es)); coordinates are pixels of "
                f"frame_width x frame_height"
            )
    for column in COORDINATES:
        out[column] = numbers[column]
    out["frame_width"], out["frame_height"] = width.astype(int), height.astype(int)
    if findings is not None:
        out["finding"] = match_vocabulary(source, out, "finding", findings, "finding")
    return out[list(BOX_COLUMNS) + [c for c in out.columns if c not in BOX_COLUMNS]]


def release_file(root: Path, name: str) -> Path:
    """``root/name``, or its ``.gz`` copy (the label-only release folders keep the tables compressed)."""
    for candidate in (root / name, root / f"{name}.gz"):
        if candidate.is_file():
            return candidate
    raise DataContractError(f"{root / name}: file not found (nor {name}.gz)")


def read_nih_boxes(root: Path) -> pd.DataFrame:
    """The boxes of an NIH ChestX-ray14 release folder, in the 1024 px frame they were drawn on.

    Reads ``BBox_List_2017.csv`` by position (its header ``Image Index,Finding Label,Bbox [x,y,w,h],,,`` splits
    the box into four columns and adds three empty ones), spells ``Infiltrate`` as the label table does
    (``Infiltration``), and joins ``Data_Entry_2017_v2020.csv`` for the patient and the original film size (kept as
    ``original_width``/``original_height``, for information only: see :data:`NIH_BOX_FRAME`). Paths are
    ``images/<Image Index>``; the images are not opened (a label-only folder reads too).

    Returns:
        A validated box table, plus ``patient_id``, ``original_width``, ``original_height``.
    """
    root = Path(root)
    box_path = release_file(root, "BBox_List_2017.csv")
    entry_path = release_file(root, "Data_Entry_2017_v2020.csv")
    boxes, entries = read_text_csv(box_path), read_text_csv(entry_path)
    if len(boxes.columns) < 6:
        raise DataContractError(f"{box_path}: expected Image Index, Finding Label and the four box numbers "
                                f"(columns: {', '.join(boxes.columns)})")  # fmt: skip
    image, finding, *coordinates = list(boxes.columns[:6])
    require_columns(str(entry_path), entries, ["Image Index", "OriginalImage[Width", "Height]"])
    entries["original_width"] = parse_numbers(str(entry_path), entries, "OriginalImage[Width")
    entries["original_height"] = parse_numbers(str(entry_path), entries, "Height]")
    entries["Image Index"] = as_text(entries["Image Index"])
    entries = entries.drop_duplicates("Image Index").set_index("Image Index")
    names = as_text(boxes[image])
    first_bad(str(box_path), boxes, (names == "").to_numpy(), image, "empty cell ({value}); it is required")
    first_bad(str(box_path), boxes, ~names.isin(entries.index).to_numpy(), image,
              f"{{value}} has no row in {entry_path.name}")  # fmt: skip
    table = pd.DataFrame({"image_id": names, "path": "images/" + names}, index=boxes.index)
    table["finding"] = as_text(boxes[finding]).map(lambda v: NIH_BOX_SPELLING.get(v, v))
    for column, label in zip(COORDINATES, coordinates, strict=True):
        table[column] = parse_numbers(str(box_path), boxes, label)  # named by the file's own header
    table["frame_width"], table["frame_height"] = NIH_BOX_FRAME
    table["correspondence_id"] = ""
    matched = entries.loc[names]
    table["patient_id"] = as_text(matched["Patient ID"]).to_numpy() if "Patient ID" in matched.columns else ""
    table["original_width"] = matched["original_width"].to_numpy()
    table["original_height"] = matched["original_height"].to_numpy()
    vocabulary = [name for name in NIH14_LABELS if name != "No Finding"]
    return validate_boxes(table, str(box_path), vocabulary)


#: Findings CheXTemporal draws no boxes for (a diffuse finding has no region).
UNBOXED_FINDINGS: tuple[str, ...] = ("Edema",)
#: A box table of pairs says which film of the pair a box lies on.
PAIR_IMAGES: dict[str, str] = {"prior": "prior_path", "current": "path"}


def read_pair_boxes(path: Path, pairs: pd.DataFrame, findings: Sequence[str]) -> pd.DataFrame:
    """The boxes of a pair release (CheXTemporal layout), tied to their pairs and checked against the labels.

    One row per box: ``pair_id``, ``image`` (``prior`` or ``current``), ``finding``, ``x``, ``y``, ``w``, ``h``,
    ``frame_width``, ``frame_height`` (the frame the box was drawn in: CheXTemporal showed films with the shorter
    side at 1024 px) and an optional ``correspondence_id`` linking a region across the pair. On top of
    :func:`validate_boxes`: the pair must exist and carry that finding, a ``new`` finding has boxes only on the
    current film and a ``resolved`` one only on the prior (it is absent from the other), and
    :data:`UNBOXED_FINDINGS` have none.

    Returns:
        :data:`BOX_COLUMNS` (``image_id`` = ``path`` = the film's path) plus ``pair_id`` and ``image``.
    """
    source = str(path)
    table = read_text_csv(path)
    require_columns(source, table, ["pair_id", "image", "finding", *COORDINATES, "frame_width", "frame_height"])
    first_bad(source, table, ~table["image"].isin(list(PAIR_IMAGES)).to_numpy(), "image",
              "{value} is not prior or current")  # fmt: skip
    by_pair = pairs.drop_duplicates(["pair_id", "finding"]).set_index(["pair_id", "finding"])
    table["finding"] = match_vocabulary(source, table, "finding", findings, "finding")
    known = pd.MultiIndex.from_frame(table[["pair_id", "finding"]]).isin(by_pair.index)
    first_bad(source, table, ~known, "pair_id", "{value} has no pair with this box's finding in the pair manifest")
    first_bad(source, table, table["finding"].isin(UNBOXED_FINDINGS).to_numpy(), "finding",
              "{value} has no boxes in CheXTemporal (a diffuse finding)")  # fmt: skip
    label = np.array(
        [by_pair.loc[(p, f), "progression"] for p, f in zip(table["pair_id"], table["finding"], strict=True)]
    )
    first_bad(source, table, ((label == "new") & (table["image"] == "prior")).to_numpy(), "image",
              "{value}: a new finding is absent from the prior film, so it has no box there")  # fmt: skip
    first_bad(source, table, ((label == "resolved") & (table["image"] == "current")).to_numpy(), "image",
              "{value}: a resolved finding is absent from the current film, so it has no box there")  # fmt: skip
    films = [
        by_pair.loc[(p, f), PAIR_IMAGES[i]]
        for p, f, i in zip(table["pair_id"], table["finding"], table["image"], strict=True)
    ]
    table["image_id"], table["path"] = films, films
    return validate_boxes(table, source, findings)
