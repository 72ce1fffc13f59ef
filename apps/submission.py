"""The challenge submission: the predictions CSV in the organisers' format, the zip the challenge site asks for,
and the validator both pass before anything is sent.

The format, the template kinds and the zip's ``code/`` record are in docs/tuning-registry-submission.md,
"Submission" (rules: docs/rules.md §1). Columns are matched to model labels by the shared contract
(:mod:`evaluation.prediction_columns`), so a spelling difference can never leave a column of zeros or shift
probabilities into the wrong class. Probabilities are written at full float64 precision: rounding turns a
confident model's small probabilities into ties at zero, which moves mAP. The zip is validated as it will be
read (the CSV taken back out of the written zip), so the file validated is the file sent.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import os
import subprocess
import tarfile
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
from omegaconf import OmegaConf

from evaluation.organiser_names import TASK1_COLUMNS, TASK2_COLUMNS, organiser_order
from evaluation.prediction_columns import SUBMISSION_ID_COLUMN, PredictionsError, id_column, label_columns
from training.config_files import PROJECT_ROOT, config_file
from training.data.adapters.base import AdapterError
from training.data.adapters.cxrlt2026_files import ID_COLUMNS, TASK2_CLASSES, TRAINING_TABLE, class_list, header

MAX_LISTED = 10  # problems listed per kind before summarising
TASK_CONFIGS = config_file("task")
#: What a task submits and ``make score`` reads (``submission_format`` in ``configs/task/<task>.yaml``):
#: ``probabilities``, the CXR-LT CSV of this module (the default); ``concepts``, ImageCLEF's run file of predicted
#: concept sets (:mod:`apps.benchmarks.imageclef_concepts.scoring`).
SUBMISSION_FORMATS = ("probabilities", "concepts")
#: Columns of the release's tables that describe an image, never a class.
RELEASE_METADATA = frozenset(ID_COLUMNS[1:])


# ---------------------------------------------------------------------------------------------- the upload zip

#: The run tag holding the commit the run was trained at (``training.tracking.session.git_commit``).
COMMIT_TAG = "mlflow.source.git.commit"
#: What ``code/`` holds when there is no git repository to take the source from.
PROJECT_FOLDERS = ("apps", "configs", "evaluation", "training", "tests", "docs")
PROJECT_FILES = ("Makefile", "pyproject.toml", "README.md")
CODE = "code/"
#: Files the zip's ``code/`` must hold besides the source (:func:`write_zip`).
CODE_FILES = ("config.yaml", "COMMAND.txt", "SOURCE.txt")


class UploadError(ValueError):
    """A zip that is not the upload the site asks for; the message names the member."""


@dataclass(frozen=True)
class CodeRecord:
    """What ``code/`` says about how the predictions were made.

    Attributes:
        config: the run's ``config.yaml`` artifact (resolved and redacted when it was logged).
        commit: the run's :data:`COMMIT_TAG` (``<sha>``, ``<sha>-dirty`` or ``unknown``), None when untagged.
        other_configs: ``{run id: config.yaml}`` of the other members of an ensemble.
    """

    config: bytes
    command: str
    commit: str | None = None
    run_id: str | None = None
    other_configs: dict[str, bytes] = field(default_factory=dict)


def _git(root: Path, *args: str) -> subprocess.CompletedProcess | None:
    """``git -C root <args>`` (bytes out), or None when git is not installed."""
    try:
        return subprocess.run(["git", "-C", str(root), *args], capture_output=True, timeout=120, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None


def _commit_problem(commit: str | None, root: Path) -> str | None:
    """Why ``git archive <commit>`` cannot give the run's source, or None when it can."""
    if not commit or commit == "unknown":
        return "the run recorded no commit"
    if commit.endswith("-dirty"):
        return f"the run was trained from a tree with uncommitted changes ({commit})"
    found = _git(root, "cat-file", "-e", f"{commit}^{{commit}}")
    if found is None or found.returncode != 0:
        return f"the run's commit {commit} is not in the repository at {root}"
    return None


