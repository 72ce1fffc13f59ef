"""``make pseudo-label``: a finished run fills the unlabelled cells of another dataset's manifest.

Each empty cell of a class the model knows becomes 1 at ``prob >= t`` (thresholds chosen on the run's own
validation predictions) and 0 otherwise, unless it lies within ``MARGIN`` of the threshold; labelled cells and
unknown classes are copied as written. Only ``train`` rows are filled by default: a filled validation or test
cell would score the new run against the teacher's guesses. The record of what was filled lies beside the
output (:mod:`training.data.pseudo_labels`). docs/data.md, "Pseudo-labels".
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from evaluation.thresholds import best_f1_threshold, select_thresholds, thresholds_from_mapping
from training.data.findings import KNOWN_FINDINGS
from training.data.manifest import SPLITS, file_fingerprint, load_manifest, read_manifest_table
from training.data.pseudo_labels import FORMAT, record_path
from training.errors import UserError, user_errors

MODES = ("per_class", "global")
BATCH = 256  # images decoded and scored at a time: bounded memory on a release of 100k+ images


class PseudoLabelInputError(UserError, ValueError):
    """A run whose validation predictions cannot choose thresholds, or an argument out of range."""


def fill_cells(values: np.ndarray, probs: np.ndarray, thresholds: np.ndarray, rows: np.ndarray,
               margin: float = 0.0) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    """The pseudo-labels of one manifest's cells.

    Args:
        values: ``(N, C)`` labels as the manifest holds them: 1, 0, NaN for an unlabelled cell.
        rows: ``(N,)`` bool, the rows that may be filled (the chosen splits).
        margin: cells with ``threshold - margin <= prob < threshold + margin`` stay unlabelled.

    Returns:
        ``(filled, pseudo)``: the labels (NaN where still unlabelled) and the ``(N, C)`` mask of the cells that are
        pseudo-labels. Labelled cells are never changed.
    """
    positive = probs >= thresholds + margin
    negative = probs < thresholds - margin
    pseudo = np.isnan(values) & rows[:, None] & (positive | negative)
    filled = np.where(pseudo, positive.astype(np.float64), values)
    return filled, pseudo


def validation_thresholds(frame: pd.DataFrame, labels: Sequence[str], mode: str, where: str) -> np.ndarray:
    """``(C,)`` thresholds chosen on a run's stored validation predictions: each class's F1-maximising one
    (``per_class``), or one F1-maximising threshold over every class's cells pooled (``global``).

    The file comes from the tracking store, which anyone with write access can edit, so it is checked first.

    Raises:
        PseudoLabelInputError: a class column missing, a probability not in [0, 1] or a target not -1/0/1.
    """
    missing = [c for name in labels for c in (name, f"true/{name}") if c not in frame]
    if missing or frame.empty:
        raise PseudoLabelInputError(f"{where}: no validation predictions for {missing[:5] or 'any image'}; the "
                                    "thresholds are chosen on them")  # fmt: skip
    probs = frame[list(labels)].apply(pd.to_numeric, errors="coerce").to_numpy(dtype=float)
    targets = frame[[f"true/{name}" for name in labels]].apply(pd.to_numeric, errors="coerce").to_numpy(dtype=float)
    bad = ~np.isfinite(probs) | (probs < 0) | (probs > 1) | ~np.isin(targets, (-1, 0, 1))
    if bad.any():
        row, column = np.argwhere(bad)[0]
        raise PseudoLabelInputError(f"{where}: row {row + 1}, class {labels[column]!r}: a probability must be in "
                                    "[0, 1] and a target -1, 0 or 1")  # fmt: skip
    if mode == "global":
        chosen = np.full(len(labels), best_f1_threshold(targets.ravel(), probs.ravel()))
    else:
        chosen = select_thresholds(targets, probs)
    return thresholds_from_mapping(chosen, labels)


def read_input(manifest: Path, root: Path, extra_columns: Sequence[str] = ()
               ) -> tuple[pd.DataFrame, pd.DataFrame, list[str]]:  # fmt: skip
    """The manifest as written (text) and its label columns parsed (1, 0, NaN), after the platform's checks.
    ``extra_columns`` are its metadata columns, declared as training declares them (``data.extra_columns``)."""
    checked = load_manifest(manifest, (), KNOWN_FINDINGS, root, extra_columns=extra_columns, splits=(),
                            refused="nothing was pseudo-labelled", image_roots=(root,))  # fmt: skip
    labels = [c for c in checked.table.columns if c in KNOWN_FINDINGS]
    return read_manifest_table(manifest), checked.table, labels


def predict(scorer, root: Path, paths: Sequence[str], classes: int) -> np.ndarray:
    """``(N, classes)`` probabilities of the model's seen classes, decoded as the run was trained."""
    parts = [scorer.predict_files([root / p for p in paths[i : i + BATCH]])[:, :classes]
             for i in range(0, len(paths), BATCH)]  # fmt: skip
    return np.concatenate(parts) if parts else np.zeros((0, classes))


def stored_thresholds(client, run_id: str, labels: Sequence[str], mode: str) -> np.ndarray:
    """:func:`validation_thresholds` on the run's stored ``predictions/val.csv``."""
    from mlflow.exceptions import MlflowException

    from training.runs import VAL_PREDICTIONS
    from training.tracking.artifacts import download

    with tempfile.TemporaryDirectory() as tmp:
        try:
            val = pd.read_csv(download(client, run_id, VAL_PREDICTIONS, tmp), dtype={"image_id": str})
        except (MlflowException, OSError, ValueError) as error:  # absent, unreadable or not a CSV
            raise PseudoLabelInputError(f"run {run_id}: no readable {VAL_PREDICTIONS} ({error})") from None
    return validation_thresholds(val, labels, mode, f"run {run_id} {VAL_PREDICTIONS}")


