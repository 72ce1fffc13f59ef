"""Commands that only list or refuse answer before the heavy stack loads (issue 30, 6).

A listing or a refused argument must not wait for torch and Lightning (several seconds each, more on a busy
machine): each command below runs as the user starts it, and afterwards the modules it imported are checked. The
wall times themselves are measured by ``tests/bench/bench_cli.py`` (``make bench``), not asserted here.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import PROJECT_ROOT

#: ``python -m <module> <args>``, then which of the heavy packages it imported and its exit status, as JSON (SciPy
#: and pandas come with MLflow; without it, a listing has no reason to load them).
PROBE = """
import json, runpy, sys
module, sys.argv = sys.argv[1], sys.argv[1:]
code = 0
try:
    runpy.run_module(module, run_name="__main__", alter_sys=True)
except SystemExit as exit:
    code = exit.code
print(json.dumps({"code": code, "heavy": sorted(m for m in ("torch", "lightning", "mlflow", "scipy", "pandas") if m in sys.modules)}))
"""


#: (command, its exit status, the heavy packages it may import)
COMMANDS = [
    (["apps.benchmarks.cli"], 0, []),  # make benchmark: the list of protocols
    (["apps.benchmarks.cli", "--name", "pneumonai", "--model", "x", "--data-root", "."], 2, []),  # unknown name
    (["apps.benchmarks.cli", "--name", "pneumonia", "--data-root", "."], 2, []),  # no MODEL
    (["apps.evaluate"], 1, []),  # run=??? (the Makefile asks for RUN first; python -m does not)
    (["apps.evaluate", "run=nonexistent"], 1, []),  # no store: refused without MLflow, and none created
    (["apps.ensemble_cli", "--model", "a", "--model", "b", "--weighting", "bogus"], 1, []),  # unknown weighting
    (["apps.ensemble_cli", "--model", "a"], 1, []),  # one member
    (["apps.ensemble_cli", "--model", "a", "--model", "b"], 1, []),  # no store: refused, and none created
    (["apps.registry", "--task", "task1"], 1, ["mlflow", "pandas", "scipy"]),  # no store: refused, and none created
    (["apps.pseudo_label", "--model", "x", "--manifest", "nope.csv", "--out", "o.csv"], 1, ["pandas", "scipy"]),
]


@pytest.mark.parametrize(("command", "code", "allowed"), COMMANDS, ids=[" ".join(c[0]) for c in COMMANDS])
def test_a_command_that_lists_or_refuses_imports_no_torch_nor_lightning(command, code, allowed, tmp_path):
    assert _probe(command, tmp_path) == {"code": code, "heavy": allowed}
    assert not (tmp_path / "mlflow.db").exists()  # nothing left behind


def test_an_unknown_run_is_refused_after_asking_the_store_but_before_the_model_stack(tmp_path):
    store = f"sqlite:///{tmp_path}/mlflow.db"
    subprocess.run([sys.executable, "-c", f"from mlflow import MlflowClient; MlflowClient({store!r}).search_experiments()"],
                   cwd=PROJECT_ROOT, check=True, capture_output=True, timeout=300)  # fmt: skip
    assert _probe(["apps.evaluate", "run=nonexistent"], tmp_path) == {"code": 1, "heavy": ["mlflow", "pandas", "scipy"]}


def _probe(command: list[str], tmp_path) -> dict:
    env = {"MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path}/mlflow.db", "PATH": "/usr/bin:/bin"}
    done = subprocess.run([sys.executable, "-c", PROBE, *command], cwd=PROJECT_ROOT, env=env, capture_output=True,
                          text=True, timeout=300)  # fmt: skip
    assert done.stdout.strip(), done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])
