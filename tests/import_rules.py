"""The import rules of docs/architecture.md, checked on the source text (nothing is imported to check them).

The top-level packages are layers, bottom up: ``evaluation`` (judging predictions: metrics and their registry,
bootstrap, groups, calibration, thresholds, perturbation and TTA transforms, the test phase and its reports),
``training`` (data, models, fitting, tracking, tuning) and ``apps`` (everything a ``make`` target runs after or
around training). A module imports only from its own layer and the ones below it, so the folder a file sits in
says what it may use; there is no list of exceptions. Inside ``apps.benchmarks`` the framework imports no protocol
and no protocol imports another. And no two modules may import each other, directly or round a longer loop: a
cycle makes import order matter and hides which module owns what.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable
from pathlib import Path

#: The layers, bottom up: a module may import its own layer and those before it in this tuple.
LAYERS = ("evaluation", "training", "apps")
BENCHMARKS = "apps.benchmarks"
FRAMEWORK = "apps.benchmarks.framework"


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
    """``{module: project modules it imports}`` for every module of :data:`LAYERS` under ``root``."""
    files = {module_name(root, path): path for package in LAYERS for path in (root / package).rglob("*.py")}
    known = set(files)
    return {name: imports_of(path, name, known) for name, path in sorted(files.items())}


def layer_of(module: str) -> int:
    return LAYERS.index(module.split(".")[0])


def layer_violations(graph: dict[str, set[str]]) -> list[str]:
    """Every import that points up the layers, as ``importer -> imported: rule``."""
    order = " < ".join(f"{name}/" for name in LAYERS)
    out = []
    for module, imported in graph.items():
        for target in sorted(imported):
            if layer_of(target) > layer_of(module):
                below, above = module.split(".")[0], target.split(".")[0]
                out.append(f"{module} -> {target}: {below}/ imports nothing from {above}/ (layers, bottom up: {order})")
    return out


def protocol_of(module: str) -> str | None:
    """The benchmark protocol a module belongs to (its module or folder under ``apps/benchmarks/``), if any.

    A protocol is named after its ``configs/benchmark/<name>.yaml`` stem; the entry points beside the protocols
    (``cli``, ``card``, ``card_cli``) and the framework are not protocols.
    """
    if not within(module, [BENCHMARKS]) or within(module, [FRAMEWORK]):
        return None
    child = module[len(BENCHMARKS) + 1 :].split(".")[0]
    return child if child and child not in BENCHMARK_ENTRY_POINTS else None


#: Modules of ``apps.benchmarks`` that run protocols found through their YAML files, never by import.
BENCHMARK_ENTRY_POINTS = ("cli", "card", "card_cli")


def benchmark_violations(graph: dict[str, set[str]]) -> list[str]:
    """Imports that tie the benchmark framework to a protocol, or one protocol to another."""
    out = []
    for module, imported in graph.items():
        for target in sorted(imported):
            theirs, ours = protocol_of(target), protocol_of(module)
            if theirs is None:
                continue
            if within(module, [FRAMEWORK]):
                out.append(f"{module} -> {target}: the benchmark framework imports no protocol")
            elif ours is not None and ours != theirs:
                out.append(f"{module} -> {target}: a benchmark protocol imports no other protocol")
            elif ours is None and within(module, [BENCHMARKS]):
                out.append(f"{module} -> {target}: benchmark entry points find protocols by their YAML, not by import")
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
