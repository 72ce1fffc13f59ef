"""One selection metric per task: the kept checkpoint, the tuning objective and the registry's ranking agree."""

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from apps.registry import FALLBACK_METRIC, selection_metric

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
TASKS = sorted(path.stem for path in (CONFIGS / "task").glob("*.yaml"))


@pytest.mark.parametrize("task", TASKS)
def test_checkpoint_tuning_and_registry_select_on_the_same_metric(task):
    with initialize_config_dir(str(CONFIGS), version_base="1.3"):
        cfg = compose("tune", overrides=[f"task={task}"])
    assert cfg.checkpoint.monitor == cfg.tune.metric == selection_metric(task) == cfg.task.selection_metric


def test_zero_shot_tasks_select_on_the_proxy_and_unknown_experiments_on_val_map():
    # A zero-shot submission is scored on classes never trained on: seen-class val/mAP is the wrong yardstick.
    assert selection_metric("task2") == selection_metric("nih14_zeroshot") == "val/proxy_ood_mAP"
    assert selection_metric("task1") == "val/mAP"
    assert selection_metric("my-own-experiment") == FALLBACK_METRIC == "val/mAP"


def test_an_explicit_monitor_still_wins():
    with initialize_config_dir(str(CONFIGS), version_base="1.3"):
        cfg = compose("train", overrides=["task=task2", "checkpoint.monitor=val/mAP"])
    assert cfg.checkpoint.monitor == "val/mAP"