def _source_files(commit: str | None, root: Path) -> tuple[list[tuple[str, bytes]], str]:
    """``([(path, bytes)], what they are)``: the source at the run's commit when the repository has it, else the
    working tree's tracked files, else (no git) the project's own folders."""
    problem = _commit_problem(commit, root)
    if problem is None:
        archive = _git(root, "archive", "--format=tar", commit)
        if archive is not None and archive.returncode == 0:
            with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
                files = [(m.name, tar.extractfile(m).read()) for m in tar.getmembers() if m.isfile()]
            return files, f"git archive {commit}: the source at the run's commit (run tag {COMMIT_TAG})"
        problem = f"git archive {commit} failed: {archive.stderr.decode(errors='replace').strip() if archive else ''}"
    listed = _git(root, "ls-files", "-z")
    if listed is not None and listed.returncode == 0:
        head = _git(root, "rev-parse", "HEAD")
        at = head.stdout.decode().strip() if head is not None and head.returncode == 0 else "no commit yet"
        names = sorted(n for n in listed.stdout.decode().split("\0") if n and (root / n).is_file())
        files = [(name, (root / name).read_bytes()) for name in names]
        return files, f"the working tree's tracked files (git ls-files, HEAD {at}), because {problem}"
    names = [f for f in PROJECT_FILES if (root / f).is_file()]
    for folder in PROJECT_FOLDERS:
        for path in sorted((root / folder).rglob("*")):
            relative = path.relative_to(root)
            hidden = any(p.startswith(".") or p == "__pycache__" for p in relative.parts)
            if path.is_file() and not hidden and path.suffix != ".pyc":
                names.append(relative.as_posix())
    files = [(name, (root / name).read_bytes()) for name in names]
    return files, (f"the project's folders ({', '.join([*PROJECT_FOLDERS, *PROJECT_FILES])}) at {root}, because "
                   f"{problem} and there is no git repository there")  # fmt: skip


def write_zip(path: Path, csv_name: str, csv_data: bytes, record: CodeRecord, root: Path = PROJECT_ROOT) -> str:
    """Write the upload: ``csv_name`` at the top level, ``code/`` with the source, ``config.yaml``,
    ``COMMAND.txt`` and ``SOURCE.txt``; returns where the source came from (also written in ``SOURCE.txt``)."""
    files, described = _source_files(record.commit, root)
    own = {f"{CODE}{name}" for name in CODE_FILES} | {f"{CODE}members/{run}.yaml" for run in record.other_configs}
    source = "\n".join([
        f"Source: {described}.",
        f"Run: {record.run_id or 'none recorded'}; its resolved config is config.yaml"
        + (", the other ensemble members' are members/<run id>.yaml" if record.other_configs else "") + ".",
        "Command: COMMAND.txt. Install with `make setup` (pyproject.toml) and run the command from this folder.",
    ]) + "\n"  # fmt: skip
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        archive.writestr(csv_name, csv_data)
        for name, data in files:
            if f"{CODE}{name}" not in own:
                archive.writestr(f"{CODE}{name}", data)
        archive.writestr(f"{CODE}config.yaml", record.config)
        for run_id, config in record.other_configs.items():
            archive.writestr(f"{CODE}members/{run_id}.yaml", config)
        archive.writestr(f"{CODE}COMMAND.txt", record.command.rstrip("\n") + "\n")
        archive.writestr(f"{CODE}SOURCE.txt", source)
    return described


def read_zip(path: Path) -> tuple[str, bytes]:
    """``(name, bytes)`` of the one CSV at the zip's top level, after checking every member's CRC and that
    ``code/`` holds the source and :data:`CODE_FILES`.

    Raises:
        UploadError: not a zip, a damaged member, no single top-level CSV, or ``code/`` incomplete.
    """
    try:
        with zipfile.ZipFile(path) as archive:
            damaged = archive.testzip()
            names = archive.namelist()
            top = [n for n in names if "/" not in n and n.endswith(".csv")]
            if damaged is None and len(top) == 1:
                data = archive.read(top[0])
    except (zipfile.BadZipFile, OSError) as error:
        raise UploadError(f"not a readable zip ({error})") from None
    if damaged is not None:
        raise UploadError(f"member {damaged} is damaged (CRC mismatch)")
    if len(top) != 1:
        raise UploadError(f"{len(top)} CSV file(s) at the top level {top}; the upload holds exactly one")
    absent = [f"{CODE}{name}" for name in CODE_FILES if f"{CODE}{name}" not in names]
    if absent:
        raise UploadError(f"{absent[0]} is missing")
    if not any(n.startswith(CODE) and n.removeprefix(CODE) not in CODE_FILES for n in names):
        raise UploadError(f"{CODE} holds no source file")
    return top[0], data


