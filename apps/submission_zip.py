"""The upload the challenge site asks for: one ``.zip`` holding the predictions CSV at its top level and ``code/``,
"all code used for model development and inference" (docs/rules.md §1).

``code/`` holds the platform's source at the run's commit (``git archive``) with the run's resolved config and the
command that made the file; when that commit cannot give the source (none recorded, a dirty tree, not in this
repository) the working tree's tracked files stand in, and ``SOURCE.txt`` says which and why. Reading a zip back
checks every member's CRC and that ``code/`` is complete, so the file validated is the file sent.
"""

from __future__ import annotations

import io
import subprocess
import tarfile
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

from training.config_files import PROJECT_ROOT

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
        command: the command line(s) that wrote the submission.
        commit: the run's :data:`COMMIT_TAG` (``<sha>``, ``<sha>-dirty`` or ``unknown``), None when untagged.
        run_id: the run whose config and commit these are.
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
