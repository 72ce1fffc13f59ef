"""Every place a headline CXR-LT result is reported lists the whole ranking chain in chain order (docs/rules.md §2):
report.md, the terminal summary, ``make score``'s table and the runs table's saved view. The expected names come
from the registry, and a toy metric added to the chain must show up everywhere, so a reporter that hard-codes
its list (or drops a tie-break) fails here."""

from __future__ import annotations

import re
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from apps.score import score, score_lines
from evaluation.evaluate import MetricSet
from evaluation.intervals import CI_RULE
from evaluation.metric_registry import SUITE, SuiteMetric, class_ap
from evaluation.report import TRAINED_ON_CAVEAT, headline_rows, ranking_chain, summary_lines, write_report
from evaluation.suite import compute_suite
from evaluation.tables import headline_view_tag

LABELS = ["Cardiomegaly", "Pleural Effusion", "Nodule"]
CHALLENGE_CHAIN = ["mAP", "mAUROC", "mF1", "mECE", "mPrecision", "mRecall"]  # docs/rules.md §2
#: A toy seventh tie-break: registered inside a test, it must appear at the end of every chain listing.
TOY = SuiteMetric("mToy", "Toy", class_ap, key="toy", tie_break=6)


def _split(seed: int = 0, n: int = 80) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    targets = (rng.random((n, len(LABELS))) < [0.4, 0.2, 0.1]).astype(int)
    probs = np.clip(targets * 0.3 + rng.random(targets.shape) * 0.7, 0, 1)
    return targets, probs


def _evaluation() -> SimpleNamespace:
    targets, probs = _split()
    result = compute_suite(targets, probs, LABELS, n_boot=40, seed=1)
    metrics = {f"test/{k}": v for k, v in result.metrics.items()}
    frame = pd.DataFrame(probs, columns=LABELS).assign(**{f"true/{n}": targets[:, i] for i, n in enumerate(LABELS)})
    return SimpleNamespace(sets={"test": MetricSet("test", probs, result, metrics)}, metrics=metrics,
                           predictions={"test": frame}, labels=LABELS, groups={}, sources={},
                           train_prevalence=np.array([0.3, 0.1, 0.01]))  # fmt: skip


def _in_order(text: str, names: list[str]) -> bool:
    """Whether every name occurs in ``text`` as a whole word, in the given order."""
    positions = [re.search(rf"(?<![\w/]){re.escape(name)}(?!\w)", text) for name in names]
    return all(positions) and [p.start() for p in positions] == sorted(p.start() for p in positions)


def _values(line: str) -> str:
    """A terminal line after its header (which names the lower-is-better metrics first)."""
    return line.split(": ", 1)[1]


def test_the_chain_is_the_challenges_and_every_headline_table_starts_with_it():
    assert list(ranking_chain()) == CHALLENGE_CHAIN
    rows = headline_rows()
    assert list(rows[: len(CHALLENGE_CHAIN)]) == CHALLENGE_CHAIN
    assert set(rows) == set(SUITE.headline())  # nothing else dropped either (ECE_pooled follows, unranked)


def _headline_table(report: str) -> list[tuple[str, str]]:
    section = report.split("## Headline", 1)[1].split("\n## ", 1)[0]
    return [(cells[1], cells[2]) for cells in (line.split("|") for line in section.splitlines())
            if len(cells) > 3 and cells[1].strip() not in ("rank", "---")]  # fmt: skip


def test_report_ranks_the_whole_chain_top_down(tmp_path):
    report = write_report(_evaluation(), tmp_path / "report.md", []).read_text()
    rows = [(rank.strip(), name.strip()) for rank, name in _headline_table(report)]
    assert rows[: len(CHALLENGE_CHAIN)] == [(str(i + 1), name) for i, name in enumerate(CHALLENGE_CHAIN)]
    assert all(rank == "-" for rank, _ in rows[len(CHALLENGE_CHAIN) :])
    assert "mECE (lower wins)" in report


