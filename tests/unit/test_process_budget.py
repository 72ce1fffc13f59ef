"""The work-tied limits of tests/process_budget.py: a hung process and a runaway one are stopped, a working one is not."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.process_budget import WorkBudget, wait_working


def test_a_process_that_uses_no_cpu_is_stopped_as_hung_and_its_tree_killed():
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    budget = WorkBudget(sleeper, cpu_seconds=100, stall_seconds=1.0)
    with pytest.raises(AssertionError, match=r"sleeper: no CPU used for 1 s \(hung\)"):
        while True:
            budget.check("sleeper")
    sleeper.kill()
    sleeper.wait()


def test_a_process_past_its_cpu_budget_is_stopped_and_one_within_it_finishes():
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    with pytest.raises(AssertionError, match=r"spinner: used \d+ CPU s, more than 0"):
        wait_working(spinner, "spinner", cpu_seconds=0.5)
    assert spinner.poll() is not None  # killed on the way out
    quick = subprocess.Popen([sys.executable, "-c", "sum(range(10**6))"])
    wait_working(quick, "quick", cpu_seconds=30)
    assert quick.returncode == 0
