"""Limits on a test's subprocess tied to the work it does, not to the wall clock.

A busy CI machine (or this shared one) stretches a training's wall time several-fold, so a fixed ``timeout=600``
fails a healthy run under load: ``test_killed_run_resumes_into_the_same_run`` did. CPU time does not stretch. A
process tree is stopped when it has used more CPU than its work could need (a runaway), or when it has used none for
a long stretch of wall time (a hang: a deadlock or a wait on something that never comes); a process that is merely
slowed by load keeps accruing CPU and is left alone.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import psutil


def tree_cpu_seconds(pid: int) -> float:
    """CPU seconds (user + system) of a process, its reaped children and its live descendants."""
    try:
        root = psutil.Process(pid)
        members = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0.0
    total = 0.0
    for member in members:
        try:
            times = member.cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += times.user + times.system + (times.children_user + times.children_system if member is root else 0)
    return total


@dataclass
class WorkBudget:
    """Raises ``AssertionError`` from :meth:`check` past ``cpu_seconds`` of CPU, or after ``stall_seconds`` of wall
    time in which the tree used no CPU."""

    process: subprocess.Popen
    cpu_seconds: float
    stall_seconds: float = 300.0
    _used: float = 0.0
    _last_progress: float = field(default_factory=time.monotonic)

    def check(self, what: str) -> None:
        used = tree_cpu_seconds(self.process.pid)
        now = time.monotonic()
        if used > self._used + 0.05:
            self._used, self._last_progress = used, now
        assert self._used <= self.cpu_seconds, f"{what}: used {self._used:.0f} CPU s, more than {self.cpu_seconds:.0f}"
        assert now - self._last_progress <= self.stall_seconds, (
            f"{what}: no CPU used for {self.stall_seconds:.0f} s (hung) after {self._used:.0f} CPU s"
        )


def wait_working(
    process: subprocess.Popen,
    what: str,
    cpu_seconds: float,
    until: Callable[[], bool] | None = None,
    poll: float = 0.05,
) -> None:
    """Wait until ``process`` exits (or ``until()`` holds) within a :class:`WorkBudget`; kill its tree on failure."""
    budget = WorkBudget(process, cpu_seconds)
    try:
        while process.poll() is None and not (until and until()):
            budget.check(what)
            time.sleep(poll)
    except AssertionError:
        for member in psutil.Process(process.pid).children(recursive=True):
            member.kill()
        process.kill()
        process.wait()
        raise
