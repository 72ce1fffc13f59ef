"""Leak guard: a zero-shot task trains on a manifest from which the unseen label columns were removed.

Task 2 forbids supervised labels of its six findings (docs/rules.md §1). The data module only builds targets for the
task's seen labels, but "only" is a property of code that can change; the guard makes it a property of the data:
the training run reads a copy of the manifest without the unseen columns at all, so no later change to target
building, sampling or loss code can ever reach them. The full manifest is kept aside (``full_manifest``) and read
only by the unseen-class evaluation, for the test split. The run records what was dropped (``run_tags``).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from training.data.manifest import file_fingerprint

log = logging.getLogger(__name__)

GUARD_DIR = Path("data/manifests/seen_only")


class SeenOnlySource:
    """Wraps any manifest source; ``prepare`` returns a copy of its manifest without the ``unseen`` columns.

    Args:
        source: the configured source (synthetic, NIH, CXR-LT, CSV...). Its ``root``, ``name`` and
            ``extra_columns`` are passed through, so images resolve exactly as before.
        unseen: label columns that must not reach training.
        out_dir: where the guarded copies go, named by the full manifest's fingerprint (never beside the
            often read-only images).
    """

    def __init__(self, source, unseen: Sequence[str], out_dir: str | Path = GUARD_DIR):
        self.source = source
        self.unseen = tuple(unseen)
        self.out_dir = Path(out_dir)
        self.dropped: tuple[str, ...] = ()
        self.full_manifest: Path | None = None

    def __getattr__(self, name):  # root, name, extra_columns, ... of the wrapped source
        if name == "source":
            raise AttributeError(name)
        return getattr(self.source, name)

    def prepare(self) -> Path:
        """Prepare the wrapped source, then write (once) and return the manifest copy without unseen columns."""
        self.full_manifest = Path(self.source.prepare())
        table = pd.read_csv(self.full_manifest, dtype=str, keep_default_na=False)
        self.dropped = tuple(c for c in self.unseen if c in table.columns)
        if not self.dropped:
            log.info("leak guard: the manifest has none of the unseen columns %s; nothing to drop", list(self.unseen))
            return self.full_manifest
        guarded = self.out_dir / f"{file_fingerprint(self.full_manifest)}-{self.full_manifest.stem}.csv"
        if not guarded.is_file():
            guarded.parent.mkdir(parents=True, exist_ok=True)
            tmp = guarded.with_suffix(".tmp")
            table.drop(columns=list(self.dropped)).to_csv(tmp, index=False)
            tmp.replace(guarded)
        log.warning("leak guard: dropped the unseen label columns %s from the training manifest (%s -> %s)",
                    list(self.dropped), self.full_manifest, guarded)  # fmt: skip
        return guarded

    @property
    def run_tags(self) -> dict[str, str]:
        """MLflow tags saying what the guard did (set once ``prepare`` ran)."""
        return {
            "cxrlt.leak_guard.unseen": ",".join(self.unseen),
            "cxrlt.leak_guard.dropped_columns": ",".join(self.dropped) or "(none present)",
            "cxrlt.leak_guard.full_manifest_fingerprint": file_fingerprint(self.full_manifest)
            if self.full_manifest
            else "",
        }


def guard_unseen(source, unseen: Sequence[str] | None):
    """``source`` wrapped by ``SeenOnlySource`` when the task lists unseen labels, else ``source`` unchanged."""
    return SeenOnlySource(source, unseen) if unseen else source
