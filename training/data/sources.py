"""Where a manifest comes from. Each data config names one source class; the data module only calls ``prepare``.

Adapters for real releases (CXR-LT 2026, NIH, Kermany, generic CSV) are further sources with the same two
members, so adding one never touches the data module.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
from pathlib import Path

from training.data.findings import KNOWN_FINDINGS
from training.errors import UserError


class TaskLabelsError(UserError, ValueError):
    """A task that leaves its labels to the data (``labels: null``) on a data source that declares none."""


def task_labels(task, source) -> list[str]:
    """The label columns a task trains on: its own ``labels:`` list, or the data source's when it has none.

    A task whose labels depend on the data (ROCOv2's concepts) sets ``labels: null``. The pipeline writes the
    result into the run's config, so the model, the stored ``config.yaml`` and every reload use that exact list.

    Raises:
        TaskLabelsError: ``labels: null`` with a source that declares no labels (a manifest, the synthetic set).
    """
    if task.get("labels") is not None:
        return list(task.labels)
    declared = getattr(source, "labels", None)
    if not declared:
        raise TaskLabelsError(f"task {task.get('name')!r} takes its labels from the data (labels: null), but the data "
                              f"source {getattr(source, 'name', type(source).__name__)!r} declares none; choose the "
                              "data config of an adapter that lists its label columns (e.g. data=rocov2)")  # fmt: skip
    return list(declared)


def manifest_vocabulary(source) -> tuple[str, ...]:
    """The label columns a source's manifest may hold: the platform's findings plus the labels the source declares.

    An adapter with a vocabulary of its own (ROCOv2's CUIs) declares it as its ``labels``; without this, the
    manifest check would refuse those columns as unknown findings (docs/rules.md §6). Call it after ``prepare()``
    (the generic table adapter knows its labels once it has read its table).
    """
    return tuple(dict.fromkeys((*KNOWN_FINDINGS, *(getattr(source, "labels", None) or ()))))


def image_roots(source, allow_outside_root: bool = False) -> tuple[Path, ...] | None:
    """The folders a source's manifest paths must lie under: its ``root`` and any further ones it declares
    (``extra_image_roots``: the CXR-LT adapter's NIH folder), or None when the user opted out
    (``data.allow_outside_root=true``) and any path is read (:func:`training.data.manifest.check_manifest`)."""
    if allow_outside_root:
        return None
    return (Path(source.root), *(Path(r) for r in getattr(source, "extra_image_roots", ())))


class ManifestSource:
    """An existing manifest CSV, with images relative to ``root`` (default: the CSV's folder)."""

    def __init__(self, manifest: str, root: str | None = None, name: str = "manifest"):
        self.manifest = Path(manifest)
        self.root = Path(root) if root else self.manifest.parent
        self.name = name

    def prepare(self) -> Path:
        """Return the manifest path; nothing to build."""
        return self.manifest


class SyntheticSource:
    """The built-in synthetic radiographs, generated on first use under a folder keyed by their parameters.

    Keying the folder by a hash of the generator parameters lets the default set, the smoke-test set and any
    custom size live side by side: switching between them never regenerates or deletes the other.
    """

    def __init__(self, root: str, generator: dict, name: str = "synthetic"):
        self.generator = dict(generator)
        key = hashlib.sha256(json.dumps(self.generator, sort_keys=True).encode()).hexdigest()[:8]
        self.root = Path(root) / f"{self.generator.get('image_size', 'x')}px-{key}"
        self.name = name

    def prepare(self) -> Path:
        """Generate the set if it is missing or stale, then return its manifest.

        Several processes may start at once (tuning workers, DDP ranks): an exclusive file lock lets the first
        generate while the others wait, then find the set complete and return at once.
        """
        from training.data.synthetic import generate

        self.root.parent.mkdir(parents=True, exist_ok=True)
        with open(self.root.parent / f".{self.root.name}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            return Path(generate(self.root, **self.generator))
