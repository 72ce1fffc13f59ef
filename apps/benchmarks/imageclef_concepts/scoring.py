"""ImageCLEFmedical Caption concept detection (ROCOv2, 2024 and 2025): ground truth, run files and the official F1.

Each image carries a set of UMLS CUIs. Ground-truth tables are CSV ``ID,CUIs`` (gzip or plain) with the CUIs of an
image separated by ``;``; the manually validated tables (``*_concepts_manual.csv``) have the same form and may leave
the CUIs cell empty.

Source of the rules: the organisers' published evaluator, ``concept_detection/evaluator.py`` of the ImageCLEFmedical
Caption 2025 evaluation code (``ConceptEvaluator``; GitHub ``taubsity/clef-caption-evaluation``), whose rules are
those of 2024. It was read for reference only; nothing here is copied from it.

Run file (:func:`read_run`), each rule as the evaluator applies it:

* a CSV line ``<image id>,<cui1>;<cui2>;...``; a line of one field (the id alone) predicts no concept;
* a row whose first cell contains ``ID`` (case-sensitive) is a header and is skipped; no header is required;
* a line of more than 2 fields, an id not in the test set, an id given twice, more than :data:`MAX_CONCEPTS`
  (100) concepts on a line and the same concept twice on a line are errors;
* the run must contain every test id: a run missing images is rejected, never scored as zeros;
* concepts are stripped of surrounding spaces and compared upper-cased; the image id is taken as written.

Where this module differs from the evaluator (all stricter or clearer; none changes the score of a file that both
accept):

* an empty concept inside a non-empty cell (``C1;;C2``, ``C1;``) is an error here; the evaluator keeps ``""`` as a
  concept, which counts as a false positive and silently lowers that image's F1. A cell that is empty or blank
  altogether (``id,``) means no concept, as it scores in the evaluator;
* duplicate concepts are detected after upper-casing (``c0000001;C0000001`` is an error); the evaluator compares
  them as written (the pair scores as one concept there);
* a row whose first cell contains ``ID`` but *is* a test id is data here; the evaluator would skip it (no ROCOv2
  id contains ``ID``);
* a blank line is a named error (the evaluator fails on it with an ``IndexError``);
* line numbers are the file's physical, 1-based lines (header included); the evaluator counts data rows only;
* a file starting with a UTF-8 byte-order mark is read as if it had none; gzip run files are read too.

Scores (:func:`concept_f1`, :func:`per_image_f1`):

* **primary**: for each image, binary F1 between its predicted and true concept sets, as sklearn's ``f1_score``
  over the union of both sets gives it, i.e. ``2|T∩P| / (|T| + |P|)`` (an empty prediction against a non-empty
  truth gives 0). Images whose true set is empty are left out: the mean is over the images with a non-empty truth;
* **secondary**: the same on the manually validated table, with both the predicted and the true concepts first
  filtered to an allowed set; images whose *filtered* true set is empty are left out. The 2025 evaluator
  hard-codes 15 CUIs (:data:`MANUAL_2025`); the allowed set is a parameter here, and
  :func:`manual_vocabulary` gives every CUI of a manual table instead (ROCOv2's manual tables also hold the
  projection concepts C1999039 "AP" and C1996865 "PA", and C0205106, C0205129, C0037005, none of which
  :data:`MANUAL_2025` has; its C0920367, optical coherence tomography, is in none of the ROCOv2 tables).

Two notes on the evaluator's literal code. Its primary score means to leave empty-truth images out, but as
written an empty cell loads as the one concept ``""``, so such an image would count as a 0 there; the ROCOv2
primary tables have no empty cell, so the intent (implemented here) and the code agree on them. And when every
image is left out the evaluator divides by zero; here the mean is NaN, with a warning saying why.

Ground truth (:func:`read_concepts`) is checked as a data contract: every CUI matches ``C`` + 7 digits
(case-insensitive), no id appears twice, the file has at least one row, each row has exactly the two fields.

:func:`write_run` writes a run in this format (no header unless asked: the format is the bare ``id,cuis`` line,
the evaluator only tolerates a header) and reads it back with :func:`read_run`, so every file it leaves is valid.
:func:`frequency_prior` is the constant baseline: the most frequent training concepts, predicted for every image.
"""

from __future__ import annotations

import csv
import gzip
import io
import os
import re
import warnings
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

import numpy as np

