"""``make data-check``: what a dataset holds and everything wrong with it, before any training is attempted.

The manifest is judged by :func:`training.data.manifest.check_manifest`, the validation training itself runs, and
every image is decoded by training's own decoder (``decode``, the default of ``make data-check``), so a dataset the
check passes is one training accepts. It also prints the counts a reader wants before spending hours on a run.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import pandas as pd

from evaluation.groups import frequency_group
from training.data.findings import KNOWN_FINDINGS
from training.data.heterogeneity import measure
from training.data.images import MAX_PIXELS, check_file, read_grayscale
from training.data.manifest import SPLITS, check_manifest, csv_line, outside_roots
from training.data.row_tasks import progress_lines, row_problems


@dataclass
class DataReport:
    """The check's findings: printable sections and the errors that make it fail."""

    sections: dict[str, str] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    source: str = ""

    def render(self) -> str:
        parts = [f"== {title}\n{body}" for title, body in self.sections.items()]
        where = f" in {self.source}" if self.source else ""
        verdict = f"{len(self.errors)} error(s){where}:\n  " + "\n  ".join(self.errors) if self.errors else "no errors"
        return "\n\n".join(parts + [f"== verdict\n{verdict}"])


def check_dataset(manifest_path: Path, root: Path, extra_columns=(), decode: bool = False, workers: int = 4,
                  size: int = 64, labels: Sequence[str] | None = None,
                  vocabulary: Sequence[str] = KNOWN_FINDINGS, patient_ids: bool = True,
                  heterogeneity: Mapping | None = None, max_pixels: int | None = MAX_PIXELS,
                  image_roots: Sequence[Path] | None = None, files_note: str | None = None) -> DataReport:  # fmt: skip
    """Counts per class and split with head-to-tail groups, patients per split, overlaps, unreadable files, and
    how the sources differ (:mod:`training.data.heterogeneity`).

    Args:
        decode: fully decode every image with training's decoder, so what training refuses is refused here;
            False: only header, declared size and end marker (seconds instead of minutes, but a file cut short
            inside its pixel data passes).
        labels: a task's label columns (``+task=<name>``), required as training requires them; without a task
            every known finding column counts as a label.
        patient_ids: False when the release has none (ROCOv2), so the report says disjointness is not checkable.
        image_roots: folders the paths must lie under, as training requires; a path outside is never opened.
            None: not judged (``data.allow_outside_root=true``).
        files_note: set by a source with no images here (PadChest's table alone): printed instead of opening any.
    """
    report = DataReport(source=str(manifest_path))
    found = check_manifest(manifest_path, labels, vocabulary, root=root, extra_columns=extra_columns,
                           check_files=False, image_roots=image_roots)  # fmt: skip
    report.errors += found.problems
    table = found.table
    if table is None or table.empty:
        return report  # nothing to count: the problems say why
    splits = [s for s in SPLITS if (table["split"] == s).any()]

    present = [c for c in found.labels if c in table.columns]  # a task label may be missing (reported above)
    values = found.values[present]  # parsed once, by the manifest check
    counts = pd.DataFrame({s: (values[table["split"] == s] == 1).sum() for s in splits}, index=present)
    counts["total"] = counts.sum(axis=1)
    n_train = int((table["split"] == "train").sum())
    if n_train:
        counts["train %"] = (100 * counts["train"] / n_train).round(2)
        counts["group"] = [frequency_group(c, counts.at[c, "train"] / n_train) for c in counts.index]
    report.sections["positives per class"] = counts.to_string()

    per_split = table.groupby("split").agg(images=("image_id", "size"), patients=("patient_id", "nunique"))
    report.sections["images and patients per split"] = per_split.reindex(splits).to_string()
    spread = table.groupby("patient_id")["split"].nunique()  # vectorised: a per-patient list takes 20 s at 67k
    shared = table[table["patient_id"].isin(spread.index[spread > 1])].groupby("patient_id")["split"].unique()
    overlaps = [f"patient {p!r} in {sorted(s)}" for p, s in shared.items()]
    report.sections["patients shared between splits"] = "\n".join(overlaps[:20]) or (
        "none (patient-disjoint)"
        if patient_ids
        else "not checkable: the release has no patient ids (each image is its own patient)"
    )

    if files_note is not None:
        report.sections["files"] = report.sections["source heterogeneity"] = files_note
        return report
    check = (
        (lambda path: read_grayscale(path, size, max_pixels=max_pixels))
        if decode
        else partial(check_file, max_pixels=max_pixels)
    )
    outside = set(outside_roots(table["path"], image_roots)) if image_roots is not None else set()
    paths = table["path"].to_numpy(dtype=object)

    def probe(index: int) -> str | None:
        if index in outside:  # reported by the manifest check; never opened
            return None
        try:
            check(root / paths[index])
            return None
        except (OSError, ValueError) as error:
            return f"line {csv_line(index)}, column 'path', image {table.at[index, 'image_id']!r}: {error}"

    how = "decoded" if decode else "header and end marker checked"
    bad = row_problems(probe, len(paths), workers, progress_lines(how))  # in row order: listed by line
    report.sections["files"] = f"{len(table) - len(bad)} of {len(table)} readable ({how})"
    report.errors += bad
    settings = {"workers": workers, "max_pixels": max_pixels, **(heterogeneity or {})}
    inside = table.drop(index=sorted(outside))
    report.sections["source heterogeneity"] = measure(inside, root, present, **settings).render()
    return report
