"""The best ``checkpoint.save_top_k`` checkpoints of a training, as the weights a model needs, in its MLflow run.

A resume needs optimizer state, counters and callback states; a finished model only its weights (the EMA average
where used), and the rest is several times their size (AdamW keeps two tensors per weight). So local checkpoints
stay under ``tracking.checkpoint_root/<run id>`` and the run gets :func:`weights_only` copies: ``best.ckpt`` (the
one tested) and, with ``save_top_k`` above 1, ``top/rank<n>.ckpt`` with ``top/index.json`` and per-rank
predictions for ``make ensemble``. References ``<run id>:rank<n>`` and ``<run id>:top<k>``: :mod:`training.run_lookup`.
"""

from __future__ import annotations

import json
import logging
import math
import tempfile
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from training.checkpoint_io import AtomicCheckpointIO
from training.errors import UserError

log = logging.getLogger(__name__)

#: What a finished model is rebuilt from; everything else in a Lightning checkpoint serves resuming only.
WEIGHT_KEYS = ("state_dict", "epoch", "global_step")
TOP_FOLDER = "checkpoints/top"
INDEX = f"{TOP_FOLDER}/index.json"


def weights_only(checkpoint: Mapping[str, Any]) -> dict[str, Any]:
    """The part of a Lightning checkpoint a finished model needs: ``state_dict`` (already the EMA average when
    EMA ran, :mod:`training.models.ema`), and the epoch and optimizer step it was taken at."""
    return {key: checkpoint[key] for key in WEIGHT_KEYS if key in checkpoint}


def checkpoint_artifact(rank: int) -> str:
    """The run artifact holding the ``rank``-th best checkpoint's weights (rank 1 is ``checkpoints/best.ckpt``)."""
    return "checkpoints/best.ckpt" if rank == 1 else f"{TOP_FOLDER}/rank{rank}.ckpt"


def predictions_artifact(rank: int, split: str) -> str:
    """The run artifact with the ``rank``-th checkpoint's plain predictions on ``split``."""
    return f"predictions/{split}.csv" if rank == 1 else f"predictions/rank{rank}/{split}.csv"


@dataclass(frozen=True)
class Kept:
    """One kept checkpoint: its local file, rank (1 = best), epoch, optimizer step and monitored value."""

    path: str
    rank: int
    epoch: int
    step: int
    monitor: str
    value: float


def ranked(scores: Mapping[str, Any], mode: str) -> list[tuple[str, float]]:
    """``(path, value)`` of ``ModelCheckpoint.best_k_models``, best first; ties keep the earlier-saved file first
    (the dict's order), as Lightning's own best is the first to reach a value. A NaN score ranks last."""
    values = [(path, float(score)) for path, score in scores.items()]
    sign = -1.0 if mode == "max" else 1.0
    return sorted(values, key=lambda item: (math.isnan(item[1]), sign * item[1] if not math.isnan(item[1]) else 0.0))


def kept_checkpoints(scores: Mapping[str, Any], mode: str, monitor: str, first: str | None = None) -> list[Kept]:
    """The kept checkpoints that are still on disk, ranked, ``first`` (the tested best) at rank 1 whatever the
    order of equal scores. A resumed run's callback state may name a file that the interrupted process removed
    after its last ``last.ckpt``; such a file is skipped with a warning."""
    kept = []
    order = sorted(ranked(scores, mode), key=lambda item: str(item[0]) != first) if first else ranked(scores, mode)
    for path, value in order:
        if not Path(path).is_file():
            log.warning("kept checkpoint %s is missing (removed after the checkpoint resumed from); skipped", path)
            continue
        state = AtomicCheckpointIO().load_checkpoint(path, map_location="cpu")
        kept.append(Kept(str(path), len(kept) + 1, int(state["epoch"]), int(state["global_step"]), monitor, value))
    return kept


def index_document(kept: list[Kept]) -> dict:
    """``checkpoints/top/index.json``: every kept checkpoint, best first, without local paths."""
    rows = [{key: value for key, value in asdict(item).items() if key != "path"} for item in kept]
    for row in rows:
        row["artifact"] = checkpoint_artifact(row["rank"])
    return {"format": 1, "checkpoints": rows}


def write_weights(source: str | Path, target: Path) -> Path:
    """Write :func:`weights_only` of the local checkpoint ``source`` to ``target``; returns ``target``."""
    io = AtomicCheckpointIO()
    io.save_checkpoint(weights_only(io.load_checkpoint(source, map_location="cpu")), target)
    return target


def upload_kept(session, kept: list[Kept]) -> None:
    """Log the kept checkpoints' weights (and, with more than one, their index) into the run."""
    with tempfile.TemporaryDirectory() as tmp:
        for item in kept:
            artifact = Path(checkpoint_artifact(item.rank))
            session.log_artifact(write_weights(item.path, Path(tmp) / artifact.name), str(artifact.parent))
        if len(kept) > 1:
            index = Path(tmp) / Path(INDEX).name
            index.write_text(json.dumps(index_document(kept), indent=1) + "\n")
            session.log_artifact(index, TOP_FOLDER)


def rank_predictions(model, datamodule, kept: list[Kept], folder: Path) -> list[Path]:
    """Write ``predictions/rank<n>/{val,test}.csv`` (ranks 2..k) under ``folder``: each kept checkpoint's plain
    probabilities, in the layout of the test phase's ``predictions/<split>.csv`` (rank 1's), so ``make ensemble``
    reads a rank as it reads a run. ``model`` is left holding the last rank's weights."""
    import pandas as pd

    from evaluation.evaluate import predict
    from evaluation.prediction_columns import ID_COLUMN, TRUE_PREFIX

    labels = list(model.labels)
    written = []
    for item in kept[1:]:
        state = AtomicCheckpointIO().load_checkpoint(item.path, map_location="cpu")
        model.load_state_dict(state["state_dict"])
        model.eval()
        for split in ("val", "test"):
            ids = datamodule.split_frame(split)[ID_COLUMN].reset_index(drop=True)
            truth = datamodule.datasets[split].targets.numpy().astype(int)
            frame = pd.concat([ids, pd.DataFrame(predict(model, datamodule, split), columns=labels),
                               pd.DataFrame(truth, columns=[TRUE_PREFIX + name for name in labels])], axis=1)  # fmt: skip
            path = folder / predictions_artifact(item.rank, split)
            path.parent.mkdir(parents=True, exist_ok=True)
            frame.to_csv(path, index=False)
            written.append(path)
    return written


def kept_ranks(document: object, where: str) -> int:
    """How many checkpoints an ``index.json`` read back from a run lists, checked: a JSON object of format 1
    whose ``checkpoints`` are objects ranked 1, 2, ... in order (the file is untrusted, like everything a run holds).
    """
    rows = document.get("checkpoints") if isinstance(document, dict) and document.get("format") == 1 else None
    if not isinstance(rows, list) or not rows or not all(isinstance(row, dict) for row in rows):
        raise UserError(f"{where}: expected {{'format': 1, 'checkpoints': [...]}} with one object per checkpoint")
    ranks = [row.get("rank") for row in rows]
    if ranks != list(range(1, len(rows) + 1)):
        raise UserError(f"{where}: the checkpoints' ranks are {ranks[:6]}, not 1, 2, ... in order")
    return len(rows)