def test_a_metric_added_to_the_chain_reaches_the_report_the_terminal_and_the_score_table(tmp_path):
    with SUITE.registered(TOY):
        evaluation = _evaluation()  # computed with the toy metric registered, so it has a value
        report = write_report(evaluation, tmp_path / "report.md", []).read_text()
        assert ("7", "mToy") in [(r.strip(), n.strip()) for r, n in _headline_table(report)]
        assert _in_order(_values(summary_lines(evaluation.metrics)[0]), [*CHALLENGE_CHAIN, "mToy"])
        table = "\n".join(score_lines(evaluation.sets["test"].result.metrics))
        assert re.search(r"^\s*7\.\s+mToy\s+\d", table, re.M)
        view = headline_view_tag("val/mAP")
        assert "test/mToy" in next(iter(view.values()))
    assert "mToy" not in headline_rows()  # gone with the registration


def test_the_terminal_lists_the_chain_for_test_heldout_and_unseen_and_flags_trained_on_cases():
    chain = {name: 0.5 for name in CHALLENGE_CHAIN}
    metrics = {**{f"test/{k}": v for k, v in chain.items()}, **{f"heldout/{k}": v for k, v in chain.items()},
               "heldout/n_images": 300.0, "heldout/trained_on": 1.0}  # fmt: skip
    unseen = {f"test_unseen/{k}": v for k, v in chain.items()}
    lines = summary_lines(metrics, unseen)
    test = lines[0]
    (heldout,) = [line for line in lines if line.startswith("held-out")]
    (zero_shot,) = [line for line in lines if line.startswith("unseen")]
    for line in (test, heldout, zero_shot):
        assert _in_order(_values(line), CHALLENGE_CHAIN), line
    assert "300 cases" in heldout and TRAINED_ON_CAVEAT in heldout
    metrics["heldout/trained_on"] = 0.0
    assert TRAINED_ON_CAVEAT not in "\n".join(summary_lines(metrics))


def test_a_missing_chain_metric_shows_as_a_gap_not_a_shorter_chain():
    line = summary_lines({"test/mAP": 0.3, "test/mAUROC": 0.7})[0]
    assert _in_order(_values(line), CHALLENGE_CHAIN) and "mECE -" in line


def test_make_score_prints_the_chain_numbered_in_order(tmp_path, capsys, task1_labels):
    from training.data.findings import CXRLT_FINDINGS  # noqa: F401  (the manifest's vocabulary)

    rng = np.random.default_rng(0)
    n = 40
    truth = (rng.random((n, len(task1_labels))) < 0.2).astype(int)
    truth[:, 0] = 0  # a class without a test positive: left out, and the printout says so
    ids = [f"img{i}" for i in range(n)]
    manifest = pd.DataFrame({"image_id": ids, "path": [f"images/{i}.png" for i in range(n)], "split": "test",
                             "patient_id": [f"p{i}" for i in range(n)]})  # fmt: skip
    manifest = pd.concat([manifest, pd.DataFrame(truth, columns=task1_labels)], axis=1)
    manifest.to_csv(tmp_path / "manifest.csv", index=False)
    predictions = pd.DataFrame(np.clip(truth * 0.3 + rng.random(truth.shape) * 0.7, 0, 1), columns=task1_labels)
    predictions.insert(0, "image_id", ids)
    predictions.to_csv(tmp_path / "predictions.csv", index=False)
    score(SimpleNamespace(predictions=tmp_path / "predictions.csv", manifest=tmp_path / "manifest.csv",
                          split="test", task="task1", n_boot=20))  # fmt: skip
    printed = capsys.readouterr().out
    numbered = re.findall(r"^\s*(\d)\.\s+(\S+)\s+\d\.\d{4}\s+\[", printed, re.M)
    assert numbered == [(str(i + 1), name) for i, name in enumerate(CHALLENGE_CHAIN)]
    assert re.search(r"^\s*-\s+ECE_pooled\s+\d", printed, re.M)
    assert f"  {CI_RULE}\n" in printed
    assert f"1 of {len(task1_labels)} classes have no positive in test and are left out" in printed


@pytest.mark.parametrize(("set_prefix", "heldout", "other"), [("test", "heldout", "heldout_unseen"),
                                                               ("test_unseen", "heldout_unseen", "heldout")])  # fmt: skip
def test_the_saved_runs_view_shows_the_chain_in_order(set_prefix, heldout, other):
    state = next(iter(headline_view_tag("val/mAP", set_prefix).values()))
    assert _in_order(state, [f"{set_prefix}/{name}" for name in CHALLENGE_CHAIN])
    assert f"metrics.`{heldout}/mAP`" in state  # the stability check of the same classes beside the test figures
    assert f"metrics.`{other}/mAP`" not in state
