"""A Task 2 run leads with the classes Task 2 is ranked on, its six unseen findings, wherever one set of figures
stands for the run (evaluation/headline.py): the terminal's first line, report.md's first table, the card's first
CXR-LT rows, `make register`'s tie-breaks and printout, `make compare`'s predictions and grid table. The seen-class
figures stay, titled as what they are. Every expectation is built here from the metrics, not read from the code."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
from mlflow import MlflowClient
from omegaconf import OmegaConf

from apps.benchmarks.card import DEFAULT_CARD, load_card, run_metric_rows
from apps.compare import columns, grid_table, task_headline
from apps.compare import main as compare_main
from apps.registry import Candidate, Ranking, rank
from evaluation.evaluate import MetricSet
from evaluation.headline import DEFAULT, SEEN_SETS, headline_of, logged_headline
from evaluation.metric_registry import UNSEEN_SETS
from evaluation.report import ranking_chain, summary_lines, write_report
from evaluation.suite import compute_suite
from training.config_files import CONFIGS

CHAIN = ["mAP", "mAUROC", "mF1", "mECE", "mPrecision", "mRecall"]  # docs/rules.md §2
TASK2 = task_headline("task2")


def _chain(prefix: str, base: float) -> dict[str, float]:
    """Distinct values per set and metric, so a line showing another set's figures cannot pass."""
    return {f"{prefix}/{name}": base + k / 100 for k, name in enumerate(CHAIN)}


def test_task2_declares_its_unseen_classes_as_headline_and_other_tasks_default_to_their_labels():
    assert TASK2.prefix == "test_unseen" and TASK2.sets == UNSEEN_SETS and TASK2.heldout == "heldout_unseen"
    assert TASK2.others == "seen classes (proxy, not ranked)"
    assert TASK2.tie_breaks()[0] == ("test_unseen/mAP", True) and ("test_unseen/mECE", False) in TASK2.tie_breaks()
    for task in ("task1", "nih14", "pneumonia", "rocov2_concepts"):
        assert task_headline(task) == DEFAULT and DEFAULT.sets == SEEN_SETS
    assert task_headline("no-such-task") == DEFAULT
    bad = OmegaConf.create({"name": "task9", "headline": {"prefix": "test_unseeen"}})
    with pytest.raises(ValueError, match=r"^task task9: headline.prefix='test_unseeen' names no metric set; known: "):
        headline_of(bad)
    logged = {"task.name": "task2", "task.headline.prefix": "test_unseen", "task.headline.title": "unseen classes",
              "task.headline.others": "seen classes (proxy, not ranked)"}  # fmt: skip
    assert logged_headline(logged) == TASK2 and logged_headline({"task.name": "task1"}) == DEFAULT


def test_the_terminal_leads_with_the_unseen_chain_and_titles_the_seen_figures():
    metrics = {**_chain("test", 0.30), **_chain("heldout", 0.50), "heldout/n_images": 200.0,
               "test/prevalence_baseline_mAP": 0.08, "test_tta/mAP": 0.31}  # fmt: skip
    unseen = {**_chain("test_unseen", 0.10), "test_unseen/prevalence_baseline_mAP": 0.02}
    lines = summary_lines(metrics, unseen, TASK2)
    assert lines[0] == ("unseen classes, test (ranking chain; lower mECE wins): mAP 0.100, mAUROC 0.110, mF1 0.120, "
                        "mECE 0.130, mPrecision 0.140, mRecall 0.150 (prevalence baseline mAP 0.020)")  # fmt: skip
    seen = [line for line in lines if line.startswith("seen classes (proxy, not ranked), ")]
    assert seen[0].startswith("seen classes (proxy, not ranked), test (ranking chain") and "mAP 0.300" in seen[0]
    titled = [line.removeprefix("seen classes (proxy, not ranked), ") for line in seen]
    assert any(line.startswith("mAP with TTA: 0.310") for line in titled)
    assert any(line.startswith("held-out subset (200 cases): mAP 0.500") for line in titled)
    assert not any(line.startswith("unseen classes: ") for line in lines)  # the first line already is that chain
    # A task ranked on its own labels reads as before: test first, the unseen chain (if any) titled as such.
    default = summary_lines(metrics, unseen)
    assert default[0].startswith("test (ranking chain") and "mAP 0.300" in default[0]
    assert "unseen classes: mAP 0.100, mAUROC 0.110, mF1 0.120, mECE 0.130, mPrecision 0.140, mRecall 0.150" in default


