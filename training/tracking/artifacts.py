"""A run's artifacts are read from inside its artifact folder, never through a symbolic link placed there.

Anyone who can write a run's folder in a local or shared-disk store can replace ``checkpoints/`` by a link
elsewhere (another team's runs, ``~/.ssh``), and MLflow's download follows it. :func:`download` refuses a link
anywhere between the run's artifact root and the file. Remote stores serve bytes, not links.
"""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import unquote, urlparse

from mlflow import MlflowClient

from training.errors import UserError


class UnsafeArtifact(UserError, ValueError):
    """A run's artifact is a symbolic link (or lies under one) in a local artifact store."""


def local_root(artifact_uri: str) -> Path | None:
    """The run's artifact folder on this machine, or None for a remote store."""
    parsed = urlparse(artifact_uri)
    if parsed.scheme not in ("", "file"):
        return None
    return Path(unquote(parsed.path) if parsed.scheme else artifact_uri)


def check_no_links(root: Path, artifact: str, run_id: str) -> None:
    """Refuse ``artifact`` (a file or folder under ``root``) if it, a folder above it, or anything in it is a link."""
    path = root
    for part in Path(artifact).parts:
        path = path / part
        if path.is_symlink():
            raise UnsafeArtifact(
                f"run {run_id}: artifact {path.relative_to(root)} is a symbolic link (to {os.readlink(path)}) in the "
                "local artifact store; refusing to read through it (only files logged to the run are read back)"
            )
    if path.is_dir():
        for folder, names, files in os.walk(path):
            for name in (*names, *files):
                if (Path(folder) / name).is_symlink():
                    check_no_links(root, str((Path(folder) / name).relative_to(root)), run_id)


def download(client: MlflowClient, run_id: str, artifact: str, folder: str) -> str:
    """``client.download_artifacts`` after :func:`check_no_links` when the run's store is local."""
    root = local_root(client.get_run(run_id).info.artifact_uri)
    if root is not None:
        check_no_links(root, artifact, run_id)
    return client.download_artifacts(run_id, artifact, folder)
