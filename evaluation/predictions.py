"""Reading a predictions CSV (ours, or a team's own submission draft) and aligning it with the ground truth."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from evaluation.prediction_columns import ID_COLUMN, PredictionsError, to_platform

__all__ = ["PredictionsError", "align_predictions", "read_predictions"]


def read_predictions(path: str | Path) -> pd.DataFrame:
    """A predictions CSV with every cell as text, so ids stay as written (``000123`` is not the number 123).

    Probabilities are converted, and checked cell by cell, in :func:`align_predictions`.

    Raises:
        PredictionsError: the file is missing, empty or not a CSV.
    """
    path = Path(path)
    if not path.is_file():
        raise PredictionsError(f"predictions file not found: {path}")
    try:
        return pd.read_csv(path, dtype=str, keep_default_na=False)
    except pd.errors.EmptyDataError:
        raise PredictionsError(f"{path}: empty file, not even a header line (expected {ID_COLUMN} and one "
                               "column per class)") from None  # fmt: skip
    except (pd.errors.ParserError, UnicodeDecodeError) as error:
        raise PredictionsError(f"{path}: not a readable CSV file: {error}") from None


def align_predictions(predictions: pd.DataFrame, truth: pd.DataFrame, labels: Sequence[str], source: str = "predictions"
                      ) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    """Match predictions to ground-truth rows by image id and return ``(targets, probs)``, both ``(N, C)``.

    Every check reports what is wrong where, so a broken export is fixed in one round.

    Args:
        predictions: an id column plus one probability column per label, in either spelling
            (:mod:`evaluation.prediction_columns`), with ids as text as :func:`read_predictions` reads them (a frame
            whose ids were parsed as numbers has already lost their leading zeros).
        truth: ``image_id`` plus one column per label (1, 0, or NaN for not labelled).
    """
    predictions = to_platform(predictions, labels, source)
    ids = predictions[ID_COLUMN].astype(str)
    duplicated = ids[ids.duplicated()].unique().tolist()
    if duplicated:
        raise PredictionsError(f"{source}: duplicated image_id(s) {duplicated[:5]}")
    truth_ids = truth[ID_COLUMN].astype(str)
    absent, extra = sorted(set(truth_ids) - set(ids)), sorted(set(ids) - set(truth_ids))
    if absent or extra:
        raise PredictionsError(
            f"{source}: ids do not match the ground truth: {len(absent)} missing (e.g. {absent[:3]}), "
            f"{len(extra)} unknown (e.g. {extra[:3]})"
        )
    values = predictions[list(labels)].apply(pd.to_numeric, errors="coerce").to_numpy(dtype=float)  # (N, C)
    bad = np.argwhere(~np.isfinite(values) | (values < 0) | (values > 1))
    if len(bad):
        row, col = bad[0]
        raw = predictions[labels[col]].iloc[row]
        raise PredictionsError(f"{source}: line {row + 2}, column {labels[col]!r}: {str(raw)!r} is not a probability in "
                               f"[0, 1] ({len(bad)} bad cell(s) in all)")  # fmt: skip
    order = pd.Series(np.arange(len(ids)), index=ids.to_numpy())[truth_ids.to_numpy()].to_numpy()
    targets = truth[list(labels)].to_numpy(dtype=float)
    return np.where(np.isnan(targets), -1.0, targets), values[order]