def _evaluation(headline) -> SimpleNamespace:
    labels = ["Cardiomegaly", "Nodule"]
    rng = np.random.default_rng(0)
    targets = (rng.random((60, 2)) < 0.3).astype(int)
    probs = np.clip(targets * 0.3 + rng.random(targets.shape) * 0.7, 0, 1)
    result = compute_suite(targets, probs, labels, n_boot=0)
    metrics = {f"test/{k}": v for k, v in result.metrics.items()}
    frame = pd.DataFrame(probs, columns=labels)
    unseen = SimpleNamespace(metrics={**_chain("test_unseen", 0.10), **_chain("heldout_unseen", 0.20),
                                      "test_unseen/ECE_pooled": 0.05, "test_unseen/prevalence_baseline_mAP": 0.02},
                             heldout=None, summary=lambda: "unseen summary")  # fmt: skip
    return SimpleNamespace(sets={"test": MetricSet("test", probs, result, metrics)}, metrics=metrics,
                           predictions={"test": frame}, labels=labels, groups={}, sources={},
                           train_prevalence=np.array([0.3, 0.1]), unseen=unseen, headline=headline)  # fmt: skip


def _first_table(report: str) -> tuple[str, list[list[str]]]:
    """The first markdown table after ``## Headline``: its header cells and its rows' cells."""
    section = report.split("## Headline", 1)[1]
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in section.splitlines() if line.startswith("|")]
    table = []
    for row in rows[2:]:
        if not row[0].isdigit() and row[0] != "-":
            break
        table.append(row)
    return rows[0], table[: len(CHAIN) + 1]


def test_the_reports_first_table_is_the_unseen_chain_and_the_seen_table_follows_under_its_title(tmp_path):
    evaluation = _evaluation(TASK2)
    report = write_report(evaluation, tmp_path / "report.md", []).read_text()
    header, rows = _first_table(report)
    assert header == ["rank", "metric", "test_unseen", "heldout_unseen"]
    assert [row[:4] for row in rows[: len(CHAIN)]] == [
        [str(k + 1), name, f"{0.10 + k / 100:.4f}", f"{0.20 + k / 100:.4f}"] for k, name in enumerate(CHAIN)]  # fmt: skip
    assert "## Headline: unseen classes" in report
    assert "Prevalence baseline (constant predictor) mAP of the unseen classes: 0.0200." in report
    seen = report.split("## Seen classes (proxy, not ranked)", 1)[1]
    assert report.index("## Seen classes (proxy, not ranked)") > report.index("| 1 | mAP | 0.1000 | 0.2000 |")
    test_map = evaluation.metrics["test/mAP"]
    assert "| rank | metric | test |" in seen and f"| 1 | mAP | {test_map:.4f} |" in seen
    default = write_report(_evaluation(DEFAULT), tmp_path / "default.md", []).read_text()
    assert _first_table(default)[0] == ["rank", "metric", "test"] and "## Seen classes" not in default


def test_the_registry_breaks_task2_ties_on_the_unseen_chain_and_prints_it():
    def run(run_id, start, **metrics):
        return Candidate(run_id, start, {k.replace("__", "/"): v for k, v in metrics.items()})

    # Equal on the selection metric; "seen" is better on the seen classes, "unseen" on the unseen ones.
    runs = [run("seen", 1, val__proxy_ood_mAP_best=0.4, test__mAP=0.9, test_unseen__mAP=0.1),
            run("unseen", 2, val__proxy_ood_mAP_best=0.4, test__mAP=0.2, test_unseen__mAP=0.3)]  # fmt: skip
    assert [c.run_id for c in rank(runs, "val/proxy_ood_mAP", TASK2.tie_breaks())] == ["unseen", "seen"]
    assert [c.run_id for c in rank(runs, "val/proxy_ood_mAP")] == ["seen", "unseen"]  # a task ranked on its labels
    lines = Ranking("val/proxy_ood_mAP", "abc", "asked", rank(runs, "val/proxy_ood_mAP", TASK2.tie_breaks()),
                    headline=TASK2).lines()  # fmt: skip
    assert lines[1] == ("  ties broken by the ranking chain on test (unseen classes): test_unseen/mAP, "
                        "test_unseen/mAUROC, test_unseen/mF1, test_unseen/mECE (lower wins), test_unseen/mPrecision, "
                        "test_unseen/mRecall, then the earlier run")  # fmt: skip
    assert lines[2].startswith("   1. unseen  0.4000")


