"""`make score` / `make submit` for concept tasks: the branch by the task's submission format, the run-file scorer
with its per-concept table, and the concept tables thresholds are chosen on."""

from __future__ import annotations

import gzip

import numpy as np
import pandas as pd
import pytest

from apps import score as score_cli
from apps import submit as submit_cli
from apps.benchmarks.imageclef_concepts.tables import per_concept_table, read_ids, split_concepts, truth_matrix
from apps.submission import SUBMISSION_FORMATS, SubmissionError, submission_format

TRUTH = "ID,CUIs\na,C0000001;C0000002\nb,C0000001\nc,C0000003\n"
MANUAL = "ID,CUIs\na,C0000001\nb,\nc,C0000003\n"
RUN = "a,C0000001\nb,C0000001;C0000002\nc\n"  # F1: a 2/3, b 2/3, c 0 -> 4/9


def test_each_submission_format_has_a_writer_and_a_scorer_and_tasks_name_theirs():
    assert set(SUBMISSION_FORMATS) == set(score_cli.SCORERS) == set(submit_cli.WRITERS)
    assert submission_format("rocov2_concepts") == "concepts"
    assert submission_format("task1") == submission_format("my-own-experiment") == "probabilities"


def test_an_unknown_submission_format_is_named(tmp_path, monkeypatch):
    from apps import submission

    (tmp_path / "odd.yaml").write_text("name: odd\nsubmission_format: captions\n")
    monkeypatch.setattr(submission, "TASK_CONFIGS", tmp_path)
    with pytest.raises(SubmissionError, match="'captions' is not one of"):
        submission_format("odd")


def test_score_a_run_file_primary_secondary_and_per_concept(tmp_path, capsys):
    (tmp_path / "test_concepts.csv").write_text(TRUTH)
    (tmp_path / "manual.csv.gz").write_bytes(gzip.compress(MANUAL.encode()))
    (tmp_path / "cui_mapping.csv").write_text("CUI,Canonical name\nC0000001,First\nC0000003,Third\n")
    (tmp_path / "run.csv").write_text(RUN)
    args = [str(tmp_path / "run.csv"), str(tmp_path / "test_concepts.csv"), "--task", "rocov2_concepts",
            "--manual", str(tmp_path / "manual.csv.gz"), "--secondary", "manual", "--n-boot", "100",
            "--out", str(tmp_path / "table.csv")]  # fmt: skip
    score_cli.main(args)
    printed = capsys.readouterr().out
    assert float(printed.split("F1 (primary)")[1].split()[0]) == pytest.approx(4 / 9, abs=1e-4)
    # Secondary on {C0000001, C0000003}: a 1 (C0000001 both sides), b left out (empty manual truth), c 0 -> 1/2.
    assert float(printed.split("F1 (secondary)")[1].split()[0]) == pytest.approx(0.5, abs=1e-4)
    table = pd.read_csv(tmp_path / "table.csv", keep_default_na=False).set_index("concept")
    assert table.loc["C0000001", ["name", "support", "predicted", "tp"]].tolist() == ["First", 2, 2, 2]
    assert table.loc["C0000002", ["support", "predicted", "tp", "f1"]].tolist() == [1, 1, 0, 0.0]
    assert table.index.tolist() == ["C0000001", "C0000002", "C0000003"]  # by support, then CUI


def test_a_run_missing_a_test_image_is_refused_by_name(tmp_path, capsys):
    (tmp_path / "t.csv").write_text(TRUTH)
    (tmp_path / "run.csv").write_text("a,C0000001\nb,C0000001\n")
    with pytest.raises(SystemExit) as stop:
        score_cli.main([str(tmp_path / "run.csv"), str(tmp_path / "t.csv"), "--task", "rocov2_concepts"])
    assert stop.value.code == 1
    assert "1 missing ('c')" in capsys.readouterr().err


def test_truth_matrix_counts_concepts_outside_the_labels_as_missed():
    sets = [split_concepts("C0000001;c0000009"), split_concepts(""), split_concepts("C0000002")]
    truth, missed = truth_matrix(sets, ["C0000001", "C0000002"])
    np.testing.assert_array_equal(truth, [[1, 0], [0, 0], [0, 1]])
    np.testing.assert_array_equal(missed, [1, 0, 0])


def test_per_concept_table_and_id_lists(tmp_path):
    table = per_concept_table({"a": {"C0000001"}, "b": set()}, {"a": ("C0000001", "C0000005"), "b": ()})
    assert table["concept"].tolist() == ["C0000001", "C0000005"]
    assert table["precision"].tolist() == [1.0, 0.0] and table["recall"].tolist() == [1.0, 0.0]
    (tmp_path / "ids.csv.gz").write_bytes(gzip.compress(b"ID,CUIs\nx,C0000001\ny,\n"))
    assert read_ids(tmp_path / "ids.csv.gz") == ["x", "y"]
    (tmp_path / "bare.csv").write_text("x\ny\n")
    assert read_ids(tmp_path / "bare.csv") == ["x", "y"]