# ------------------------------------------------------------------------------------------- the task's format


class SubmissionError(ValueError):
    """A submission that must not be sent; the message names each problem and where it is."""


def task_setting(task: str, key: str, default):
    """``key`` of ``configs/task/<task>.yaml``, or ``default`` when the task has no config or no such key."""
    path = TASK_CONFIGS / f"{task}.yaml"
    if not path.is_file():
        return default
    value = OmegaConf.load(path).get(key)
    return default if value is None else value


def submission_format(task: str) -> str:
    """The task's :data:`SUBMISSION_FORMATS` entry (``probabilities`` unless its config says otherwise)."""
    kind = str(task_setting(task, "submission_format", "probabilities"))
    if kind not in SUBMISSION_FORMATS:
        raise SubmissionError(
            f"configs/task/{task}.yaml: submission_format {kind!r} is not one of {SUBMISSION_FORMATS}"
        )
    return kind


# ------------------------------------------------------------------------------------------------ the template


@dataclass(frozen=True)
class Template:
    """What a submission must look like: the exact header (id column first), the ids in order, and the file they
    came from (named in every message about them)."""

    header: list[str]
    ids: list[str]
    source: str = "template"

    @property
    def id_column(self) -> str:
        return self.header[0]

    @property
    def class_columns(self) -> list[str]:
        return self.header[1:]

    @classmethod
    def read(cls, path: str | Path, labels: Sequence[str] | None = None) -> Template:
        """A template CSV: its first column holds the ids; its class columns are copied when named, and are the
        task's organiser columns (:func:`release_columns` for ``labels``) when their headers are empty or absent.

        Raises:
            SubmissionError: any problem :func:`check_template` names, or a number of empty class headers that
                is neither 0 nor the task's class count.
        """
        path = Path(path)
        id_name, classes, ids = check_template(path)
        if not any(c.strip() for c in classes):
            if labels is None:
                raise SubmissionError(f"{path}: its class columns are unnamed; the model's classes must name them")
            named = release_columns(labels, path.parent)
            if len(classes) not in (0, len(named)):
                raise SubmissionError(f"{path}, line 1: {len(classes)} class column(s) with an empty header; the "
                                      f"task submits {len(named)} ({', '.join(named)})")  # fmt: skip
            classes = named
        return cls([id_name, *classes], ids, str(path))

    @classmethod
    def default(cls, labels: Sequence[str], ids: Sequence[str]) -> Template:
        """``ImageID`` plus the labels as the organisers write them: a task's full class set in their order, any
        other set in its own order (:func:`evaluation.organiser_names.organiser_order`)."""
        return cls([SUBMISSION_ID_COLUMN, *organiser_order(labels)], [str(i) for i in ids], "the default template")

    def with_id_column(self, name: str) -> Template:
        """The same template with its id column named ``name`` (``--id-column``).

        Raises:
            SubmissionError: ``name`` is no spelling of an image id, so ``make score`` could not find the ids.
        """
        if id_column([name]) is None:
            raise SubmissionError(f"--id-column {name!r} is not an image id column name (ImageID, dicom_id, image_id)")
        return dataclasses.replace(self, header=[name, *self.class_columns])


