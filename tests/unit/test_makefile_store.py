"""Every Makefile target that talks to MLflow reads the store the code resolves (issue: `make serve` once looked
for the champion in MLflow's own default store, a stray ./mlflow.db)."""

from __future__ import annotations

import os
import re
import subprocess

import pytest

from tests.conftest import PROJECT_ROOT


def _shell_line(target: str, *variables: str) -> str:
    """The recipe line ``make -n`` prints for ``target`` (setup is up to date or skipped with -o)."""
    done = subprocess.run(["make", "--no-print-directory", "-n", "-o", "setup", "-o", ".venv/.installed", target,
                           *variables], cwd=PROJECT_ROOT, capture_output=True, text=True, check=True)  # fmt: skip
    (line,) = [line for line in done.stdout.splitlines() if "mlflow " in line]
    return line


@pytest.mark.parametrize(("target", "variables"), [("serve", ("TASK=task1",)), ("ui", ())])
@pytest.mark.parametrize("configured", [None, "sqlite:////tmp/team/mlflow.db"])
def test_serve_and_ui_use_the_resolved_store(target, variables, configured):
    line = _shell_line(target, *variables)
    assert "training.tracking.uri" in line  # the same function the code uses decides
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    if configured:
        env["MLFLOW_TRACKING_URI"] = configured
    # Run the line's store expression as the target would and read back the store it hands MLflow.
    if target == "serve":  # the server resolves models:/ in the store of its environment
        (assignment,) = re.findall(r'MLFLOW_TRACKING_URI="[^"]*"', line)
        probe = f"{assignment} printenv MLFLOW_TRACKING_URI"
    else:  # the UI shows the store given as --backend-store-uri
        probe = "echo " + line.split("--backend-store-uri", 1)[1].split("--host")[0].strip()
    out = subprocess.run(["bash", "-c", probe], cwd=PROJECT_ROOT, env=env, capture_output=True, text=True)
    assert out.stdout.strip() == (configured or "sqlite:///mlruns/mlflow.db")
