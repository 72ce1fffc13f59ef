"""README's guide to the MLflow compare page tells how to find `test/mAP` without a row count that goes stale
(issue 30, 9: "row 271 of 736" had become row 416 of 887 as metrics were added)."""

from __future__ import annotations

import re

from evaluation.metric_registry import SUITE
from tests.conftest import PROJECT_ROOT
from training.data.findings import TASK1_LABELS

GUIDE = (PROJECT_ROOT / "README.md").read_text().split("## Comparing runs in the MLflow UI")[1].split("\n## ")[0]


def test_the_guide_counts_no_rows():
    assert not re.search(r"row \d+ of \d+", GUIDE), re.search(r"row \d+ of \d+", GUIDE)


def test_test_map_sorts_below_every_row_the_guide_names():
    """MLflow's table sorts keys alphabetically; whatever the case rule, the rows named come first."""
    (sentence,) = re.findall(r"`test/mAP` sits below every `test/([a-z_]+)/<class>` row", GUIDE)
    assert sentence in {metric.key for metric in SUITE.per_class(val_thresholds=True)}
    for label in TASK1_LABELS:
        for sort_key in (str, str.casefold):
            assert sort_key(f"test/{sentence}/{label}") < sort_key("test/mAP"), label