def check_template(path: Path) -> tuple[str, list[str], list[str]]:
    """``(id column, class header cells, ids)`` of a template, checked as far as the model does not matter, so
    ``make submit`` refuses a bad template before the model stack loads. The class cells are all named or all
    empty; the release's date and patient columns are never among them.

    Raises:
        SubmissionError: the file is unreadable, malformed, mixes named and empty class headers, or repeats a
            column or an id (each named by file, line and column or id).
    """
    cells, rows = _read_rows(path)
    if not cells or id_column(cells[:1]) is None:
        raise SubmissionError(f"{path}, line 1: the first column {(cells or [''])[0]!r} is not an image id column "
                              f"({SUBMISSION_ID_COLUMN!r})")  # fmt: skip
    classes = [c for c in cells[1:] if c.strip() not in RELEASE_METADATA]
    named = [c for c in classes if c.strip()]
    if named and len(named) != len(classes):
        raise SubmissionError(f"{path}, line 1: {len(named)} named and {len(classes) - len(named)} empty class "
                              "header(s); a template names all its class columns or none")  # fmt: skip
    repeated = next((c for i, c in enumerate(named) if c in named[:i]), None)
    if repeated is not None:
        raise SubmissionError(f"{path}, line 1: column {repeated!r} appears twice")
    return cells[0], classes, _template_ids(path, rows)


def _read_rows(path: Path) -> tuple[list[str], list[tuple[int, list[str]]]]:
    """``(header cells, [(CSV line, cells)])`` of a CSV as written: empty header cells stay empty, a last line
    without a newline is read like any other."""
    if not path.is_file():
        raise SubmissionError(f"template not found: {path} (the organisers' test list or sample submission; leave "
                              "TEMPLATE out to submit the test split)")  # fmt: skip
    try:
        with open(path, newline="", encoding="utf-8-sig") as handle:
            reader = csv.reader(handle)
            cells = next(reader, [])
            rows = [(reader.line_num, row) for row in reader if row]
    except (UnicodeDecodeError, csv.Error) as error:
        raise SubmissionError(f"{path}: not a readable CSV template ({error})") from None
    for line, row in rows:
        if len(row) > len(cells):
            raise SubmissionError(f"{path}, line {line}: {len(row)} fields, the header has {len(cells)}")
    return cells, rows


def _template_ids(path: Path, rows: list[tuple[int, list[str]]]) -> list[str]:
    """The ids of the template's first column, in order; each one present and listed once."""
    first: dict[str, int] = {}
    for line, row in rows:
        image = row[0].strip()
        if not image:
            raise SubmissionError(f"{path}, line {line}: empty image id")
        if image in first:
            raise SubmissionError(f"{path}, line {line}: id {image!r} is listed again (first on line {first[image]})")
        first[image] = line
    return list(first)


def release_columns(labels: Sequence[str], folder: Path) -> list[str]:
    """The class columns a submission of ``labels`` holds, spelt and ordered by the release in ``folder``.

    The release file itself decides when it is in ``folder`` (Task 1: ``CXRLT_2026_training.csv``'s header, Task 2:
    ``Eval_Class_Task2.txt``), so an edition that reorders or respells its classes is followed; else the
    organisers' table.

    Raises:
        SubmissionError: the release file names a class the task does not have, or leaves one of its classes out.
    """
    for columns, name in ((TASK1_COLUMNS, TRAINING_TABLE), (TASK2_COLUMNS, TASK2_CLASSES)):
        if set(labels) == set(columns):
            path = folder / name
            if not path.is_file():
                return list(columns.values())
            return _checked(_table_classes(path) if name == TRAINING_TABLE else _listed_classes(path), labels, path)
    return organiser_order(labels)


def _table_classes(path: Path) -> list[str]:
    try:
        cells = [c.strip() for c in header(path)]
    except AdapterError as error:
        raise SubmissionError(str(error)) from None
    if tuple(cells[: len(ID_COLUMNS)]) != ID_COLUMNS:
        raise SubmissionError(f"{path}, line 1: expected the release's id columns {list(ID_COLUMNS)} first, found "
                              f"{cells[: len(ID_COLUMNS)]}")  # fmt: skip
    return cells[len(ID_COLUMNS) :]


def _listed_classes(path: Path) -> list[str]:
    try:
        return class_list(path)
    except AdapterError as error:
        raise SubmissionError(str(error)) from None


