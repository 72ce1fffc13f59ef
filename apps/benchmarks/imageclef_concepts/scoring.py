"""ImageCLEFmedical Caption concept detection (ROCOv2, 2024 and 2025): ground truth, run files and the official F1.

Each image carries a set of UMLS CUIs. Ground-truth tables are CSV ``ID,CUIs`` (gzip or plain) with the CUIs of an
image separated by ``;``; the manually validated tables (``*_concepts_manual.csv``) have the same form and may leave
the CUIs cell empty.

Source of the rules: the organisers' published evaluators, ``concept_detection/evaluator.py`` of the ImageCLEFmedical
Caption 2025 evaluation code (``ConceptEvaluator``; GitHub ``taubsity/clef-caption-evaluation``), unchanged in the
2026 code (``taubsity/clef-caption-evaluation-2026``), and the 2026 submission check
(``concept_detection/submission_check.py`` and that repository's README). They were read for reference only; nothing
here is copied from them.

Run file (:func:`read_run`), each rule as the evaluator applies it:

* a CSV line ``<image id>,<cui1>;<cui2>;...``; a line of one field (the id alone) or an empty cell predicts no
  concept;
* a row whose first cell contains ``ID`` (case-sensitive) is a header and is skipped; no header is required;
* a line of more than 2 fields, an id not in the test set, an id given twice, more than :data:`MAX_CONCEPTS`
  (100) concepts on a line and the same concept twice on a line are errors;
* the run must contain every test id: a run missing images is rejected, never scored as zeros;
* concepts are stripped of surrounding spaces and compared upper-cased; the image id is taken as written.

Where :func:`read_run` differs from the evaluator (all stricter or clearer; none changes the score of a file that
both accept): an empty concept inside a non-empty cell (``C1;;C2``, ``C1;``) is an error here, where the evaluator
keeps ``""`` as a false-positive concept; duplicates are detected after upper-casing; a row whose first cell
contains ``ID`` but *is* a test id is data here; a blank line is a named error (an ``IndexError`` there); line
numbers are the file's physical, 1-based lines; a UTF-8 byte-order mark is ignored and gzip run files are read.

The 2026 submission check (:func:`check_submission`) is stricter than the evaluator and is what the organisers'
platform runs first; every file :func:`write_run` leaves passes it. Its rules, as the organisers state them:

* UTF-8 without a byte-order mark; the header is exactly ``ID,CUIs``; no blank line anywhere;
* every row has exactly the two fields; no space around the id or the CUIs cell;
* every ground-truth id exactly once, no other id, **in the order of the ground-truth file**;
* CUIs ``;``-separated with no empty entry, each ``C`` followed by digits (``C\\d+``, upper-case ``C``), none twice;
  an empty CUIs cell (no concept) is allowed, as their README states. (Their 2026 code, as written, splits an empty
  cell into one empty entry and rejects it; :func:`empty_rows` counts such rows so ``make submit`` can warn.)

Scores (:func:`per_image_f1`; the score is their mean over the images not left out), the evaluator's arithmetic
exactly:

* **primary**: for each image, binary F1 between its predicted and true concept sets, as sklearn's ``f1_score``
  over the union of both sets gives it, i.e. ``2|T∩P| / (|T| + |P|)`` (an empty prediction against a non-empty
  truth gives 0). An image whose true cell is **empty is not left out**: the evaluator reads the empty cell as the
  one concept ``""``, so the image counts in the mean with F1 1 when the run's cell is empty too (``ID,``, the form
  :func:`write_run` and the 2026 format write) and 0 otherwise. (A 2025-style bare ``ID`` line, the id without a
  comma, reads as no concept at all there and scores 0 on such an image; here it reads like ``ID,``. ROCOv2's
  primary tables have no empty cell, so the case does not arise on them.)
* **secondary**: the same on the manually validated table, with both the predicted and the true concepts first
  filtered to an allowed set; images whose *filtered* true set is empty are left out (an empty cell's ``""`` is
  filtered away too). The allowed set is a named vocabulary (:func:`secondary_vocabulary`, one YAML per name under
  ``configs/benchmark/imageclef-secondary/``): ``2024`` (:data:`MANUAL_2024`, the 2024 task's 14 modality and
  X-ray body-region CUIs) or ``2025`` (:data:`MANUAL_2025`, the 15 CUIs the 2025/2026 evaluators hard-code: 2024's
  plus C0920367, optical coherence tomography, which is in none of the ROCOv2 tables). :func:`manual_vocabulary`
  gives every CUI of a manual table instead (ROCOv2's manual tables also hold the projections C1999039 "AP",
  C1996865 "PA", C0205129 "sagittal" and C0205106, and C0037005, none of which either list has).

When every image is left out (only possible for the secondary score) the evaluator divides by zero; here the mean
is NaN, with a warning saying why.

Ground truth (:func:`read_concepts`) is checked as a data contract: every CUI matches ``C`` + 7 digits
(case-insensitive), no id appears twice, the file has at least one row, each row has exactly the two fields.

:func:`write_run` writes a run in the 2026 format (header ``ID,CUIs``, ids in ground-truth order, an image with no
concept as ``ID,``), checks the file with :func:`check_submission` and reads it back with :func:`read_run` before
it is moved into place, so every file it leaves is valid for both evaluators.
:func:`frequency_prior` is the constant baseline: the most frequent training concepts, predicted for every image.
"""

