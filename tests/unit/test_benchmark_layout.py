"""A benchmark protocol is found where its config's name says: ``configs/benchmark/<name>.yaml`` names a class of
``apps.benchmarks.<name>`` (``-`` as ``_``), a module or a folder, and nothing else in the framework knows it."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tests.import_rules import import_graph, protocol_of

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = sorted((ROOT / "configs" / "benchmark").glob("*.yaml"))


@pytest.mark.parametrize("config", CONFIGS, ids=lambda p: p.stem)
def test_a_protocol_lives_in_the_module_or_folder_named_after_its_config(config):
    target = yaml.safe_load(config.read_text())["_target_"]
    module, _, _ = target.rpartition(".")
    name = config.stem.replace("-", "_")
    assert module == f"apps.benchmarks.{name}"
    assert (ROOT / "apps" / "benchmarks" / f"{name}.py").is_file() or (
        ROOT / "apps" / "benchmarks" / name / "__init__.py"
    ).is_file()


def test_every_protocol_module_or_folder_has_its_config():
    graph = import_graph(ROOT)
    protocols = {protocol_of(module) for module in graph} - {None}
    assert protocols == {config.stem.replace("-", "_") for config in CONFIGS}
