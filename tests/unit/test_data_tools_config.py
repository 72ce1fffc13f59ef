"""`make data-check ARGS="+task=<name>"` composes for every task, zero-shot ones included.

A zero-shot task overrides the adapter group (configs/task/task2.yaml); the data tools' root config must hold
that group for the override to compose, or data-check fails in Hydra before reading any data.
"""

from __future__ import annotations

import pytest
import yaml
from hydra import compose, initialize_config_dir

from training.config_files import CONFIGS, option_names


@pytest.mark.parametrize("task", option_names("task"))
def test_data_tools_compose_with_every_task(task):
    with initialize_config_dir(str(CONFIGS), version_base="1.3"):
        cfg = compose("data_tools", overrides=[f"+task={task}"])
    own = yaml.safe_load((CONFIGS / "task" / f"{task}.yaml").read_text())
    assert cfg.task.name == own["name"]
    assert list(cfg.task.get("unseen") or []) == list(own.get("unseen") or [])
