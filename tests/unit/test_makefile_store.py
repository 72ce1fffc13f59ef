"""Every Makefile target that talks to MLflow reads the store the code resolves (issue: `make serve` once looked
for the champion in MLflow's own default store, a stray ./mlflow.db)."""

from __future__ import annotations

import os
import re
import subprocess

import pytest

from tests.conftest import PROJECT_ROOT


def _shell_line(target: str, *variables: str, marker: str = "mlflow ") -> str:
    """The recipe line ``make -n`` prints for ``target`` (setup is up to date or skipped with -o)."""
    done = subprocess.run(["make", "--no-print-directory", "-n", "-o", "setup", "-o", ".venv/.installed", target,
                           *variables], cwd=PROJECT_ROOT, capture_output=True, text=True, check=True)  # fmt: skip
    (line,) = [line for line in done.stdout.splitlines() if marker in line]
    return line


@pytest.mark.parametrize("configured", [None, "sqlite:////tmp/team/mlflow.db"])
def test_ui_uses_the_resolved_store(configured):
    line = _shell_line("ui")
    assert "training.tracking.uri" in line  # the same function the code uses decides
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    if configured:
        env["MLFLOW_TRACKING_URI"] = configured
    # Run the line's store expression as the target would and read back the store it hands MLflow.
    probe = "echo " + line.split("--backend-store-uri", 1)[1].split("--host")[0].strip()
    out = subprocess.run(["bash", "-c", probe], cwd=PROJECT_ROOT, env=env, capture_output=True, text=True)
    assert out.stdout.strip() == (configured or "sqlite:///mlruns/mlflow.db")


@pytest.mark.parametrize("configured", [None, "sqlite:////tmp/team/mlflow.db"])
def test_serve_hands_mlflow_the_resolved_store(configured, monkeypatch):
    """``make serve`` runs apps.serve, which checks the model, reads it from the store
    :func:`training.tracking.uri.resolve_tracking_uri` resolves in its environment and serves it on the port."""
    import mlflow
    import uvicorn

    from apps import serve

    line = _shell_line("serve", "TASK=task1", "PORT=5001", marker="apps.serve")
    assert re.search(r"-m apps\.serve --model 'models:/cxrlt-task1@champion' --port 5001 *$", line), line
    if configured:
        monkeypatch.setenv("MLFLOW_TRACKING_URI", configured)
    else:
        monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    checked, read, started = [], [], []
    monkeypatch.setattr(serve, "check_model", lambda model, uri: checked.append((model, uri)))
    monkeypatch.setattr(
        serve, "served_pyfunc", lambda model, folder, root: read.append((model, mlflow.get_tracking_uri(), root))
    )
    monkeypatch.setattr("mlflow.pyfunc.scoring_server.init", lambda model: "app")
    monkeypatch.setattr(uvicorn, "run", lambda app, host, port, **options: started.append((app.app, host, port)))
    serve.main(["--model", "models:/cxrlt-task1@champion", "--port", "5001"])
    uri = configured or "sqlite:///mlruns/mlflow.db"
    assert checked == [("models:/cxrlt-task1@champion", uri)] and read == [(*checked[0], None)]  # no image root
    assert started == [("app", "127.0.0.1", 5001)]
