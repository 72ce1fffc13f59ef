"""Test servers are stopped with all their workers, even when a worker will not stop on SIGTERM."""

from __future__ import annotations

import subprocess
import sys
import time

import psutil
import pytest

from tests.conftest import stop_process_group

#: Like ``mlflow ui``: the leader forwards SIGTERM to its worker and waits for it; the worker, busy as on a loaded
#: machine, ignores SIGTERM; a helper runs in a session of its own, as MLflow's job processes do.
SERVER = r"""
import signal, subprocess, sys, time
sleeper = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print(flush=True); time.sleep(600)"
worker = subprocess.Popen([sys.executable, "-c", sleeper], stdout=subprocess.PIPE)
helper = subprocess.Popen([sys.executable, "-c", sleeper], stdout=subprocess.PIPE, start_new_session=True)
worker.stdout.readline(), helper.stdout.readline()
signal.signal(signal.SIGTERM, lambda *_: worker.send_signal(signal.SIGTERM))
print(worker.pid, helper.pid, flush=True)
worker.wait()
"""


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_a_server_whose_worker_ignores_sigterm_is_stopped_with_every_process_it_started():
    server = subprocess.Popen([sys.executable, "-c", SERVER], stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        worker, helper = map(int, server.stdout.readline().split())
        server.terminate()  # what the UI test used to do: SIGTERM to the leader, then wait
        with pytest.raises(subprocess.TimeoutExpired):
            server.wait(timeout=2)
        started = time.monotonic()
        stop_process_group(server, grace=1.0)
        assert time.monotonic() - started < 30  # SIGKILL after the grace period, not an endless wait
        assert server.returncode is not None
        assert not _alive(worker) and not _alive(helper)
        stop_process_group(server, grace=1.0)  # a second call (a finally after a failure) is harmless
    finally:
        if server.poll() is None:
            server.kill()


def test_a_process_outside_a_group_of_its_own_is_refused():
    # Without a session of its own the process has no group to stop: said at once, not half stopped in silence.
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        with pytest.raises(ValueError, match="start_new_session"):
            stop_process_group(process)
    finally:
        process.kill()
        process.wait()
