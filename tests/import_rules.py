"""The import rules of docs/architecture.md, checked on the source text (nothing is imported to check them).

Layers: ``evaluation``'s core (metrics, their registry, bootstrap, groups, calibration, the suite, the test phase
and its reports) is a library of numbers and must not depend on how models are trained; ``training`` may use
that core but never the evaluation *applications* (the command-line entry points, serving, submission,
registry, benchmarks), which sit on top of both. And no two modules may import each other, directly or round a
longer loop: a cycle makes import order matter and hides which module owns what.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable
from pathlib import Path

PACKAGES = ("training", "evaluation")
#: Evaluation modules that are applications: entry points and what only they use. Everything else in
#: ``evaluation`` except :data:`TEST_TIME_BRIDGES` is core.
EVALUATION_APPLICATIONS = (
    "evaluation.cli",
    "evaluation.compare",
    "evaluation.pyfunc_model",
    "evaluation.registry",
    "evaluation.score",
    "evaluation.serving",
    "evaluation.submission",
    "evaluation.submit",
    "evaluation.ensemble_cli",
    "evaluation.benchmarks",
)
#: Core-side modules allowed to read one training contract: TTA normalises images exactly as training does.
TEST_TIME_BRIDGES = ("evaluation.tta",)


def module_name(root: Path, path: Path) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def within(module: str, prefixes: Iterable[str]) -> bool:
    return any(module == prefix or module.startswith(prefix + ".") for prefix in prefixes)


def imports_of(path: Path, name: str, known: set[str]) -> set[str]:
    """Project modules ``path`` imports anywhere in its body (function-level imports included)."""
    tree = ast.parse(path.read_text(), str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            # `from a.b import c` imports the module a.b.c when c is one, else a name of a.b.
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names]
        else:
            continue
        for target in targets:
            while target and target not in known:  # `import a.b.c` of a non-module name: its nearest module
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def import_graph(root: Path) -> dict[str, set[str]]:
    """``{module: project modules it imports}`` for every module of :data:`PACKAGES` under ``root``."""
    files = {module_name(root, path): path for package in PACKAGES for path in (root / package).rglob("*.py")}
    known = set(files)
    return {name: imports_of(path, name, known) for name, path in sorted(files.items())}


def layer_violations(graph: dict[str, set[str]]) -> list[str]:
    """Every import that crosses a layer the wrong way, as ``importer -> imported: rule``."""
    out = []
    for module, imported in graph.items():
        for target in sorted(imported):
            core = within(module, ["evaluation"]) and not within(module, EVALUATION_APPLICATIONS + TEST_TIME_BRIDGES)
            if core and within(target, ["training"]):
                out.append(f"{module} -> {target}: evaluation's core imports nothing from training/")
            if within(module, ["training"]) and within(target, EVALUATION_APPLICATIONS):
                out.append(f"{module} -> {target}: training/ never imports an evaluation application")
    return out


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected groups of more than one module (Tarjan), each sorted; a package importing its own
    submodules is not a cycle, since a submodule's implicit import of its package is not counted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in graph.get(node, ()):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for node in graph:
        if node not in index:
            visit(node)
    return sorted(found)
