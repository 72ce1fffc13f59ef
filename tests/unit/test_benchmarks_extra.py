"""The benchmark-only packages are an optional extra (issue 44): the core commands never import them, and code that
needs one on an install without it says in one line how to install it."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tomllib

import pytest

from apps.benchmarks.framework.extra import INSTALL, MissingExtra
from apps.benchmarks.framework.protocol import BadInput
from tests.conftest import PROJECT_ROOT

#: Each distribution of pyproject's ``benchmarks`` extra -> the top-level module it installs.
MODULES = {
    "grad-cam": "pytorch_grad_cam",
    "ttach": "ttach",
    "rouge-score": "rouge_score",
    "bert-score": "bert_score",
    "nltk": "nltk",
    "absl-py": "absl",
    "defusedxml": "defusedxml",
    "pycocoevalcap": "pycocoevalcap",
    "pycocotools": "pycocotools",
}
#: torchvision's dataset modules import it whenever it is installed (an optional XML parser), benchmark or not.
IMPORTED_WHEN_PRESENT = {"defusedxml"}
#: What make train, tune, evaluate, submit, serve, compare, register, score and ensemble run, and the tests' conftest.
CORE = ["training.train", "training.tune", "apps.evaluate", "apps.submit_cli", "apps.serve", "apps.compare",
        "apps.registry", "apps.score", "apps.ensemble_cli", "tests.conftest"]  # fmt: skip


def test_the_modules_checked_are_the_extra_s_packages():
    project = tomllib.loads((PROJECT_ROOT / "pyproject.toml").read_text())["project"]
    extra = [re.split(r"[=<>\[;]", requirement)[0] for requirement in project["optional-dependencies"]["benchmarks"]]
    core = {re.split(r"[=<>\[;]", requirement)[0] for requirement in project["dependencies"]}
    assert sorted(extra) == sorted(MODULES)
    assert not core & set(MODULES)


def test_the_core_commands_import_no_benchmark_only_package():
    checked = sorted(set(MODULES.values()) - IMPORTED_WHEN_PRESENT)
    probe = (f"import importlib, json, sys\nfor m in {CORE!r}: importlib.import_module(m)\n"
             f"print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in {checked!r})))")  # fmt: skip
    done = subprocess.run([sys.executable, "-c", probe], cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == []


def test_a_missing_package_is_one_line_naming_the_install_command(monkeypatch):
    from apps.benchmarks.imageclef_captions.scoring import cider

    # What an install without the extra finds, also where an earlier test imported the package's submodules.
    for name in ["pycocoevalcap", *(m for m in sys.modules if m.startswith("pycocoevalcap."))]:
        monkeypatch.setitem(sys.modules, name, None)
    with pytest.raises(MissingExtra) as raised:
        cider(["a small effusion"], ["an effusion"])
    message = str(raised.value)
    assert message == f"pycocoevalcap is not installed: {INSTALL}"
    assert "\n" not in message and "make benchmarks-extra" in message and ".[benchmarks]" in message
    assert isinstance(raised.value, BadInput)  # what make benchmark and make card print as that line alone