def _checked(names: list[str], labels: Sequence[str], path: Path) -> list[str]:
    """``names`` when they are exactly the task's classes, one each."""
    try:
        found, missing = label_columns(names, labels)
    except PredictionsError as error:
        raise SubmissionError(f"{path}: {error}") from None
    repeated = next((n for i, n in enumerate(names) if n in names[:i]), None)
    if repeated is not None:
        raise SubmissionError(f"{path}: class {repeated!r} is listed twice")
    unknown = [name for name in names if name not in found.values()]
    if unknown:
        raise SubmissionError(f"{path}: class column {unknown[0]!r} is not one of the task's {len(labels)} classes")
    if missing:
        raise SubmissionError(f"{path}: no column for the task's class(es) {missing}")
    return names


# ------------------------------------------------------------------------------------------ building, checking


def class_index(template: Template, labels: Sequence[str]) -> list[int]:
    """For each class column of the template, the index of the model label it names.

    Raises:
        SubmissionError: a column naming no label of the model, or two naming the same one (named with the file).
    """
    try:
        found, _ = label_columns(template.class_columns, labels)
    except PredictionsError as error:
        raise SubmissionError(f"{template.source}: {error}") from None
    label_of = {column: label for label, column in found.items()}
    unknown = [column for column in template.class_columns if column not in label_of]
    if unknown:
        raise SubmissionError(f"{template.source}: column {unknown[0]!r} names no class of the model"
                              f"{f' ({len(unknown) - 1} more: {unknown[1:]})' if len(unknown) > 1 else ''}; "
                              f"its classes: {list(labels)}")  # fmt: skip
    return [list(labels).index(label_of[column]) for column in template.class_columns]


def build_submission(template: Template, ids: Sequence[str], probs: np.ndarray, labels: Sequence[str]) -> pd.DataFrame:
    """The submission frame: the template's header and row order, float64 probabilities moved into its columns.

    ``ids`` are the ``(N,)`` ids of the rows of ``probs``; ``probs`` is ``(N, C)`` in ``labels`` order.
    """
    position = {str(i): row for row, i in enumerate(ids)}
    missing = [i for i in template.ids if i not in position]
    if missing:
        raise SubmissionError(f"no prediction for {len(missing)} id(s) of {template.source}: {_listed(missing)}")
    rows = [position[i] for i in template.ids]
    values = np.asarray(probs, dtype=np.float64)[np.ix_(rows, class_index(template, labels))]  # (N_t, C_t)
    frame = pd.DataFrame(values, columns=template.class_columns)
    frame.insert(0, template.id_column, list(template.ids))
    return frame


def _listed(items: Sequence) -> str:
    more = f" and {len(items) - MAX_LISTED} more" if len(items) > MAX_LISTED else ""
    return ", ".join(repr(i) for i in items[:MAX_LISTED]) + more


def problems(frame: pd.DataFrame, template: Template, check_order: bool = True) -> list[str]:
    """Every reason ``frame`` is not a valid submission for ``template`` (empty when it is valid)."""
    found: list[str] = []
    header = [str(c) for c in frame.columns]
    if header != template.header:
        for position, (got, expected) in enumerate(zip(header, template.header, strict=False)):
            if got != expected:
                found.append(f"column {position + 1} is {got!r}, expected {expected!r}")
        found += [f"column {expected!r} is missing" for expected in template.header[len(header) :]]
        found += [f"unexpected column {extra!r}" for extra in header[len(template.header) :]]
    if not header:
        return found or ["the file has no columns"]
    ids = frame.iloc[:, 0].astype(str)
    counts = ids.value_counts()
    duplicated = counts[counts > 1]
    for value, n in duplicated.items():
        lines = [int(i) + 2 for i in np.flatnonzero(ids.to_numpy() == value)]
        found.append(f"id {value!r} appears {n} times (lines {lines})")
    expected = set(template.ids)
    present = set(ids)
    missing = [i for i in template.ids if i not in present]
    extra = [i for i in dict.fromkeys(ids) if i not in expected]
    if missing:
        found.append(f"{len(missing)} id(s) missing: {_listed(missing)}")
    if extra:
        found.append(f"{len(extra)} id(s) not in {template.source}: {_listed(extra)}")
    if check_order and not (missing or extra or len(duplicated)) and ids.tolist() != list(template.ids):
        line = next(r for r, (a, b) in enumerate(zip(ids, template.ids, strict=True)) if a != b)
        found.append(f"rows are not in the template's order: line {line + 2} has id {ids.iloc[line]!r}, "
                     f"expected {template.ids[line]!r}")  # fmt: skip
    found += _value_problems(frame, ids, [c for c in template.class_columns if c in frame.columns])
    return found


