"""The per-class table and the `evaluation.per_class_metrics` switch: what a run logs, and what MLflow's UI is
given to show it (evaluation/tables.py)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from omegaconf import OmegaConf

from evaluation.evaluate import Evaluation, MetricSet, store
from evaluation.metric_registry import SUITE
from evaluation.suite import compute_suite
from evaluation.tables import (
    LOGGED_TABLES_TAG,
    PER_CLASS_TABLE,
    SAVED_VIEW_PREFIX,
    headline_view_tag,
    per_class_metric_names,
    per_class_table,
)

LABELS = ["Cardiomegaly", "Hernia", "Pleural Effusion", "Nodule"]
ROOT = Path(__file__).resolve().parents[2]


def _evaluation(per_class_metrics: bool = True) -> Evaluation:
    """A small test set with a class (Nodule) that has no positive, so its AP is undefined, plus a TTA set."""
    rng = np.random.default_rng(3)
    n = 80
    targets = np.zeros((n, 4), int)
    targets[rng.choice(n, 25, replace=False), 0] = 1
    targets[rng.choice(n, 4, replace=False), 1] = 1
    targets[rng.choice(n, 12, replace=False), 2] = 1
    probs = np.clip(targets * 0.35 + rng.random((n, 4)) * 0.65, 0, 1)
    groups = {"common": [0, 2], "rare": [1, 3]}
    sets = {}
    for prefix, p in (("test", probs), ("test_tta", np.clip(probs * 0.9 + 0.05, 0, 1))):
        result = compute_suite(targets, p, LABELS, n_boot=50, seed=1, class_groups=groups,
                               val_thresholds=np.full(4, 0.4))  # fmt: skip
        metrics = {f"{prefix}/{k}": v for k, v in result.metrics.items() if np.isfinite(v)}
        if prefix != "test":  # evaluate() logs only the macros and groups of the other sets
            metrics = {k: v for k, v in metrics.items() if k.split("/")[1] not in result.per_class}
        sets[prefix] = MetricSet(prefix, p, result, metrics)
    frame = pd.DataFrame(probs, columns=LABELS).assign(**{f"true/{c}": targets[:, i] for i, c in enumerate(LABELS)})
    metrics = {k: v for s in sets.values() for k, v in s.metrics.items()}
    return Evaluation(sets, metrics, {"test": frame}, LABELS, groups, np.array([0.3, 0.004, 0.15, 0.0005]), {},
                      per_class_metrics)  # fmt: skip


def _store(evaluation: Evaluation, tmp_path: Path, with_tags: bool = True):
    """Run ``store`` and return what reached the run: metrics, artifact files by logged path, tags."""
    logged: dict[str, float] = {}
    artifacts: dict[str, bytes] = {}
    tags: dict[str, str] = {}

    def log_artifacts(folder: Path, artifact_path: str) -> None:
        for path in folder.rglob("*"):
            if path.is_file():
                artifacts[f"{artifact_path}/{path.relative_to(folder).as_posix()}"] = path.read_bytes()

    store(evaluation, logged.update, log_artifacts, tmp_path, make_plots=False,
          set_tags=tags.update if with_tags else None)  # fmt: skip
    return logged, artifacts, tags


def test_switched_off_the_run_keeps_macros_groups_and_the_table_but_no_per_class_metric(tmp_path):
    evaluation = _evaluation(per_class_metrics=False)
    logged, artifacts, _ = _store(evaluation, tmp_path)
    assert not [key for key in logged if any(key.endswith(f"/{label}") for label in LABELS)]
    for key in ("test/mAP", "test/mAP_ci_low", "test/mAUROC", "test/group/rare/mAP", "test_tta/mAP"):
        assert logged[key] == evaluation.metrics[key], key
    assert len(logged) < len(evaluation.metrics)
    everything = json.loads(artifacts["evaluation/metrics.json"])
    assert everything["test/ap/Hernia"] == evaluation.metrics["test/ap/Hernia"]  # still on record, just not logged
    assert PER_CLASS_TABLE in artifacts
    assert "| Hernia |" in artifacts["evaluation/report.md"].decode()  # the report keeps its per-class section


def test_switched_on_every_per_class_value_is_logged_as_the_contract_says(tmp_path):
    evaluation = _evaluation(per_class_metrics=True)
    logged, _, _ = _store(evaluation, tmp_path)
    assert logged == evaluation.metrics
    assert {f"test/ap/{label}" for label in LABELS[:3]} <= set(logged)
    assert {f"test/f1_valthr/{label}" for label in LABELS[:3]} <= set(logged)


def test_per_class_names_are_exactly_the_class_level_keys():
    evaluation = _evaluation()
    names = per_class_metric_names(evaluation) & set(evaluation.metrics)
    assert names == {k for k in evaluation.metrics if k.rsplit("/", 1)[-1] in LABELS}
    assert not any("/group/" in k or k.split("/")[-1].startswith("m") for k in names)


def test_the_table_holds_the_logged_values_one_row_per_class_in_label_order(tmp_path):
    evaluation = _evaluation()
    _, artifacts, _ = _store(evaluation, tmp_path)
    payload = json.loads(artifacts[PER_CLASS_TABLE])
    table = pd.DataFrame(payload["data"], columns=payload["columns"])  # MLflow's table format, as the UI reads it
    assert list(table["class"]) == LABELS
    assert list(table.columns[:2]) == ["class", "test/ap"]  # the column the UI's cross-run view compares first
    assert list(table["group"]) == ["common", "rare", "common", "rare"]
    assert list(table["test_positives"]) == [25, 4, 12, 0]
    expected_keys = [m.key for m in SUITE.per_class(val_thresholds=True)]
    assert [c for c in table.columns if c.startswith("test/")] == [f"test/{k}" for k in expected_keys]
    assert "test_tta/ap" in table.columns and "test_tta/auroc" not in table.columns
    for row in table.itertuples(index=False):
        for key in ("ap", "auroc", "ece", "f1_valthr"):
            logged = evaluation.metrics.get(f"test/{key}/{row[0]}")
            cell = table.loc[table["class"] == row[0], f"test/{key}"].item()
            if logged is None:
                assert cell is None or np.isnan(cell)
            else:
                assert cell == pytest.approx(logged, abs=5e-5)  # rounded to 4 decimals for reading
    nodule = payload["data"][LABELS.index("Nodule")][payload["columns"].index("test/ap")]
    assert nodule is None  # no positive: undefined, written as null, never as a score of 0


def test_the_table_is_registered_for_the_ui_only_through_the_runs_tags(tmp_path):
    _, artifacts, tags = _store(_evaluation(), tmp_path)
    entries = json.loads(tags[LOGGED_TABLES_TAG])
    assert entries == [{"path": PER_CLASS_TABLE, "type": "table"}]
    assert all(entry["path"] in artifacts for entry in entries)  # the tag never points at a missing file
    _, _, untagged = _store(_evaluation(), tmp_path / "again", with_tags=False)
    assert untagged == {}


def test_per_class_table_handles_a_class_outside_every_group():
    evaluation = _evaluation()
    evaluation.groups = {"common": [0]}
    assert list(per_class_table(evaluation)["group"]) == ["common", "", "", ""]


def test_headline_view_shows_the_ranking_chain_sorted_by_the_selection_metric():
    ((key, value),) = headline_view_tag("val/mAP", now_ms=1_700_000_000_000).items()
    assert key.startswith(SAVED_VIEW_PREFIX) and key != SAVED_VIEW_PREFIX
    envelope = json.loads(value)
    assert envelope["name"] and envelope["createdAt"] == envelope["updatedAt"] == 1_700_000_000_000
    state = json.loads(envelope["state"])  # the UI parses the state string a second time
    assert state["orderByKey"] == "metrics.`val/mAP_best`" and state["orderByAsc"] is False
    chain = [f"metrics.`test/{m.name}`" for m in SUITE.tie_break_chain()]
    assert [c for c in state["selectedColumns"] if c in chain] == chain
    assert "metrics.`test/mAP`" in state["selectedColumns"]
    zero_shot = json.loads(json.loads(headline_view_tag("val/proxy_ood_mAP", "test_unseen")[key])["state"])
    assert "metrics.`test_unseen/mAP`" in zero_shot["selectedColumns"]
    assert zero_shot["orderByKey"] == "metrics.`val/proxy_ood_mAP_best`"


def test_the_default_config_keeps_per_class_metrics_and_documents_the_switch():
    config = OmegaConf.load(ROOT / "configs/evaluation/default.yaml")
    assert config.per_class_metrics is True
    assert Evaluation.__dataclass_fields__["per_class_metrics"].default is True  # older stored configs lack the key


def test_labels_with_readable_names_get_them_in_the_table_and_the_report(tmp_path):
    """A data source naming its labels (ROCOv2: CUI -> concept name) puts the name last in the table, after the
    columns the UI compares, and beside the label in the report; without names nothing changes."""
    evaluation = _evaluation()
    plain = per_class_table(evaluation)
    assert "name" not in plain.columns
    evaluation.label_titles = {"Hernia": "Hiatal hernia", "Nodule": "Lung nodule"}
    table = per_class_table(evaluation)
    assert list(table.columns) == [*plain.columns, "name"]
    assert table["name"].tolist() == ["", "Hiatal hernia", "", "Lung nodule"]
    _, artifacts, _ = _store(evaluation, tmp_path)
    report = artifacts["evaluation/report.md"].decode()
    assert "| Hernia (Hiatal hernia) |" in report and "| Cardiomegaly |" in report