from __future__ import annotations

import csv
import gzip
import io
import os
import re
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

import numpy as np
from omegaconf import OmegaConf

CUI_PATTERN = re.compile(r"C\d{7}", re.IGNORECASE)
MAX_CONCEPTS = 100  # per image in a run file (the evaluator's max_num_concepts)
VOCABULARIES = Path(__file__).resolve().parents[3] / "configs" / "benchmark" / "imageclef-secondary"
"""One YAML per secondary vocabulary (``source`` and ``concepts``: CUI -> name); the file's stem is its name."""
SUBMISSION_HEADER = ("ID", "CUIs")  # the 2026 submission check's header, exactly
SUBMISSION_CUI = re.compile(r"C\d+")  # the 2026 submission check's CUI pattern (upper-case C, any digits)


def secondary_vocabulary(name: str) -> frozenset[str]:
    """The named secondary vocabulary (``2024``, ``2025``) from :data:`VOCABULARIES`, as upper-case CUIs."""
    path = VOCABULARIES / f"{name}.yaml"
    if not path.is_file():
        known = sorted(p.stem for p in VOCABULARIES.glob("*.yaml"))
        raise ValueError(f"no secondary vocabulary {name!r}: {path} does not exist (known: {', '.join(known)})")
    concepts = OmegaConf.to_container(OmegaConf.load(path)).get("concepts") or {}
    bad = [str(c) for c in concepts if not CUI_PATTERN.fullmatch(str(c))]
    if not concepts or bad:
        raise ValueError(f"{path}: 'concepts' must map CUIs (C + 7 digits) to names; bad: {bad[:5] or 'none given'}")
    return frozenset(str(c).upper() for c in concepts)


MANUAL_2024 = secondary_vocabulary("2024")
"""The 14 CUIs of the 2024 task's secondary score: image modality and X-ray body region."""
MANUAL_2025 = secondary_vocabulary("2025")
"""The 15 manually validated CUIs the 2025 (and 2026) evaluator's secondary score keeps (its ``allowed_concepts``)."""

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


# --------------------------------------------------------------------------------------------------- the 2026 check


class SubmissionCheckError(ConceptFileError):
    """A run file that the organisers' 2026 submission check would refuse; ``rule`` names the broken rule."""

    def __init__(self, path: Path, line: int | None, rule: str, message: str):
        self.rule = rule
        where = f"{path}, line {line}" if line is not None else str(path)
        super().__init__(f"{where}: submission check '{rule}' failed: {message}")


