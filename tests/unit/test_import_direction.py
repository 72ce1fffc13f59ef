"""The import rules of docs/architecture.md hold for the project, and the checker catches each kind of breach."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.import_rules import cycles, import_graph, layer_violations

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def graph():
    return import_graph(ROOT)


def test_the_project_keeps_its_layers(graph):
    assert layer_violations(graph) == []


def test_the_project_has_no_import_cycle(graph):
    assert cycles(graph) == []


def test_the_graph_sees_function_level_and_from_imports(graph):
    # training.data.images imports the DICOM reader inside a function; evaluation.cli imports from training.
    assert "training.data.dicom" in graph["training.data.images"]
    assert "training.runs" in graph["evaluation.cli"]


def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    for name in ("training/__init__.py", "evaluation/__init__.py", "evaluation/benchmarks/__init__.py"):
        files.setdefault(name, "")
    for name, text in files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return tmp_path


def test_core_importing_training_is_reported(tmp_path):
    root = _tree(tmp_path, {"training/pipeline.py": "", "evaluation/suite.py": "from training import pipeline\n"})
    assert layer_violations(import_graph(root)) == [
        "evaluation.suite -> training.pipeline: evaluation's core imports nothing from training/"
    ]


def test_training_importing_an_application_is_reported(tmp_path):
    root = _tree(tmp_path, {
        "evaluation/serving.py": "", "evaluation/benchmarks/runner.py": "",
        "training/stages.py": "def f():\n    import evaluation.benchmarks.runner\n    from evaluation.serving import x\n",
    })  # fmt: skip
    assert layer_violations(import_graph(root)) == [
        "training.stages -> evaluation.benchmarks.runner: training/ never imports an evaluation application",
        "training.stages -> evaluation.serving: training/ never imports an evaluation application",
    ]


def test_applications_may_use_training_and_training_may_use_the_core(tmp_path):
    root = _tree(tmp_path, {
        "evaluation/suite.py": "", "evaluation/cli.py": "from training.pipeline import run\n",
        "training/pipeline.py": "from evaluation.suite import compute\nfrom . import data\n", "training/data.py": "",
    })  # fmt: skip
    graph = import_graph(root)
    assert graph["training.pipeline"] == {"evaluation.suite", "training.data"}  # relative import resolved
    assert layer_violations(graph) == [] and cycles(graph) == []


def test_a_cycle_through_a_lazy_import_is_reported(tmp_path):
    root = _tree(tmp_path, {
        "training/a.py": "from training.b import x\n", "training/b.py": "def f():\n    from training import c\n",
        "training/c.py": "import training.a\n", "training/d.py": "import training.a\n",
    })  # fmt: skip
    assert cycles(import_graph(root)) == [["training.a", "training.b", "training.c"]]