def write_cells(text: pd.DataFrame, known: Sequence[str], filled: np.ndarray, pseudo: np.ndarray) -> None:
    """Write the pseudo-labels into the manifest's text, adding the columns of classes it lacked (empty)."""
    for c, name in enumerate(known):
        column = text[name] if name in text else pd.Series("", index=text.index)
        text[name] = column.mask(pseudo[:, c], np.where(filled[:, c] == 1, "1", "0"))


def cell_lists(ids: np.ndarray, known: Sequence[str], filled: np.ndarray, pseudo: np.ndarray) -> dict:
    """The record's ``cells``: per class with any pseudo-label, the image ids filled with 1 and with 0."""
    return {name: {v: ids[pseudo[:, c] & (filled[:, c] == int(v))].tolist() for v in ("1", "0")}
            for c, name in enumerate(known) if pseudo[:, c].any()}  # fmt: skip


def pseudo_label(reference: str, manifest: Path, root: Path, out: Path, mode: str = "per_class",
                 margin: float = 0.0, splits: Sequence[str] = ("train",), client=None,
                 extra_columns: Sequence[str] = ()) -> dict:  # fmt: skip
    """Write ``out`` and its record (:func:`training.data.pseudo_labels.record_path`); returns the record. The
    manifest is checked before the store is opened or the model loaded: a bad row is refused in seconds."""
    text, parsed, present = read_input(manifest, root, extra_columns)
    from apps.serving import Scorer  # torch, MLflow and the model stack: only for a manifest that passed
    from training.tracking.uri import tracking_client

    client = client or tracking_client()
    scorer = Scorer.load(reference, client)
    known = list(scorer.finished.labels)
    thresholds = stored_thresholds(client, scorer.run_id, known, mode)
    rows = parsed["split"].isin(splits).to_numpy()
    values = np.stack([parsed[c].to_numpy(dtype=float) if c in present else np.full(len(parsed), np.nan)
                       for c in known], axis=1)  # fmt: skip
    probs = np.full(values.shape, np.nan)
    probs[rows] = predict(scorer, root, parsed.loc[rows, "path"].tolist(), len(known))
    filled, pseudo = fill_cells(values, probs, thresholds, rows, margin)
    write_cells(text, known, filled, pseudo)
    out.parent.mkdir(parents=True, exist_ok=True)
    text.to_csv(out, index=False)
    record = {
        "format": FORMAT, "manifest": out.name, "manifest_fingerprint": file_fingerprint(out),
        "input_manifest": str(manifest.resolve()), "input_fingerprint": file_fingerprint(manifest),
        "root": str(root.resolve()), "source_run": scorer.run_id, "model": reference, "thresholds_mode": mode,
        "thresholds": dict(zip(known, map(float, thresholds), strict=True)), "margin": margin,
        "splits": list(splits), "extra_columns": list(extra_columns),
        "cells": cell_lists(text["image_id"].to_numpy(), known, filled, pseudo),
    }  # fmt: skip
    record_path(out).write_text(json.dumps(record, indent=1) + "\n")
    return record


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", required=True, help="run id or models:/<name>@<alias> | models:/<name>/<version>")
    parser.add_argument("--manifest", type=Path, required=True, help="the manifest whose empty cells are filled")
    parser.add_argument("--root", type=Path, default=None, help="its image folder (default: the manifest's folder)")
    parser.add_argument("--out", type=Path, required=True, help="the new manifest (its record: <out>.pseudo.json)")
    parser.add_argument("--thresholds", default="per_class", choices=MODES)
    parser.add_argument("--margin", type=float, default=0.0, help="keep cells within this of the threshold empty")
    parser.add_argument("--splits", nargs="+", default=["train"], choices=SPLITS, help="the splits filled")
    parser.add_argument("--extra-columns", nargs="*", default=[], help="the manifest's non-label columns (age, sex, "
                        "...), as data.extra_columns declares them to training")  # fmt: skip
    parser.add_argument("--debug", action="store_true", help="show the traceback of an input error")
    return parser.parse_args(argv)


def check_args(args: argparse.Namespace) -> None:
    if not args.manifest.is_file():
        raise PseudoLabelInputError(f"--manifest {args.manifest}: no such file")
    if not args.root.is_dir():
        raise PseudoLabelInputError(f"--root {args.root}: no such folder")
    if not 0 <= args.margin < 1:
        raise PseudoLabelInputError(f"--margin {args.margin}: must be in [0, 1)")
    if args.out.resolve() == args.manifest.resolve():
        raise PseudoLabelInputError(f"--out {args.out}: would overwrite the input manifest; name a new file")


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    args.root = args.root or args.manifest.parent
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    with user_errors(debug=args.debug):  # every refusal here is a UserError: bad files, run, config
        check_args(args)
        record = pseudo_label(args.model, args.manifest, args.root, args.out, args.thresholds, args.margin,
                              args.splits, extra_columns=args.extra_columns)  # fmt: skip
    counts = {name: len(cells["1"]) + len(cells["0"]) for name, cells in record["cells"].items()}
    print(f"wrote {args.out}: {sum(counts.values())} pseudo-label cells in {len(counts)} classes from run "
          f"{record['source_run']} ({args.thresholds} thresholds, margin {args.margin}, splits {args.splits}); "
          f"record {record_path(args.out)}")  # fmt: skip


if __name__ == "__main__":
    main()