def check_submission(path: str | Path, truth_ids: Iterable[str]) -> None:
    """Refuse ``path`` unless it has the 2026 submission format (module docstring) against ``truth_ids``.

    ``truth_ids`` are the ground-truth ids in the ground-truth file's order (:func:`read_concepts` keeps it). Raises
    :class:`SubmissionCheckError` naming the file, the 1-based line and the rule (``encoding``, ``header``, ``blank
    line``, ``fields``, ``whitespace``, ``duplicate id``, ``unknown id``, ``missing ids``, ``order``, ``empty CUI``,
    ``CUI format``, ``duplicate CUI``) at the first broken one.
    """
    path = Path(path)
    order = list(truth_ids)
    known = set(order)
    data = path.read_bytes()
    if data.startswith(b"\xef\xbb\xbf"):
        raise SubmissionCheckError(
            path, 1, "encoding", "the file starts with a UTF-8 byte-order mark (save it without)"
        )
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise SubmissionCheckError(path, None, "encoding", f"not UTF-8 ({error})") from None
    lines = text.splitlines()
    blank = next((n for n, line in enumerate(lines, start=1) if not line.strip()), None)
    if blank is not None:
        raise SubmissionCheckError(path, blank, "blank line", "an empty line (none is allowed, trailing ones included)")
    rows = list(csv.reader(io.StringIO(text)))
    if not rows or tuple(rows[0]) != SUBMISSION_HEADER:
        found = rows[0] if rows else "nothing"
        raise SubmissionCheckError(path, 1, "header", f"expected exactly {','.join(SUBMISSION_HEADER)}, found {found}")
    seen: dict[str, int] = {}
    for line, row in enumerate(rows[1:], start=2):
        if len(row) != 2:
            raise SubmissionCheckError(path, line, "fields", f"{len(row)} field(s) {row}; each row is ID,CUIs")
        image_id, cell = row
        if image_id != image_id.strip() or cell != cell.strip():
            raise SubmissionCheckError(path, line, "whitespace", f"space around the ID or the CUIs in {row}")
        if image_id in seen:
            raise SubmissionCheckError(path, line, "duplicate id", f"{image_id!r} (first on line {seen[image_id]})")
        if image_id not in known:
            raise SubmissionCheckError(path, line, "unknown id", f"{image_id!r} is not a ground-truth id")
        seen[image_id] = line
        if cell:
            parts = cell.split(";")
            if any(not part for part in parts):
                raise SubmissionCheckError(path, line, "empty CUI", f"{cell!r} has an empty entry (a stray ';')")
            bad = [part for part in parts if not SUBMISSION_CUI.fullmatch(part)]
            if bad:
                raise SubmissionCheckError(path, line, "CUI format", f"{bad} (each CUI is 'C' followed by digits)")
            repeated = sorted(part for part, n in Counter(parts).items() if n > 1)
            if repeated:
                raise SubmissionCheckError(path, line, "duplicate CUI", f"{repeated} given twice for {image_id!r}")
    missing = [image_id for image_id in order if image_id not in seen]
    if missing:
        raise SubmissionCheckError(path, None, "missing ids", f"{len(missing)} of {len(order)} ground-truth ids "
                                   f"have no row (e.g. {missing[:5]})")  # fmt: skip
    for line, (image_id, expected) in enumerate(zip((row[0] for row in rows[1:]), order, strict=True), start=2):
        if image_id != expected:
            raise SubmissionCheckError(path, line, "order", f"{image_id!r} where the ground truth has {expected!r} "
                                       "(ids follow the ground-truth file's order)")  # fmt: skip


def empty_rows(run: Mapping[str, Iterable[str]]) -> list[str]:
    """The ids predicted no concept: allowed by the 2026 format, refused by the 2026 check's code as written."""
    return [image_id for image_id, concepts in run.items() if not tuple(concepts)]


# --------------------------------------------------------------------------------------------------- writing