def test_the_card_leads_with_the_unseen_rows_and_titles_the_seen_ones():
    card = load_card(DEFAULT_CARD)
    metrics = {"test/mAP": 0.30, "heldout/mAP": 0.5, "heldout/prevalence_baseline_mAP": 0.07,
               "test_unseen/mAP": 0.10, "test_unseen/prevalence_baseline_mAP": 0.02, "heldout_unseen/mAP": 0.2}  # fmt: skip
    rows = run_metric_rows(card.run_metrics, metrics, "task2", TASK2)
    assert [row.metric for row in rows] == ["test_unseen/mAP", "heldout_unseen/mAP", "test/mAP", "heldout/mAP"]
    assert rows[0].protocol == "the run's Task 2 unseen findings" and rows[0].value == 0.10
    assert rows[2].protocol == "the run's test, seen classes (proxy, not ranked)"
    assert rows[3].floor == "prevalence 0.070"  # the floor the card asks for is one the held-out subset logs
    assert "rows labelled for an unseen class" in rows[1].protocol
    task1 = run_metric_rows(card.run_metrics, metrics, "task1")
    assert [row.metric for row in task1][:2] == ["test/mAP", "heldout/mAP"] and task1[0].protocol == "the run's test"


@pytest.fixture
def store(tmp_path):
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    return client, client.create_experiment("task2", artifact_location=(tmp_path / "artifacts").as_uri())


def _frame(ids, labels, targets, probs):
    frame = pd.DataFrame(probs, columns=labels)
    frame.insert(0, "image_id", ids)
    for k, label in enumerate(labels):
        frame[f"true/{label}"] = targets[:, k]
    return frame


def test_make_compare_compares_task2_runs_on_their_unseen_predictions(store, tmp_path, monkeypatch, capsys):
    client, experiment = store
    rng = np.random.default_rng(1)
    ids = [f"img{i:03d}" for i in range(150)]
    seen_t, unseen_t = (rng.random((150, 3)) < 0.3).astype(int), (rng.random((150, 2)) < 0.3).astype(int)
    good = {"seen": np.clip(seen_t * 0.6 + rng.random(seen_t.shape) * 0.4, 0, 1),
            "unseen": np.clip(unseen_t * 0.6 + rng.random(unseen_t.shape) * 0.4, 0, 1)}  # fmt: skip
    noise = {"seen": rng.random(seen_t.shape), "unseen": rng.random(unseen_t.shape)}
    runs = {}
    # "a" is good on the seen classes and noise on the unseen ones; "b" the other way round.
    for name, seen, unseen in (("a", good["seen"], noise["unseen"]), ("b", noise["seen"], good["unseen"])):
        run_id = client.create_run(experiment, run_name=name, tags={"task": "task2"}).info.run_id
        folder = tmp_path / run_id
        folder.mkdir()
        _frame(ids, ["s1", "s2", "s3"], seen_t, seen).to_csv(folder / "test.csv", index=False)
        _frame(ids, ["Bulla", "Goiter"], unseen_t, unseen).to_csv(folder / "test_unseen.csv", index=False)
        client.log_artifacts(run_id, str(folder), "predictions")
        client.set_terminated(run_id, "FINISHED")
        runs[name] = run_id
    monkeypatch.setenv("MLFLOW_TRACKING_URI", client.tracking_uri)
    compare_main([runs["a"], runs["b"], "--no-log", "--n-boot", "300"])
    out = capsys.readouterr().out
    assert "b beats a on mAP" in out
    assert "note: compared on predictions/test_unseen.csv (unseen classes: the classes task2 is ranked on)" in out
    compare_main([runs["a"], runs["b"], "--no-log", "--n-boot", "300", "--split", "test"])
    out = capsys.readouterr().out
    assert "a beats b on mAP" in out and "compared on predictions/test.csv (seen classes (proxy, not ranked))" in out


def test_a_task2_grid_table_shows_the_unseen_chain(store):
    client, experiment = store
    for value in (0.2, 0.4):
        run_id = client.create_run(experiment, tags={"cxrlt.grid": "g", "task": "task2"}).info.run_id
        client.log_param(run_id, "loss.name", "asl")
        for key in (*(f"test_unseen/{m}" for m in ranking_chain()), "test/mAP"):
            client.log_metric(run_id, key, value)
        client.set_terminated(run_id, "FINISHED")
    assert columns(TASK2)[: len(CHAIN)] == [f"test_unseen/{m}" for m in CHAIN]
    assert columns(TASK2)[-1] == "test_unseen_perturbed/mAP"
    table = grid_table(client, "task2", "g", "loss.name").set_index("loss.name")
    assert table.at["asl", "test_unseen/mAP"] == f"0.3000 ± {np.std([0.2, 0.4], ddof=1):.4f}"
    assert "mAP" not in table.columns  # the seen classes' test/mAP is not the grid's figure


def test_the_task_configs_that_declare_a_headline_name_a_known_family():
    for path in sorted((CONFIGS / "task").glob("*.yaml")):
        headline_of(OmegaConf.load(path))  # raises, naming the task, on a prefix no family has
