"""docs/architecture.md's table of config groups names every choice a user can select in the groups it lists whole."""

from __future__ import annotations

import re

import pytest

from tests.conftest import PROJECT_ROOT

#: Groups whose row lists every choice; the others (model, data, experiment, ...) give examples.
LISTED_WHOLE = ("head", "aux_loss", "loss", "sampler", "augment", "adapter", "stage", "two_phase", "ema",
                "early_stopping", "calibration", "mixup", "postprocess", "trainer", "gpu", "evaluation", "tta", "debug",
                "ensemble", "benchmark")  # fmt: skip
#: Folders of configs/ that are not selected as a group: Hydra's own settings, the adapters' prompt banks.
NOT_GROUPS = {"hydra", "text"}


def rows() -> dict[str, str]:
    text = (PROJECT_ROOT / "docs" / "architecture.md").read_text()
    return dict(re.findall(r"^\| `([a-z_/]+)` \| (.+) \|$", text, flags=re.MULTILINE))


@pytest.mark.parametrize("group", LISTED_WHOLE)
def test_every_choice_of_the_group_is_named_in_its_row(group):
    choices = {path.stem for path in (PROJECT_ROOT / "configs" / group).glob("*.yaml")}
    named = set(re.findall(r"`([a-z0-9_-]+)`", rows()[group]))
    assert choices - named == set()


def test_every_config_group_has_a_row():
    groups = {path.name for path in (PROJECT_ROOT / "configs").iterdir() if path.is_dir()} - NOT_GROUPS
    assert groups - set(rows()) == set()