def write_run(
    path: str | Path, predictions: Mapping[str, Iterable[str]], test_ids: Iterable[str], *, header: bool = True
) -> dict[str, tuple[str, ...]]:
    """Write ``predictions`` as a run file and return it as :func:`read_run` reads it back.

    One line per test id, in ``test_ids`` order (pass the ground-truth file's order: the 2026 check requires it);
    each image's concepts are stripped, upper-cased and de-duplicated keeping the first occurrence; an image with
    none is written as ``ID,``. The header ``ID,CUIs`` comes first unless ``header=False`` (a bare 2025-style file,
    which the 2026 check refuses). A name ending in ``.gz`` is gzip-compressed.

    Raises ``ValueError`` before anything is written when a test id has no prediction, a prediction's id is not a
    test id, ``test_ids`` repeats an id, a concept is not a CUI (``C`` + 7 digits) or an image has more than
    :data:`MAX_CONCEPTS`. The file is written beside ``path`` under a temporary name, checked with
    :func:`check_submission` (plain files with the header), read back with :func:`read_run` and only then moved to
    ``path``, so no invalid file is ever left there.
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
        lines.append([image_id, ";".join(concepts)] if concepts or header else [image_id])
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    gzipped = path.name.endswith(".gz")
    try:
        opener = gzip.open if gzipped else open
        with opener(temporary, "wt", encoding="utf-8", newline="") as handle:
            writer = csv.writer(handle, lineterminator="\n")
            if header:
                writer.writerow(SUBMISSION_HEADER)
            writer.writerows(lines)
        if header and not gzipped:
            check_submission(temporary, ids)
        written = read_run(temporary, ids)
        expected = {line[0]: tuple(c for c in line[1].split(";") if c) if len(line) == 2 else () for line in lines}
        if written != expected:  # cannot happen for CUIs and a CSV writer; guards the round trip itself
            raise ConceptFileError(f"{path}: the run read back differs from the predictions written")
        os.replace(temporary, path)
    finally:
        temporary.unlink(missing_ok=True)
    return written


# --------------------------------------------------------------------------------------------------- scoring


def image_f1(
    true: set[str] | frozenset[str], predicted: set[str] | frozenset[str], *, empty_truth: str = "skip"
) -> float:
    """Binary F1 of one image's predicted set against its true set: ``2|T∩P| / (|T| + |P|)``.

    That is sklearn's ``f1_score(average="binary")`` over the union of both sets, as the evaluator computes it; an
    empty prediction scores 0. An empty true set follows ``empty_truth``: ``"skip"`` gives NaN (the image is left
    out of the mean: the secondary score's rule), ``"cell"`` scores the evaluator's reading of an empty cell as the
    one concept ``""`` (1 when the prediction is empty too, else 0: the primary score's rule). Compares the strings
    as given (normalising case is the caller's: :func:`per_image_f1` does it).
    """
    true, predicted = set(true), set(predicted)
    if not true:
        if empty_truth not in ("skip", "cell"):
            raise ValueError(f"empty_truth must be skip or cell, got {empty_truth!r}")
        return float("nan") if empty_truth == "skip" else float(not predicted)
    return 2 * len(true & predicted) / (len(true) + len(predicted))


def _normalised(concepts: Iterable[str], allowed: frozenset[str] | None) -> set[str]:
    out = {str(concept).strip().upper() for concept in concepts}
    return out if allowed is None else out & allowed


def per_image_f1(truth: Table, run: Table, allowed: Iterable[str] | None = None) -> tuple[tuple[str, ...], np.ndarray]:
    """Each image's F1 (:func:`image_f1`) in ``truth`` order, NaN for the images left out, for bootstrapping.

    ``allowed=None`` is the primary score: every image counts, an empty true cell included (it scores 1 against an
    empty prediction and 0 otherwise, as the evaluator's ``""`` concept does). With an allowed set (the secondary
    score) both the predicted and the true concepts are first filtered to it, and an image whose filtered truth is
    empty is left out (NaN). Concepts are compared stripped and upper-cased. ``run`` must have exactly the ids of
    ``truth`` (a run missing images is rejected, as the evaluator rejects it, rather than scored as zeros).
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
    rule = "cell" if keep is None else "skip"
    ids = tuple(truth)
    values = np.array([image_f1(_normalised(truth[i], keep), _normalised(run[i], keep), empty_truth=rule) for i in ids],
                      dtype=np.float64)  # fmt: skip
    return ids, values


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
