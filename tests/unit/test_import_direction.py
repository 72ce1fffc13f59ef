"""The import rules of docs/architecture.md hold for the project, and the checker catches each kind of breach."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.import_rules import benchmark_violations, cycles, import_graph, layer_violations

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def graph():
    return import_graph(ROOT)


def test_the_project_keeps_its_layers(graph):
    assert layer_violations(graph) == []


def test_the_benchmark_framework_and_protocols_stay_apart(graph):
    assert benchmark_violations(graph) == []


def test_the_project_has_no_import_cycle(graph):
    assert cycles(graph) == []


def test_the_graph_sees_function_level_and_from_imports(graph):
    # training.data.images imports the DICOM reader inside a function; apps.evaluate imports from training.
    assert "training.data.dicom" in graph["training.data.images"]
    assert "training.runs" in graph["apps.evaluate"]


def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    for name in ("training/__init__.py", "evaluation/__init__.py", "apps/benchmarks/__init__.py"):
        files.setdefault(name, "")
    for name, text in files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return tmp_path


def test_core_importing_training_is_reported(tmp_path):
    root = _tree(tmp_path, {"training/pipeline.py": "", "evaluation/suite.py": "from training import pipeline\n"})
    assert layer_violations(import_graph(root)) == [
        "evaluation.suite -> training.pipeline: evaluation/ imports nothing from training/ "
        "(layers, bottom up: evaluation/ < training/ < apps/)"
    ]


def test_training_importing_an_application_is_reported(tmp_path):
    root = _tree(tmp_path, {
        "apps/serving.py": "", "apps/benchmarks/framework/runner.py": "",
        "training/stages.py": "def f():\n    import apps.benchmarks.framework.runner\n    from apps.serving import x\n",
    })  # fmt: skip
    assert layer_violations(import_graph(root)) == [
        "training.stages -> apps.benchmarks.framework.runner: training/ imports nothing from apps/ "
        "(layers, bottom up: evaluation/ < training/ < apps/)",
        "training.stages -> apps.serving: training/ imports nothing from apps/ (layers, bottom up: evaluation/ < "
        "training/ < apps/)",
    ]


def test_applications_may_use_training_and_training_may_use_the_core(tmp_path):
    root = _tree(tmp_path, {
        "evaluation/suite.py": "", "apps/evaluate.py": "from training.pipeline import run\n",
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


def test_the_core_importing_an_application_is_reported(tmp_path):
    root = _tree(
        tmp_path, {"apps/registry.py": "", "evaluation/report.py": "def f():\n    from apps import registry\n"}
    )
    assert layer_violations(import_graph(root)) == [
        "evaluation.report -> apps.registry: evaluation/ imports nothing from apps/ "
        "(layers, bottom up: evaluation/ < training/ < apps/)"
    ]


def test_the_framework_importing_a_protocol_is_reported(tmp_path):
    root = _tree(tmp_path, {
        "apps/benchmarks/framework/__init__.py": "", "apps/benchmarks/reveal/__init__.py": "",
        "apps/benchmarks/reveal/agreement.py": "from apps.benchmarks.framework import runner\n",
        "apps/benchmarks/framework/runner.py": "import apps.benchmarks.reveal.agreement\n",
        "apps/benchmarks/pneumonia.py": "from apps.benchmarks.reveal import agreement\n",
        "apps/benchmarks/cli.py": "from apps.benchmarks.framework import runner\nimport apps.benchmarks.pneumonia\n",
    })  # fmt: skip
    graph = import_graph(root)
    assert benchmark_violations(graph) == [
        "apps.benchmarks.cli -> apps.benchmarks.pneumonia: benchmark entry points find protocols by their YAML, "
        "not by import",
        "apps.benchmarks.framework.runner -> apps.benchmarks.reveal.agreement: the benchmark framework imports no "
        "protocol",
        "apps.benchmarks.pneumonia -> apps.benchmarks.reveal.agreement: a benchmark protocol imports no other protocol",
    ]
    assert cycles(graph) == [["apps.benchmarks.framework.runner", "apps.benchmarks.reveal.agreement"]]
