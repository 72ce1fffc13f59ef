"""`make tune` starts as the other Hydra commands do (training.errors.run_hydra_entry): a misspelt override is refused
in one line before anything runs, word for word as `make train` refuses it, and a secret on its command line never
reaches the terminal."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.conftest import PROJECT_ROOT

pytestmark = pytest.mark.e2e  # the real command lines, in subprocesses


def run(module: str, *overrides: str, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", module, "task=task1", *overrides], env=env, cwd=PROJECT_ROOT,
                          capture_output=True, text=True, timeout=180)  # fmt: skip


def test_a_misspelt_override_gets_the_refusal_make_train_gives(run_env, tmp_path):
    tune = run("training.tune", "trainer.max_epoch=2", f"tune.storage=sqlite:///{tmp_path}/optuna.db", env=run_env)
    train = run("training.train", "trainer.max_epoch=2", env=run_env)
    assert tune.returncode == train.returncode == 1, tune.stderr[-3000:]
    assert "trainer.max_epoch=2: no setting 'trainer.max_epoch'; did you mean 'trainer.max_epochs'?" in tune.stderr
    assert tune.stderr == train.stderr and "Traceback" not in tune.stderr
    assert not (tmp_path / "optuna.db").exists()  # refused before the study's storage was opened


def test_a_secret_in_a_refused_tune_override_is_redacted(run_env):
    secret = "Tune-pw-5d1e77"
    done = run("training.tune", f"tune.storag=postgresql://optuna:{secret}@db/optuna", env=run_env)
    output = done.stdout + done.stderr
    assert done.returncode == 1
    assert "tune.storag=postgresql://optuna:***@db/optuna: no setting 'tune.storag'; did you mean 'tune.storage'?" in (
        done.stderr
    ), output[-3000:]
    assert secret not in output