CUI_PATTERN = re.compile(r"C\d{7}", re.IGNORECASE)
MAX_CONCEPTS = 100  # per image in a run file (the evaluator's max_num_concepts)
MANUAL_2025 = frozenset(
    {
        "C0002978", "C0040405", "C0024485", "C0032743", "C0041618",
        "C1306645", "C1140618", "C0037949", "C0030797", "C0023216",
        "C0037303", "C0817096", "C0006141", "C0000726", "C0920367",
    }
)  # fmt: skip
"""The 15 manually validated CUIs the 2025 evaluator's secondary score keeps (its ``allowed_concepts``)."""

Table = Mapping[str, Iterable[str]]


class ConceptFileError(ValueError):
    """A ground-truth or run file that breaks the format; the message names the file, the line and the value."""


# --------------------------------------------------------------------------------------------------- reading


@contextmanager
def _rows(path: Path) -> Iterator:
    """A CSV reader over ``path``, gzip or plain (told apart by the gzip magic bytes, not the name)."""
    with open(path, "rb") as raw:
        gzipped = raw.read(2) == b"\x1f\x8b"
    stream = gzip.open(path, "rb") if gzipped else open(path, "rb")  # noqa: SIM115 (closed below)
    try:
        yield csv.reader(io.TextIOWrapper(stream, encoding="utf-8-sig", newline=""))
    finally:
        stream.close()


def _error(path: Path, line: int | None, message: str) -> ConceptFileError:
    return ConceptFileError(f"{path}, line {line}: {message}" if line is not None else f"{path}: {message}")


def read_concepts(path: str | Path) -> dict[str, frozenset[str]]:
    """A ground-truth table ``ID,CUIs`` as ``{image id: frozenset of upper-cased CUIs}`` in file order.

    A first row whose first cell contains ``ID`` is the header. An empty CUIs cell is an empty set (the manual
    tables have them). Raises :class:`ConceptFileError` for a row without exactly two fields, an empty id, a CUI
    not of the form ``C`` + 7 digits, an id given twice and a file with no row.
    """
    path = Path(path)
    table: dict[str, frozenset[str]] = {}
    first_line: dict[str, int] = {}
    with _rows(path) as reader:
        for index, row in enumerate(reader):
            line = reader.line_num
            if index == 0 and row and "ID" in row[0]:
                continue
            if len(row) != 2:
                raise _error(path, line, f"expected 2 fields (ID,CUIs), found {len(row)}: {row!r}")
            image_id, cell = row
            if not image_id:
                raise _error(path, line, f"empty image id in {row!r}")
            if image_id in table:
                raise _error(path, line, f"image id {image_id!r} given twice (first on line {first_line[image_id]})")
            concepts = []
            if cell.strip():
                for token in cell.split(";"):
                    if not CUI_PATTERN.fullmatch(token.strip()):
                        raise _error(path, line, f"malformed CUI {token!r} for {image_id!r} (expected C + 7 digits)")
                    concepts.append(token.strip().upper())
            table[image_id] = frozenset(concepts)
            first_line[image_id] = line
    if not table:
        raise _error(path, None, "no rows (an empty ground-truth table)")
    return table


