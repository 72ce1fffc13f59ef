"""Leak guard: a zero-shot task trains on a manifest without the images of its unseen findings, nor their columns.

Task 2's rule (docs/rules.md §11) bans every image showing an unseen finding, not only its labels: a model learns a
finding from pixels whether or not a label says so, and "the data module only builds seen targets" is a property
of code that can change; the guard makes the rule a property of the data. ``test`` is kept whole and in order,
because the unseen-class report scores the six findings there from the full manifest (``full_manifest``).
:mod:`training.zeroshot.training_rule` checks the result before training.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from training.data.manifest import file_fingerprint

log = logging.getLogger(__name__)

GUARD_DIR = Path("data/manifests/seen_only")
#: Suffix of the guarded copies' names: copies of the column-only guard (which kept the images) are never reused.
GUARD_VERSION = "rule2"
#: The splits the rule removes images from; ``test`` is what the unseen findings are scored on.
RULE_SPLITS = ("train", "val")
#: ``cxrlt.training_rule.checked`` of a manifest whose training rows leave the rule nothing to read: a release that
#: labels the unseen findings on its evaluation rows only. Not "true": no image was shown to be free of them.
NOTHING_TO_CHECK = "false (no unseen label on the training rows: nothing to check)"


def unseen_labelled(table: pd.DataFrame, unseen: Sequence[str]) -> pd.Series:
    """Per row: a label (``1`` or ``0``) in at least one of the ``unseen`` columns present, not an empty cell."""
    columns = [c for c in unseen if c in table.columns]
    if not columns:
        return pd.Series(False, index=table.index)
    return table[columns].apply(pd.to_numeric, errors="coerce").notna().any(axis=1)


def unseen_positive(table: pd.DataFrame, unseen: Sequence[str]) -> pd.Series:
    """Per row: positive (``1``, as the manifest writes it) for at least one of the ``unseen`` columns present."""
    columns = [c for c in unseen if c in table.columns]
    if not columns:
        return pd.Series(False, index=table.index)
    values = table[columns].apply(pd.to_numeric, errors="coerce")
    return (values == 1).any(axis=1)


@dataclass
class Exclusion:
    """What the guard removed: images per split, positives per unseen finding (train + val), test rows kept, and
    how many train/val rows carry an unseen label at all (none: the rule had nothing to read)."""

    images: dict[str, int] = field(default_factory=dict)
    by_label: dict[str, int] = field(default_factory=dict)
    test_kept: int = 0
    test_unseen_positive: int = 0
    labelled: int = 0


def exclude_unseen_images(table: pd.DataFrame, unseen: Sequence[str]) -> tuple[pd.DataFrame, Exclusion]:
    """``table`` without its train/val rows positive for an unseen finding (columns kept), and the counts."""
    positive = unseen_positive(table, unseen)
    in_rule = table["split"].isin(RULE_SPLITS)
    drop = positive & in_rule
    record = Exclusion(
        images={split: int((positive & (table["split"] == split)).sum()) for split in RULE_SPLITS},
        by_label={
            c: int((pd.to_numeric(table.loc[in_rule, c], errors="coerce") == 1).sum())
            for c in unseen
            if c in table.columns
        },
        test_kept=int((table["split"] == "test").sum()),
        test_unseen_positive=int((positive & (table["split"] == "test")).sum()),
        labelled=int((unseen_labelled(table, unseen) & in_rule).sum()),
    )
    return table.loc[~drop], record


class SeenOnlySource:
    """Wraps any manifest source; ``prepare`` returns a copy of its manifest that obeys the training rule.

    ``root``, ``name`` and ``extra_columns`` of the wrapped source pass through, so images resolve as before. Copies go
    to ``out_dir`` under the full manifest's fingerprint, never beside the often read-only images.
    """

    def __init__(self, source, unseen: Sequence[str], out_dir: str | Path = GUARD_DIR):
        self.source = source
        self.unseen = tuple(unseen)
        self.out_dir = Path(out_dir)
        self.dropped: tuple[str, ...] = ()
        self.excluded: Exclusion | None = None
        self.full_manifest: Path | None = None

    def __getattr__(self, name):  # root, name, extra_columns, ... of the wrapped source
        if name == "source":
            raise AttributeError(name)
        return getattr(self.source, name)

    def prepare(self) -> Path:
        """Prepare the wrapped source, then write (once) and return the manifest copy that obeys the rule."""
        self.full_manifest = Path(self.source.prepare())
        table = pd.read_csv(self.full_manifest, dtype=str, keep_default_na=False)
        self.dropped = tuple(c for c in self.unseen if c in table.columns)
        if not self.dropped:
            self.excluded = None
            log.warning("leak guard: the manifest has none of the unseen columns %s, so the training rule cannot be "
                        "checked (docs/rules.md §11); nothing to drop", list(self.unseen))  # fmt: skip
            return self.full_manifest
        kept, self.excluded = exclude_unseen_images(table, self.dropped)
        name = f"{file_fingerprint(self.full_manifest)}-{self.full_manifest.stem}-{GUARD_VERSION}.csv"
        guarded = self.out_dir / name
        if not guarded.is_file():
            guarded.parent.mkdir(parents=True, exist_ok=True)
            tmp = guarded.with_suffix(".tmp")
            kept.drop(columns=list(self.dropped)).to_csv(tmp, index=False)
            tmp.replace(guarded)
        counts = ", ".join(f"{label} {n}" for label, n in self.excluded.by_label.items())
        log.warning(
            "training rule (docs/rules.md §11): excluded %d train and %d val images positive for an unseen finding "
            "(positives: %s); test kept whole (%d images, %d with an unseen finding); dropped the columns %s "
            "(%s -> %s)", self.excluded.images["train"], self.excluded.images["val"], counts,
            self.excluded.test_kept, self.excluded.test_unseen_positive, list(self.dropped),
            self.full_manifest, guarded,
        )  # fmt: skip
        if not self.excluded.labelled:
            log.warning("training rule (docs/rules.md §11): no train or val row of %s has a label for %s, so nothing "
                        "could be checked; the run is tagged cxrlt.training_rule.checked=%r",
                        self.full_manifest, list(self.dropped), NOTHING_TO_CHECK)  # fmt: skip
        return guarded

    @property
    def run_tags(self) -> dict[str, str]:
        """MLflow tags saying what the guard did (set once ``prepare`` ran)."""
        tags = {
            **getattr(self.source, "run_tags", {}),  # what the wrapped adapter records (the release's removals)
            "cxrlt.leak_guard.unseen": ",".join(self.unseen),
            "cxrlt.leak_guard.dropped_columns": ",".join(self.dropped) or "(none present)",
            "cxrlt.leak_guard.full_manifest_fingerprint": file_fingerprint(self.full_manifest)
            if self.full_manifest
            else "",
        }
        if self.excluded is None:
            return {**tags, "cxrlt.training_rule.checked": "false (no unseen column in the manifest)"}
        record = self.excluded
        return {
            **tags,
            "cxrlt.training_rule.checked": "true" if record.labelled else NOTHING_TO_CHECK,
            **{f"cxrlt.training_rule.excluded.{split}": str(n) for split, n in record.images.items()},
            "cxrlt.training_rule.excluded.by_label": ",".join(f"{k}:{v}" for k, v in record.by_label.items()),
            "cxrlt.training_rule.test_kept": str(record.test_kept),
        }


def guard_unseen(source, unseen: Sequence[str] | None):
    """``source`` wrapped by ``SeenOnlySource`` when the task lists unseen labels, else ``source`` unchanged."""
    return SeenOnlySource(source, unseen) if unseen else source
