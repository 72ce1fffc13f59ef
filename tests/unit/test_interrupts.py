"""Signals end a command with 128 + signal and one line; a run whose process died is told apart from a live one."""

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import psutil
from mlflow import MlflowClient

from training.interrupts import PROCESS_TAG, RESUME_TAG, process_gone, this_process, warn_abandoned

REPO = Path(__file__).resolve().parents[2]


def test_a_signal_inside_an_entry_point_ends_it_with_128_plus_the_signal_and_one_line():
    code = ("import os, signal, time\nfrom training.errors import stopped_by_signals\n"
            "with stopped_by_signals():\n    os.kill(os.getpid(), signal.SIGTERM)\n    time.sleep(30)\n")  # fmt: skip
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 128 + signal.SIGTERM
    assert done.stderr.strip().splitlines() == ["-c: stopped by SIGTERM"]


def test_a_forked_child_that_inherited_the_handler_dies_of_the_signal_as_without_it():
    """Data-loading workers are forked after the handler is set: SIGTERM ends such a child as it would have, and only
    the process that set the handler reports the stop."""
    code = ("import os, signal, sys\nfrom training.interrupts import stop_on_signals\nstop_on_signals()\n"
            "child = os.fork()\nif child == 0:\n    os.kill(os.getpid(), signal.SIGTERM)\n    os._exit(0)\n"
            "_, status = os.waitpid(child, 0)\nprint(os.WIFSIGNALED(status) and os.WTERMSIG(status))\n")  # fmt: skip
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.stdout.strip() == str(int(signal.SIGTERM)), done.stderr


def _finished_process_tag() -> str:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.5)"])
    started = psutil.Process(child.pid).create_time()
    child.wait()
    return f"{socket.gethostname()}:{child.pid}:{started:.0f}"


def test_a_process_is_gone_only_when_it_ran_here_and_no_longer_exists():
    assert not process_gone(this_process())
    assert process_gone(_finished_process_tag())
    assert process_gone(f"{socket.gethostname()}:{os.getpid()}:12345")  # a reused pid: another start time
    assert not process_gone(f"another-host:{os.getpid() + 10**6}:0")  # cannot be seen from here
    assert not process_gone(None)


def test_only_running_runs_of_dead_processes_on_this_host_are_named_with_their_resume_command(tmp_path, caplog):
    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    experiment = client.create_experiment("task1", artifact_location=(tmp_path / "artifacts").as_uri())
    dead = _finished_process_tag()
    runs = {name: client.create_run(experiment, tags={PROCESS_TAG: tag, RESUME_TAG: f"make train resume={name}"})
            for name, tag in [("dead", dead), ("alive", this_process()), ("elsewhere", "other:1:0"),
                              ("finished", dead), ("resuming", dead)]}  # fmt: skip
    client.set_terminated(runs["finished"].info.run_id, "FINISHED")
    named = warn_abandoned(client, "task1", resuming=runs["resuming"].info.run_id)
    assert named == [runs["dead"].info.run_id]
    assert "continue it with: make train resume=dead" in caplog.text
    assert warn_abandoned(client, "no such experiment") == []
