"""A stopped command says so: SIGTERM or SIGINT ends it with status 128 + signal, its run KILLED and resumable.

Lightning turns SIGTERM (what a scheduler, ``timeout`` or CI sends) into a ``SystemExit`` without a code, so a
training stopped mid-epoch would exit 0, and a signal outside ``fit`` (the test phase) would kill the process with
its run left RUNNING. Here both signals raise :class:`Interrupted` in the main thread wherever it is; it is not an
``Exception`` (no ``except Exception`` swallows it) nor a ``KeyboardInterrupt`` (which Lightning turns into
``sys.exit(1)``), so it reaches the run's owner, which marks the run KILLED, and then the entry point, which prints
one line and exits with the shell's convention for a signal.

A run whose process died without a word (SIGKILL, a lost node) is recognised afterwards from the process tag each
training run carries (:data:`PROCESS_TAG`): same host, and that process is gone.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading

import psutil

log = logging.getLogger(__name__)

#: ``<host>:<pid>:<process start time>`` of the process writing a training run; the start time tells a reused pid apart.
PROCESS_TAG = "cxrlt.process"
#: The command that continues the run, shown when it stops and when it is found abandoned.
RESUME_TAG = "cxrlt.resume_command"


class Interrupted(BaseException):
    """The command received ``signum``; ``run_id`` is the run marked KILLED on the way out, if any."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum
        self.run_id: str | None = None
        self.resume_command: str | None = None

    @property
    def exit_status(self) -> int:
        return 128 + self.signum

    def message(self, command: str) -> str:
        line = f"{command}: stopped by {signal.Signals(self.signum).name}"
        if self.run_id:
            line += f"; run {self.run_id} is marked KILLED"
        if self.resume_command:
            line += f"; continue it with: {self.resume_command}"
        return line


#: The process whose signals raise :class:`Interrupted`; a forked child (a data-loading worker) inherits the handler.
_owner: int | None = None


def _raise_interrupted(signum: int, frame) -> None:
    if os.getpid() != _owner:  # a forked worker: behave as without the handler (its parent reports the stop)
        if signum == signal.SIGINT:
            raise KeyboardInterrupt
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
        return
    raise Interrupted(signum)


def stop_on_signals() -> None:
    """Make SIGTERM and SIGINT raise :class:`Interrupted` (main thread only: Python runs handlers there)."""
    global _owner
    if threading.current_thread() is threading.main_thread():
        _owner = os.getpid()
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, _raise_interrupted)


def this_process() -> str:
    """:data:`PROCESS_TAG`'s value for the running process."""
    return f"{socket.gethostname()}:{os.getpid()}:{psutil.Process().create_time():.0f}"


def process_gone(tag: str | None) -> bool:
    """Whether the process a run's :data:`PROCESS_TAG` names ran on this host and no longer exists.

    A run of another host (or without the tag) is never judged: its process cannot be seen from here.
    """
    host, _, rest = (tag or "").partition(":")
    pid, _, started = rest.partition(":")
    if host != socket.gethostname() or not pid.isdigit():
        return False
    try:
        return f"{psutil.Process(int(pid)).create_time():.0f}" != started
    except psutil.NoSuchProcess:
        return True


def warn_abandoned(client, experiment_name: str, resuming: str | None = None) -> list[str]:
    """Name (and return) the runs of the experiment left RUNNING by a process that died on this host (SIGKILL, the
    OOM killer), with the command that continues each, so they are not mistaken for live ones; ``resuming`` is the
    run being continued right now."""
    experiment = client.get_experiment_by_name(experiment_name)
    if experiment is None:
        return []
    runs = client.search_runs([experiment.experiment_id], "attributes.status = 'RUNNING'", max_results=1000)
    gone = [run for run in runs if run.info.run_id != resuming and process_gone(run.data.tags.get(PROCESS_TAG))]
    for run in gone:
        command = run.data.tags.get(RESUME_TAG, f"resume={run.info.run_id}")
        log.warning("run %s is RUNNING but its process on this machine is gone (killed?); continue it with: %s",
                    run.info.run_id, command)  # fmt: skip
    return [run.info.run_id for run in gone]
