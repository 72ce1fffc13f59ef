"""The guide to the MLflow compare page (docs/evaluation.md) tells how to find `test/mAP` by the rows sorted before
it, not by a row count, which goes stale as metrics are added."""

from __future__ import annotations

import re

from evaluation.metric_registry import SUITE
from tests.conftest import PROJECT_ROOT
from training.data.findings import TASK1_LABELS

GUIDE = (PROJECT_ROOT / "docs" / "evaluation.md").read_text().split("### Comparing runs in the MLflow UI")[1]
GUIDE = GUIDE.split("\n## ")[0].split("\n### ")[0]


def test_the_guide_counts_no_rows():
    assert not re.search(r"row \d+ of \d+", GUIDE), re.search(r"row \d+ of \d+", GUIDE)


def test_test_map_sorts_below_every_row_the_guide_names():
    """MLflow's table sorts keys alphabetically; whatever the case rule, the rows named come first."""
    (named,) = re.findall(r"`test/mAP` sits after .*?the\s+per-class `test/([a-z0-9_|]+)/\.\.\.`", GUIDE, re.DOTALL)
    keys = named.split("|")
    assert set(keys) <= {metric.key for metric in SUITE.per_class(val_thresholds=True)}
    for key in keys:
        for label in TASK1_LABELS:
            for sort_key in (str, str.casefold):
                assert sort_key(f"test/{key}/{label}") < sort_key("test/mAP"), (key, label)
