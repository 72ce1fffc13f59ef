"""Wall time of the commands that only list or refuse, against a bare ``python -c pass`` (issue 30, 6).

Each command is typed as the user types it (``make -s <target> ...``, so the Makefile's own checks count too) on
an empty MLflow store in a temp folder (created before the timing); rounds alternate the commands so machine noise hits them alike.
Prints a table: exit status, median seconds, and seconds above the baseline. Two floors are measured beside
them: starting Python (``python -c pass``) and asking an empty MLflow store one question (what a command that
must look a run up cannot go below). Import-level behaviour (no torch, no Lightning before the answer) is
asserted by ``tests/unit/test_cli_imports.py``; the timing is only measured here.

Run: ``make bench`` (or ``python tests/bench/bench_cli.py --rounds 3``).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

FLOORS = {
    "python -c pass": [sys.executable, "-c", "pass"],
    "one MLflow store query": [
        sys.executable,
        "-c",
        "from training.tracking.uri import tracking_client; tracking_client().search_experiments()",
    ],  # fmt: skip
}
COMMANDS = [
    "make benchmark",
    "make benchmark NAME=pneumonai MODEL=x DATA_ROOT=.",
    "make benchmark NAME=pneumonia DATA_ROOT=.",
    "make evaluate",
    "make evaluate RUN=nonexistent",
    "make register TASK=task1 ARGS=--bogus",
    "make register TASK=task1 RUN=nonexistent",
    "make submit THRESHOLDS=bogus",
    "make submit TEMPLATE=/nonexistent.csv MODEL=nonexistent",
    "make card",
    "make card MODEL=nonexistent",
    "make score",
    "make ensemble MODELS=x WEIGHTS=bogus",
    "make dicom-balance",
    "make train ARGS=trainer.max_epoch=3",
]


def timed(command: list[str], env: dict) -> tuple[int, float]:
    started = time.perf_counter()
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, timeout=600)
    return done.returncode, time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    named = {**FLOORS, **{text: ["make", "-s", *text.split()[1:]] for text in COMMANDS}}
    times: dict[str, list[float]] = {name: [] for name in named}
    codes: dict[str, int] = {}
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{tmp}/mlflow.db", "PYTHONPATH": str(ROOT)}
        timed(FLOORS["one MLflow store query"], env)  # creates the empty store, untimed: every command finds it
        for _ in range(args.rounds):
            for name, command in named.items():
                codes[name], seconds = timed(command, env)
                times[name].append(seconds)
    base = statistics.median(times["python -c pass"])
    width = max(len(name) for name in named)
    print(f"{'command':<{width}}  exit  median s  above python -c pass   ({args.rounds} rounds)")
    for name in named:
        median = statistics.median(times[name])
        print(f"{name:<{width}}  {codes[name]:>4}  {median:8.2f}  {median - base:+8.2f}")


if __name__ == "__main__":
    main()
