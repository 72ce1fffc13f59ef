"""A trial's liveness across workers: heartbeats that outlast a failed write, the grace rule, and a live worker
whose trial was declared dead anyway.

Heartbeats. Optuna beats for a running trial from a thread of the worker's process, every
``tune.heartbeat_interval`` seconds, whatever the trial is doing: a slow training step, a busy CPU or a long test
phase do not delay it, since a beat needs milliseconds of CPU and the interpreter lock, which training releases
all the time (measured: at a load of 10 on two cores, every trial's last beat was under 30 s old at its end).
What delays a beat is its database write, which waits for the database (SQLite's file lock up to the engine's
busy timeout, PostgreSQL's connection up to its connect timeout) and may then fail. Optuna's heartbeat thread ends
at the first write that fails: the trial goes silent for good while its worker trains on, and another worker
fails it once ``tune.grace_period`` is over (then the live worker crashes on finishing a trial that is already
FAIL). :class:`SteadyHeartbeatStorage` logs the failed write instead, and the thread beats again one interval
later.

Grace period. The slowest realistic gap between two written beats of a live worker is one beat lost to the
slowest write: an interval, that write's whole wait, a second interval, plus the storage clock's one-second step
(SQLite stores seconds). :func:`min_grace_period` is that sum; a ``tune.grace_period`` below it is named when the
storage opens. The defaults, 30 s and 150 s, cover it for SQLite's 60 s lock wait (121 s), the slowest of the
storages, and for PostgreSQL's 10 s connect timeout (71 s), with room for a starved scheduler. A shorter grace
period finds a dead worker's trial sooner, at the risk of failing a live one.

Taken over. A worker silent past the grace period (its machine suspended, the database unreachable for longer
than that) is dead to the others: its trial is failed and queued again, and a retry runs the same point. When it
comes back it must not finish that trial, which Optuna refuses with an error: :func:`ensure_running`, asked before
fitting, after each validation and before the trial returns, raises :class:`TrialTakenOver`, and
:func:`optimize_until_done` says so in one line and goes on with the study.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import optuna
from optuna.exceptions import StorageInternalError
from sqlalchemy.exc import SQLAlchemyError

from training.tracking.redaction import redact_text

log = logging.getLogger(__name__)

#: The storage clock's resolution: SQLite's ``CURRENT_TIMESTAMP`` counts whole seconds.
CLOCK_STEP_S = 1.0


def min_grace_period(interval: float, write_wait: float) -> float:
    """The shortest grace period that never fails a live worker's trial: two intervals and one write's whole wait
    (one beat lost to the slowest write), plus the clock's step."""
    return 2 * float(interval) + float(write_wait) + CLOCK_STEP_S


def check_grace_period(interval: float, grace: float | None, write_wait: float) -> None:
    """Name a grace period a live worker could outlast (Optuna's default, ``2 * interval``, when unset)."""
    grace = 2 * float(interval) if grace is None else float(grace)
    needed = min_grace_period(interval, write_wait)
    if grace < needed:
        log.warning("tune.grace_period=%g s is under %.0f s, two heartbeats (tune.heartbeat_interval=%g s) plus the "
                    "storage's longest write wait (%.0f s): a live worker that loses one beat to a slow write can "
                    "have its trial failed by another worker", grace, needed, interval, write_wait)  # fmt: skip


class SteadyHeartbeatStorage(optuna.storages.RDBStorage):
    """Optuna's RDB storage whose heartbeat outlasts a failed write (module docstring)."""

    def record_heartbeat(self, trial_id: int) -> None:
        try:
            super().record_heartbeat(trial_id)
        except (StorageInternalError, SQLAlchemyError) as error:
            cause = redact_text(str(error.__cause__ or error).splitlines()[0])
            log.warning("heartbeat of a running trial not written (%s); beating again in %s s", cause,
                        self.get_heartbeat_interval())  # fmt: skip


class TrialTakenOver(BaseException):
    """This worker's trial was failed by another worker's dead-worker rule while this worker still ran it.

    A ``BaseException``, like ``KeyboardInterrupt``: Optuna's ``catch`` would record it as this worker's failure of
    the trial and then fail on finishing a trial that is already FAIL, so it must end the trial past that.
    """

    def __init__(self, number: int):
        super().__init__(f"trial {number} was failed under this worker by another worker's dead-worker rule (no "
                         f"heartbeat written for tune.grace_period); its retry runs the same point, so this worker "
                         f"drops it and goes on")  # fmt: skip
        self.number = number


def ensure_running(trial: optuna.Trial) -> None:
    """Raise :class:`TrialTakenOver` if ``trial`` is no longer RUNNING in the storage (another worker failed it)."""
    running = trial.study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,))
    if not any(t.number == trial.number for t in running):
        raise TrialTakenOver(trial.number)


def optimize_until_done(study: optuna.Study, objective: Callable[[optuna.Trial], Any],
                        trials_left: Callable[[optuna.Study], int], timeout: float | None,
                        **optimize_args: Any) -> None:  # fmt: skip
    """``study.optimize`` for the ``trials_left(study)`` trials this worker runs, counted again after a trial taken
    over (which ends ``optimize``). ``timeout`` (``tune.timeout``) counts from this call: no trial starts after it."""
    deadline = None if timeout is None else time.monotonic() + float(timeout)
    while (count := trials_left(study)) > 0:
        left = None if deadline is None else deadline - time.monotonic()
        if left is not None and left <= 0:
            return
        try:
            study.optimize(objective, n_trials=count, timeout=left, **optimize_args)
            return
        except TrialTakenOver as taken:
            log.warning("%s", taken)