def read_run(path: str | Path, test_ids: Iterable[str]) -> dict[str, tuple[str, ...]]:
    """A run file as ``{image id: predicted concepts (stripped, upper-cased, in file order)}``, in file order.

    Applies the run-file rules of the module docstring against ``test_ids`` and raises :class:`ConceptFileError`
    naming the file and the 1-based line (and the offending value) at the first broken one.
    """
    path = Path(path)
    ids = list(test_ids)
    test = set(ids)
    if not test:
        raise ValueError("test_ids is empty: a run can only be read against the test set's ids")
    run: dict[str, tuple[str, ...]] = {}
    first_line: dict[str, int] = {}
    with _rows(path) as reader:
        for row in reader:
            line = reader.line_num
            if not row:
                raise _error(path, line, "blank line (each line is <image id>,<cui1>;<cui2>;...)")
            if "ID" in row[0] and row[0] not in test:
                continue  # a header, as the evaluator tells one
            if len(row) > 2:
                raise _error(
                    path, line, f"{len(row)} fields {row!r}: a line is <image id> or <image id>,<cui1>;<cui2>;..."
                )
            image_id = row[0]
            if image_id not in test:
                raise _error(path, line, f"image id {image_id!r} is not in the test set")
            if image_id in run:
                raise _error(path, line, f"image id {image_id!r} given twice (first on line {first_line[image_id]})")
            concepts: tuple[str, ...] = ()
            if len(row) == 2 and row[1].strip():
                concepts = tuple(token.strip().upper() for token in row[1].split(";"))
                if "" in concepts:
                    raise _error(path, line, f"empty concept in {row[1]!r} for {image_id!r} (a stray ';')")
                if len(concepts) > MAX_CONCEPTS:
                    raise _error(
                        path, line, f"{len(concepts)} concepts for {image_id!r}; at most {MAX_CONCEPTS} per image"
                    )
                repeated = sorted(concept for concept, n in Counter(concepts).items() if n > 1)
                if repeated:
                    raise _error(path, line, f"concept {repeated[0]!r} given more than once for {image_id!r}")
            run[image_id] = concepts
            first_line[image_id] = line
    missing = [image_id for image_id in ids if image_id not in run] if len(run) != len(test) else []
    if missing:
        shown = ", ".join(repr(image_id) for image_id in missing[:5])
        raise _error(
            path,
            None,
            f"the run has {len(run)} of the {len(test)} test images; {len(missing)} missing ({shown}"
            f"{', ...' if len(missing) > 5 else ''}): a run must give a line for every test image",
        )
    return run


# --------------------------------------------------------------------------------------------------- writing


def write_run(
    path: str | Path, predictions: Mapping[str, Iterable[str]], test_ids: Iterable[str], *, header: bool = False
) -> dict[str, tuple[str, ...]]:
    """Write ``predictions`` as a run file and return it as :func:`read_run` reads it back.

    One line per test id, in ``test_ids`` order; each image's concepts are stripped, upper-cased and de-duplicated
    keeping the first occurrence (the caller's order otherwise); an image with none is written as its id alone.
    No header unless ``header`` (then ``ID,CUIs``). A name ending in ``.gz`` is gzip-compressed.

    Raises ``ValueError`` before anything is written when a test id has no prediction, a prediction's id is not a
    test id, ``test_ids`` repeats an id, a concept is not a CUI (``C`` + 7 digits) or an image has more than
    :data:`MAX_CONCEPTS`. The file is written beside ``path`` under a temporary name, read back with
    :func:`read_run` and only then moved to ``path``, so no invalid file is ever left there.
    """
    path = Path(path)
    ids = list(test_ids)
    if not ids:
        raise ValueError("test_ids is empty")
    repeated = [image_id for image_id, n in Counter(ids).items() if n > 1]
    if repeated:
        raise ValueError(f"test_ids repeats {repeated[:5]}")
    missing = [image_id for image_id in ids if image_id not in predictions]
    if missing:
        raise ValueError(f"{len(missing)} test ids have no prediction (e.g. {missing[:5]}); a run needs every one")
    extra = sorted(set(predictions) - set(ids))
    if extra:
        raise ValueError(f"{len(extra)} predicted ids are not test ids (e.g. {extra[:5]})")
    lines: list[list[str]] = []
    for image_id in ids:
        concepts = list(dict.fromkeys(str(concept).strip().upper() for concept in predictions[image_id]))
        bad = [concept for concept in concepts if not CUI_PATTERN.fullmatch(concept)]
        if bad:
            raise ValueError(f"{image_id!r}: {bad[0]!r} is not a CUI (C + 7 digits)")
        if len(concepts) > MAX_CONCEPTS:
            raise ValueError(f"{image_id!r}: {len(concepts)} concepts; a run allows at most {MAX_CONCEPTS}")
        lines.append([image_id, ";".join(concepts)] if concepts else [image_id])
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        opener = gzip.open if path.name.endswith(".gz") else open
        with opener(temporary, "wt", encoding="utf-8", newline="") as handle:
            writer = csv.writer(handle, lineterminator="\n")
            if header:
                writer.writerow(["ID", "CUIs"])
            writer.writerows(lines)
        written = read_run(temporary, ids)
        expected = {line[0]: tuple(line[1].split(";")) if len(line) == 2 else () for line in lines}
        if written != expected:  # cannot happen for CUIs and a CSV writer; guards the round trip itself
            raise ConceptFileError(f"{path}: the run read back differs from the predictions written")
        os.replace(temporary, path)
    finally:
        temporary.unlink(missing_ok=True)
    return written


# --------------------------------------------------------------------------------------------------- scoring


