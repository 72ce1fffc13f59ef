"""A trial's liveness across workers: heartbeats that outlast a failed write, the grace rule, and a live worker
whose trial was declared dead anyway (docs/scaling.md, "Tuning on many machines").

Optuna's heartbeat thread ends at the first failed database write, so a live worker's trial goes silent for good
and another worker fails it; :class:`SteadyHeartbeatStorage` logs the failure and beats again one interval later.
A beat itself is not delayed by a busy training (milliseconds of CPU); only its write waits for the database.

:func:`min_grace_period` is the slowest gap between two written beats of a live worker: two intervals, the
slowest write's whole wait, and the storage clock's one-second step; a shorter ``tune.grace_period`` is named
when the storage opens. A worker silent past the grace period that comes back must not finish its trial (Optuna
refuses a finished FAIL): :func:`ensure_running` raises :class:`TrialTakenOver`, and the study goes on.
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