def _value_problems(frame: pd.DataFrame, ids: pd.Series, columns: list[str]) -> list[str]:
    """Cells that are not finite probabilities in [0, 1], named by CSV line, id and column."""
    if not columns:
        return []
    raw = frame[columns]
    values = raw.apply(pd.to_numeric, errors="coerce").to_numpy(dtype=np.float64)  # (N, C)
    bad = np.argwhere(~np.isfinite(values) | (values < 0) | (values > 1))
    found = []
    for row, col in bad[:MAX_LISTED]:
        cell = raw.iat[row, col]
        found.append(f"line {row + 2} (id {ids.iloc[row]!r}), column {columns[col]!r}: {str(cell)!r} is not a "
                     f"probability in [0, 1]")  # fmt: skip
    if len(bad) > MAX_LISTED:
        found.append(f"... {len(bad) - MAX_LISTED} more bad cell(s)")
    return found


def validate(frame: pd.DataFrame, template: Template, check_order: bool = True) -> None:
    """Raise :class:`SubmissionError` naming every problem on one line; return quietly for a valid submission."""
    found = problems(frame, template, check_order)
    if found:
        raise SubmissionError("invalid submission: " + "; ".join(found))


def read_csv_bytes(data: bytes) -> pd.DataFrame:
    """A submission CSV exactly as written: every cell as text (ids keep leading zeros, nothing parsed away)."""
    return pd.read_csv(io.BytesIO(data), dtype=str, keep_default_na=False)


def validate_file(path: str | Path, template: Template, check_order: bool = True) -> pd.DataFrame:
    """Read a written submission (the CSV, or the CSV inside the zip) and validate it; returns the CSV as text.

    Raises:
        SubmissionError: named by file; for a zip also a missing CSV or ``code/`` file, or a damaged member.
    """
    path = Path(path)
    try:
        data = read_zip(path)[1] if path.suffix == ".zip" else path.read_bytes()
        frame = read_csv_bytes(data)
        validate(frame, template, check_order)
    except (SubmissionError, UploadError, pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as error:
        raise SubmissionError(f"{path}: {error}") from None
    return frame


def write_submission(frame: pd.DataFrame, template: Template, out: Path, record: CodeRecord | None = None,
                     root: Path = PROJECT_ROOT) -> str | None:  # fmt: skip
    """Validate ``frame``, write it to ``out`` (a ``.csv``, or the ``.zip`` upload with ``record``'s ``code/``),
    and validate the written bytes again; returns where the zip's source came from (None for a CSV).

    The file is written beside ``out`` and renamed only once the bytes written pass, so ``out`` is never a file
    that failed the check.

    Raises:
        SubmissionError: a problem with the frame or the written file, an ``out`` that is neither ``.csv`` nor
            ``.zip``, or a zip without the ``code/`` record.
    """
    validate(frame, template)
    if out.suffix not in (".csv", ".zip"):
        raise SubmissionError(f"--out {out}: a submission is a .zip (the upload: the CSV and code/) or a .csv")
    if out.suffix == ".zip" and record is None:
        raise SubmissionError(f"--out {out}: a zip needs the run's config and command for code/")
    data = frame.to_csv(index=False, lineterminator="\n").encode("utf-8")
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_name(f".{out.stem}.part{out.suffix}")  # same suffix: read back as what it is
    try:
        described = None
        if out.suffix == ".zip":
            described = write_zip(partial, out.with_suffix(".csv").name, data, record, root)
        else:
            partial.write_bytes(data)
        try:
            validate_file(partial, template)
        except SubmissionError as error:
            raise SubmissionError(str(error).replace(str(partial), str(out), 1)) from None
        os.replace(partial, out)
    finally:
        partial.unlink(missing_ok=True)
    return described
