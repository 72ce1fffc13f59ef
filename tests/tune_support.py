"""Helpers shared by the tuning integration tests."""

from __future__ import annotations

import os
import re
import sys
import time
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path

import lightning.pytorch as L
import optuna
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate
from sqlalchemy import create_engine, text

from training.tuning.trial_run import WORKER_ATTR

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
#: A study small enough for a test: the smoke data cut further, one epoch, no bootstrap, no pruning.
TINY = ("debug=smoke", "data.subset={train:64,val:48,test:32}", "trainer.max_epochs=1", "evaluation.n_boot=0",
        "evaluation.per_source=false", "pruner=none")  # fmt: skip


def tune_command(tmp: Path, trials: int, *overrides: str) -> list[str]:
    """What `make tune TRIALS=<trials> STORAGE=... ARGS="..."` runs, with every output under ``tmp``."""
    return [
        sys.executable, "-m", "training.tune", "task=task1", f"tune.trials={trials}",
        f"tune.storage=sqlite:///{tmp}/optuna.db", f"tracking.artifact_root={tmp}/artifacts",
        f"tracking.checkpoint_root={tmp}/checkpoints", f"data.source.root={tmp}/synthetic", *overrides,
    ]  # fmt: skip


def prepare_data(tmp: Path) -> None:
    """Generate the synthetic data set once, up front: fresh workers started together would each generate it."""
    with initialize_config_dir(str(CONFIGS), version_base="1.3"):
        cfg = compose("tune", overrides=["debug=smoke", f"data.source.root={tmp}/synthetic"])
    instantiate(cfg.data.source).prepare()


def shared_study_trials(
    study: optuna.Study, target: int, workers: int, record: str = ""
) -> list[optuna.trial.FrozenTrial]:
    """The trials of a study ``workers`` shared, after checking their count: at least ``target``, and at most one more
    per extra worker (two workers that finish together may both start one: Optuna's ``MaxTrialsCallback``)."""
    trials = study.get_trials()
    assert target <= len(trials) <= target + workers - 1, record
    return trials


#: Lines of a worker's output that say how one of its trials ended, or why it stopped.
TRIAL_LINES = re.compile(r"Trial \d+ (finished|failed|pruned)|^trial \d+|stopped beating|failed under this worker|"
                         r"Cannot tell|Error|Traceback|nothing to run")  # fmt: skip


#: Each trial's last heartbeat, from Optuna's own table (its Python API does not expose heartbeats).
HEARTBEATS = text(
    "SELECT t.number, h.heartbeat FROM trial_heartbeats h JOIN trials t ON t.trial_id = h.trial_id "
    "JOIN studies s ON s.study_id = t.study_id WHERE s.study_name = :name"
)


def study_record(storage: str, study_name: str, outputs: Sequence[str] = ()) -> str:
    """The study as a shared-study assertion prints it on failure, so that a failure says which rule ended a trial.

    Per trial: state, worker, start and end, last heartbeat (:data:`HEARTBEATS`) and how far it lay from the end,
    the retry records (``failed_trial``, ``retry_history``); then the database clock, and each
    worker's lines about its trials.
    A trial failed by the dead-worker rule shows a heartbeat older than ``tune.grace_period`` at a FAIL written by
    another worker; a trial failed by its own training shows the worker's "Trial N failed ... because of" line.
    """
    study = optuna.load_study(study_name=study_name, storage=storage)
    engine = create_engine(storage)
    try:
        with engine.connect() as connection:
            beats = dict(connection.execute(HEARTBEATS, {"name": study_name}).all())
            now = connection.execute(text("SELECT CURRENT_TIMESTAMP")).scalar()
    finally:
        engine.dispose()
    lines = [f"study {study_name}: database clock {now}, this machine's {datetime.now()}"]
    for t in study.get_trials(deepcopy=False):
        beat, end = _naive(beats.get(t.number)), t.datetime_complete
        gap = f" ({(end - beat).total_seconds():+.1f} s before the end)" if beat and end else ""
        retry = {k: t.system_attrs[k] for k in ("failed_trial", "retry_history") if k in t.system_attrs}
        lines.append(f"trial {t.number}: {t.state.name} worker={t.user_attrs.get(WORKER_ATTR)} "
                     f"start={t.datetime_start} end={end} last_heartbeat={beat}{gap} retry={retry or None} "
                     f"values={t.values}")  # fmt: skip
    for k, output in enumerate(outputs):
        lines.append(f"--- worker {k}:")
        lines += [line for line in output.splitlines() if TRIAL_LINES.search(line)][-40:]
    return "\n".join(lines)


def _naive(stamp: datetime | str | None) -> datetime | None:
    """A heartbeat as a plain datetime: SQLite hands back text, PostgreSQL a datetime."""
    return datetime.fromisoformat(stamp) if isinstance(stamp, str) else stamp


class HoldFit(L.Callback):
    """Stop a worker's ``at``-th trial of this process mid-fitting, as if its machine froze, until the test kills it.

    Polling a real trial's state and killing it once it looks busy races the trial's own end (a tiny trial takes
    seconds); holding it at a known point makes the kill land mid-trial every time. The hold ends on its own after
    ``hold_s`` (failing the trial) so a test that never kills cannot leave a worker behind for good.
    """

    fits = 0  # per process: every trial of a worker runs in its one process, each with a new instance

    def __init__(self, marker: str, at: int = 1, hold_s: float = 600.0):
        self.marker, self.at, self.hold_s = Path(marker), at, hold_s

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        HoldFit.fits += 1

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if HoldFit.fits != self.at:
            return
        self.marker.write_text(str(os.getpid()))
        time.sleep(self.hold_s)
        raise RuntimeError(f"HoldFit: nobody killed this worker within {self.hold_s} s")