def image_f1(true: set[str] | frozenset[str], predicted: set[str] | frozenset[str]) -> float:
    """Binary F1 of one image's predicted set against its true set: ``2|T∩P| / (|T| + |P|)``.

    That is sklearn's ``f1_score(average="binary")`` over the union of both sets, as the evaluator computes it; an
    empty prediction scores 0. An empty true set gives NaN: such an image is left out of the mean, not scored.
    Compares the strings as given (normalising case is the caller's: :func:`per_image_f1` does it).
    """
    true, predicted = set(true), set(predicted)
    if not true:
        return float("nan")
    return 2 * len(true & predicted) / (len(true) + len(predicted))


def _normalised(concepts: Iterable[str], allowed: frozenset[str] | None) -> set[str]:
    out = {str(concept).strip().upper() for concept in concepts}
    return out if allowed is None else out & allowed


def per_image_f1(truth: Table, run: Table, allowed: Iterable[str] | None = None) -> tuple[tuple[str, ...], np.ndarray]:
    """Each image's F1 (:func:`image_f1`) in ``truth`` order, NaN for the images left out, for bootstrapping.

    ``allowed=None`` is the primary score's rule; with an allowed set (the secondary score) both the predicted and
    the true concepts are first filtered to it, and an image whose filtered truth is empty is left out (NaN).
    Concepts are compared stripped and upper-cased. ``run`` must have exactly the ids of ``truth`` (a run missing
    images is rejected, as the evaluator rejects it, rather than scored as zeros).
    """
    if not truth:
        raise ValueError("truth is empty: no image to score")
    missing = [image_id for image_id in truth if image_id not in run]
    if missing:
        raise ValueError(f"the run misses {len(missing)} of the {len(truth)} images (e.g. {missing[:5]})")
    extra = [image_id for image_id in run if image_id not in truth]
    if extra:
        raise ValueError(f"the run has {len(extra)} images that are not in the truth (e.g. {extra[:5]})")
    keep = None if allowed is None else frozenset(str(concept).strip().upper() for concept in allowed)
    ids = tuple(truth)
    values = np.array([image_f1(_normalised(truth[i], keep), _normalised(run[i], keep)) for i in ids], dtype=np.float64)
    return ids, values


def concept_f1(truth: Table, run: Table, allowed: Iterable[str] | None = None) -> float:
    """The challenge score: mean per-image F1 over the images not left out (see :func:`per_image_f1`).

    Primary score with ``allowed=None`` on the full table; secondary score with ``allowed`` (e.g.
    :data:`MANUAL_2025`) on the manual table. When every image is left out (no non-empty truth) the mean is
    undefined: NaN is returned with a ``RuntimeWarning`` saying so (the evaluator would divide by zero).
    """
    _, values = per_image_f1(truth, run, allowed)
    scored = values[~np.isnan(values)]
    if scored.size == 0:
        which = "true" if allowed is None else "allowed-filtered true"
        warnings.warn(
            f"no image has a non-empty {which} concept set: every image is left out and the mean F1 is undefined (NaN)",
            RuntimeWarning,
            stacklevel=2,
        )
        return float("nan")
    return float(scored.mean())


# --------------------------------------------------------------------------------------------------- baselines


def manual_vocabulary(table: Mapping[str, Iterable[str]]) -> frozenset[str]:
    """Every CUI (upper-cased) appearing in a table, e.g. a manual ground truth: an alternative allowed set."""
    return frozenset(str(concept).strip().upper() for concepts in table.values() for concept in concepts)


def frequency_prior(train: Mapping[str, Iterable[str]], k: int | None = None) -> tuple[str, ...]:
    """The ``k`` concepts on most training images, most frequent first (ties: CUI order), as a constant baseline.

    ``k=None`` takes the median number of concepts per training image, rounded half up (3 on ROCOv2's train).
    Each image counts a concept once.
    """
    if not train:
        raise ValueError("train is empty")
    sets = [{str(concept).strip().upper() for concept in concepts} for concepts in train.values()]
    if k is None:
        k = int(np.floor(np.median([len(concepts) for concepts in sets]) + 0.5))
    if k < 0:
        raise ValueError(f"k must be >= 0, got {k}")
    counts = Counter(concept for concepts in sets for concept in concepts)
    ranked = sorted(counts, key=lambda concept: (-counts[concept], concept))
    return tuple(ranked[:k])
