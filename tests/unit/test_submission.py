"""The submission in the organisers' format: their header byte for byte, their test lists read as released, full
float precision, the upload zip with its code/, and every problem named on one line."""

from __future__ import annotations

import os
import subprocess
import zipfile
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from apps.submission import (
    CodeRecord,
    SubmissionError,
    Template,
    build_submission,
    check_template,
    problems,
    read_zip,
    validate,
    validate_file,
    write_submission,
)
from evaluation.organiser_names import TASK1_COLUMNS, TASK2_COLUMNS
from evaluation.prediction_columns import to_platform
from training.data.findings import TASK1_LABELS, TASK2_LABELS

LABELS = ["Pleural Effusion", "Cardiomegaly", "Support Devices"]
IDS = ["img0", "img1", "img2", "img3"]
TASK1_HEADER = (
    "ImageID,Normal,aortic elongation,cardiomegaly,pleural effusion,Nodule,atelectasis,pleural thickening,aortic "
    "atheromatosis,Support Devices,alveolar pattern,fracture,Hernia,Emphysema,azygos lobe,Hydropneumothorax,Kyphosis,"
    "Mass,Pneumothorax,Subcutaneous Emphysema,pneumoperitoneo,vascular hilar enlargement,vertebral degenerative "
    "changes,hyperinflated lung,interstitial pattern,central venous catheter,hypoexpansion,bronchiectasis,"
    "hemidiaphragm elevation,sternotomy,calcified densities"
)  # DESIGN.md §8: the training table's header without its date and patient columns
TASK2_HEADER = "ImageID,Scoliosis,Osteopenia,Bulla,Infarction,Adenopathy,goiter"
RECORD = CodeRecord(b"task:\n  name: task1\n", "make submit TASK=task1 OUT=upload.zip", None, "run0")


def _valid() -> pd.DataFrame:
    template = Template.default(LABELS, IDS)
    probs = np.array([[0.1, 0.2, 0.3], [0.4, 0.5, 0.6], [0.7, 0.8, 0.9], [0.0, 1.0, 0.5]])
    return build_submission(template, IDS, probs, LABELS)


def _one_line(error: pytest.ExceptionInfo) -> str:
    message = str(error.value)
    assert "\n" not in message
    return message


# ------------------------------------------------------------------------------------------ header and values


def test_default_header_is_the_organisers_spelling_in_the_labels_order_for_a_partial_set():
    assert Template.default(LABELS, IDS).header == ["ImageID", "pleural effusion", "cardiomegaly", "Support Devices"]


@pytest.mark.parametrize(("labels", "expected"), [(TASK1_LABELS, TASK1_HEADER), (TASK2_LABELS, TASK2_HEADER)])
def test_written_header_is_the_organisers_byte_for_byte(tmp_path, labels, expected):
    """The config lists the classes alphabetically; the file follows the organisers' order and spelling."""
    probs = np.arange(2 * len(labels), dtype=float).reshape(2, -1) / 100  # label j of row i: (i * C + j) / 100
    frame = build_submission(Template.default(labels, ["a", "b"]), ["a", "b"], probs, labels)
    out = tmp_path / "submission.csv"
    write_submission(frame, Template.default(labels, ["a", "b"]), out)
    assert out.read_bytes().split(b"\n")[0] == expected.encode()
    written = pd.read_csv(out).set_index("ImageID")
    columns = {**TASK1_COLUMNS, **TASK2_COLUMNS}
    for j, label in enumerate(labels):  # each probability sits under its own class
        assert written.loc["b", columns[label]] == (len(labels) + j) / 100


def test_task1_header_equals_the_organisers_table():
    assert TASK1_HEADER.split(",")[1:] == list(TASK1_COLUMNS.values())
    assert TASK2_HEADER.split(",")[1:] == list(TASK2_COLUMNS.values())


@pytest.mark.parametrize("suffix", [".csv", ".zip"])
def test_probabilities_read_back_bit_for_bit(tmp_path, suffix):
    rng = np.random.default_rng(0)
    probs = rng.random((200, 3)) ** 9  # many tiny values, which 6 decimals would turn into 0.000000
    probs[0] = [5e-324, 1 - 2**-53, 0.1]  # the smallest subnormal, the largest double below 1, a non-binary decimal
    ids = [f"{i:06d}" for i in range(200)]  # leading zeros stay: ids are text
    template = Template.default(LABELS, ids)
    out = tmp_path / f"submission{suffix}"
    write_submission(build_submission(template, ids, probs, LABELS), template, out, RECORD)
    text = read_zip(out)[1] if suffix == ".zip" else out.read_bytes()
    rows = [line.split(",") for line in text.decode().splitlines()[1:]]
    assert [row[0] for row in rows] == ids
    back = np.array([[float(cell) for cell in row[1:]] for row in rows])
    assert (back.view(np.int64) == probs.view(np.int64)).all()
    assert (probs < 5e-7).sum() > 100  # the values rounding would have lost are there


# ------------------------------------------------------------------------------- the organisers' test lists


def _task1_list(folder: Path, ids: list[str], empty: int = 30) -> Path:
    """``CXRLT_2026_TEST_ALL_TASK1.csv`` as released: three id columns, ``empty`` unnamed class columns, every row
    with as many empty fields, a newline after the last row."""
    path = folder / "CXRLT_2026_TEST_ALL_TASK1.csv"
    lines = ["ImageID,StudyDate_DICOM,PatientID" + "," * empty]
    lines += [f"{i},20140512,3.24E+38" + "," * empty for i in ids]
    path.write_text("\n".join(lines) + "\n")
    return path


def _task2_list(folder: Path, ids: list[str]) -> Path:
    """``CXRLT_2026_TEST_ALL_TASK2.csv`` as released: no class column, no newline at the end of the file."""
    path = folder / "CXRLT_2026_TEST_ALL_TASK2.csv"
    path.write_text("\n".join(["ImageID,StudyDate_DICOM,PatientID", *(f"{i},20150101,1.51E+37" for i in ids)]))
    return path


def test_task1_test_list_as_released_gives_the_organisers_columns(tmp_path):
    path = _task1_list(tmp_path, ["b_1.png", "a_2.png", "c_3.png"])
    template = Template.read(path, TASK1_LABELS)
    assert ",".join(template.header) == TASK1_HEADER
    assert template.ids == ["b_1.png", "a_2.png", "c_3.png"]  # the list's order, never sorted


def test_task2_test_list_without_class_columns_or_final_newline(tmp_path):
    path = _task2_list(tmp_path, ["x.png", "y.png"])
    assert not path.read_bytes().endswith(b"\n")
    template = Template.read(path, TASK2_LABELS)
    assert ",".join(template.header) == TASK2_HEADER
    assert template.ids == ["x.png", "y.png"]


def test_class_order_comes_from_the_release_files_beside_the_template(tmp_path):
    """The release decides: a training table or Eval_Class_Task2.txt beside the list is followed as written."""
    reordered = list(reversed(TASK1_COLUMNS.values()))
    (tmp_path / "CXRLT_2026_training.csv").write_text(
        "ImageID,StudyDate_DICOM,PatientID," + ",".join(reordered) + "\nz.png,20140101,3.24E+38" + ",0" * 30 + "\n"
    )
    assert Template.read(_task1_list(tmp_path, ["a"]), TASK1_LABELS).class_columns == reordered
    (tmp_path / "Eval_Class_Task2.txt").write_text("goiter\t\nBulla\t\nScoliosis\t\nOsteopenia\t\nInfarction\t\n"
                                                   "Adenopathy")  # fmt: skip
    template = Template.read(_task2_list(tmp_path, ["a"]), TASK2_LABELS)
    assert template.class_columns == ["goiter", "Bulla", "Scoliosis", "Osteopenia", "Infarction", "Adenopathy"]


def test_a_submission_for_a_test_list_holds_the_ids_in_order_and_no_date_or_patient(tmp_path):
    path = _task2_list(tmp_path, ["y.png", "x.png"])
    template = Template.read(path, TASK2_LABELS)
    probs = np.array([[0.1, 0.2, 0.3, 0.4, 0.5, 0.6], [0.6, 0.5, 0.4, 0.3, 0.2, 0.1]])  # rows: x, y
    out = tmp_path / "task2.csv"
    write_submission(build_submission(template, ["x.png", "y.png"], probs, TASK2_LABELS), template, out)
    assert out.read_text() == f"{TASK2_HEADER}\ny.png,0.1,0.2,0.5,0.3,0.6,0.4\nx.png,0.6,0.5,0.2,0.4,0.1,0.3\n"


def test_named_template_header_is_copied_exactly(tmp_path):
    path = tmp_path / "template.csv"
    header = ["ImageID", "Support_Devices", "pleural effusion", "CARDIOMEGALY"]  # another order, other spellings
    pd.DataFrame({c: (["img3", "img0", "img2", "img1"] if c == "ImageID" else 0) for c in header}).to_csv(
        path, index=False
    )
    template = Template.read(path)
    probs = np.array([[0.1, 0.2, 0.3], [0.4, 0.5, 0.6], [0.7, 0.8, 0.9], [0.0, 1.0, 0.5]])  # rows follow IDS
    frame = build_submission(template, IDS, probs, LABELS)
    assert list(frame.columns) == header and frame["ImageID"].tolist() == ["img3", "img0", "img2", "img1"]
    row = frame.set_index("ImageID").loc["img1"]
    assert (row["Support_Devices"], row["pleural effusion"], row["CARDIOMEGALY"]) == (0.6, 0.4, 0.5)
    assert problems(frame, template) == []


def test_dicom_id_is_written_on_request_and_read_by_make_score(tmp_path):
    template = Template.default(LABELS, IDS).with_id_column("dicom_id")
    out = tmp_path / "submission.csv"
    write_submission(build_submission(template, IDS, np.full((4, 3), 0.25), LABELS), template, out)
    assert out.read_text().splitlines()[0] == "dicom_id,pleural effusion,cardiomegaly,Support Devices"
    scored = to_platform(pd.read_csv(out, dtype={"dicom_id": str}), LABELS)
    assert scored["image_id"].tolist() == IDS and list(scored.columns) == ["image_id", *LABELS]


# ------------------------------------------------------------------------------------- one-line refusals


@pytest.mark.parametrize(
    ("lines", "message"),
    [
        (["ImageID,StudyDate_DICOM,PatientID" + "," * 29, "a,1,2" + "," * 29],
         "line 1: 29 class column(s) with an empty header; the task submits 30 (Normal, aortic elongation, "),
        (["ImageID,StudyDate_DICOM,PatientID,Normal,", "a,1,2,,"],
         "line 1: 1 named and 1 empty class header(s); a template names all its class columns or none"),
        (["ImageID,,", "a,,", "b,,", "a,,"], "line 4: id 'a' is listed again (first on line 2)"),
        (["ImageID,,", "a,,", ",,"], "line 3: empty image id"),
        (["ImageID,cardiomegaly,cardiomegaly", "a,,"], "line 1: column 'cardiomegaly' appears twice"),
        (["cardiomegaly,ImageID", "0,a"], "line 1: the first column 'cardiomegaly' is not an image id column"),
        (["ImageID", "a,1"], "line 2: 2 fields, the header has 1"),
    ],
)  # fmt: skip
def test_a_bad_template_is_one_line_naming_file_line_and_column_or_id(tmp_path, lines, message):
    path = tmp_path / "template.csv"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(SubmissionError) as error:
        Template.read(path, TASK1_LABELS)
    assert _one_line(error).startswith(f"{path}, {message}")


def test_a_bad_release_class_file_beside_the_template_is_named(tmp_path):
    names = list(TASK1_COLUMNS.values())
    names[19] = "pneumoperitonium"
    (tmp_path / "CXRLT_2026_training.csv").write_text("ImageID,StudyDate_DICOM,PatientID," + ",".join(names) + "\n")
    with pytest.raises(SubmissionError) as error:
        Template.read(_task1_list(tmp_path, ["a"]), TASK1_LABELS)
    assert _one_line(error) == (f"{tmp_path}/CXRLT_2026_training.csv: class column 'pneumoperitonium' is not one of "
                                "the task's 30 classes")  # fmt: skip
    (tmp_path / "Eval_Class_Task2.txt").write_text("Scoliosis\t\nOsteopenia\t\nBulla\t\nInfarction\t\nAdenopathy\t\n")
    with pytest.raises(SubmissionError) as error:
        Template.read(_task2_list(tmp_path, ["a"]), TASK2_LABELS)
    assert _one_line(error) == f"{tmp_path}/Eval_Class_Task2.txt: no column for the task's class(es) ['Goiter']"


def test_a_named_template_column_the_model_lacks_is_named_with_its_file(tmp_path):
    path = tmp_path / "template.csv"
    path.write_text("ImageID,pleural effusion,pleural efusion\na,,\n")
    with pytest.raises(SubmissionError) as error:
        build_submission(Template.read(path), ["a"], np.zeros((1, 3)), LABELS)
    assert _one_line(error).startswith(f"{path}: column 'pleural efusion' names no class of the model; its classes: ")


def test_check_template_needs_no_model_and_keeps_empty_headers_empty(tmp_path):
    assert check_template(_task1_list(tmp_path, ["a", "b"], empty=3)) == ("ImageID", ["", "", ""], ["a", "b"])


def _rejected(frame: pd.DataFrame, tmp_path) -> str:
    path = tmp_path / "bad.csv"
    frame.to_csv(path, index=False)
    with pytest.raises(SubmissionError) as error:
        validate_file(path, Template.default(LABELS, IDS))
    assert _one_line(error).startswith(f"{path}: invalid submission: ")
    return str(error.value)


def test_a_valid_file_passes(tmp_path):
    frame = _valid()
    path = tmp_path / "submission.csv"
    frame.to_csv(path, index=False)
    assert problems(frame, Template.default(LABELS, IDS)) == []
    assert validate_file(path, Template.default(LABELS, IDS))["ImageID"].tolist() == IDS


def test_missing_id_is_named(tmp_path):
    assert "1 id(s) missing: 'img2'" in _rejected(_valid().drop(index=2), tmp_path)


def test_duplicated_id_is_named_with_its_lines(tmp_path):
    frame = _valid()
    frame.loc[3, "ImageID"] = "img1"  # img3 is then missing too; both are reported
    message = _rejected(frame, tmp_path)
    assert "id 'img1' appears 2 times (lines [3, 5])" in message and "'img3'" in message


def test_an_id_not_in_the_template_is_named_with_the_template(tmp_path):
    template_path = _task2_list(tmp_path, IDS)
    template = Template.read(template_path, TASK2_LABELS)
    frame = build_submission(template, IDS, np.zeros((4, 6)), TASK2_LABELS)
    frame = pd.concat([frame, frame.iloc[[0]].assign(ImageID="intruder")], ignore_index=True)
    path = tmp_path / "submission.csv"
    frame.to_csv(path, index=False)
    with pytest.raises(SubmissionError) as error:
        validate_file(path, template)
    assert _one_line(error) == f"{path}: invalid submission: 1 id(s) not in {template_path}: 'intruder'"


def test_nan_is_named_by_line_id_and_column(tmp_path):
    frame = _valid()
    frame.loc[1, "cardiomegaly"] = np.nan
    message = _rejected(frame, tmp_path)
    assert "line 3 (id 'img1'), column 'cardiomegaly'" in message and "not a probability" in message


def test_value_above_one_is_named(tmp_path):
    frame = _valid()
    frame.loc[2, "Support Devices"] = 1.5
    assert "line 4 (id 'img2'), column 'Support Devices': '1.5'" in _rejected(frame, tmp_path)


def test_negative_and_text_values_are_rejected_too():
    frame = _valid().astype({"pleural effusion": object})
    frame.loc[0, "pleural effusion"] = -0.1
    frame.loc[3, "pleural effusion"] = "high"
    found = problems(frame, Template.default(LABELS, IDS))
    assert len(found) == 2 and "'high'" in found[1]


def test_misspelt_column_is_named(tmp_path):
    frame = _valid().rename(columns={"cardiomegaly": "cardiomegally"})
    assert "column 3 is 'cardiomegally', expected 'cardiomegaly'" in _rejected(frame, tmp_path)


def test_every_problem_is_listed_at_once_on_one_line():
    frame = _valid().rename(columns={"cardiomegaly": "Cardiomegaly"}).drop(index=0)
    frame.loc[1, "Support Devices"] = 2.0
    with pytest.raises(SubmissionError) as error:
        validate(frame, Template.default(LABELS, IDS))
    assert all(part in _one_line(error) for part in ("'Cardiomegaly'", "'img0'", "column 'Support Devices'"))


def test_row_order_must_follow_the_template():
    frame = _valid().iloc[[1, 0, 2, 3]]
    (problem,) = problems(frame, Template.default(LABELS, IDS))
    assert "line 2 has id 'img1', expected 'img0'" in problem
    assert problems(frame, Template.default(LABELS, IDS), check_order=False) == []


def test_an_invalid_frame_writes_nothing(tmp_path):
    frame = _valid()
    frame.loc[0, "cardiomegaly"] = 7.0
    with pytest.raises(SubmissionError, match="column 'cardiomegaly': '7.0'"):
        write_submission(frame, Template.default(LABELS, IDS), tmp_path / "s.zip", RECORD)
    assert list(tmp_path.iterdir()) == []


# ------------------------------------------------------------------------------------------------ the upload


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@example.org", *args],
                          check=True, capture_output=True, text=True).stdout.strip()  # fmt: skip


@pytest.fixture
def repository(tmp_path, monkeypatch):
    """A committed project (``apps/x.py`` = 'committed'), then edited ('edited') with an untracked file beside it."""
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path))
    repo = tmp_path / "project"
    (repo / "apps").mkdir(parents=True)
    (repo / "apps" / "x.py").write_text("committed\n")
    (repo / "Makefile").write_text("all:\n")
    _git(repo, "init", "-q")
    _git(repo, "add", "apps/x.py", "Makefile")
    _git(repo, "commit", "-q", "-m", "one")
    commit = _git(repo, "rev-parse", "HEAD")
    (repo / "apps" / "x.py").write_text("edited\n")
    (repo / "apps" / "untracked.py").write_text("never sent\n")
    return repo, commit


def _upload(tmp_path: Path, record: CodeRecord, root: Path) -> tuple[str, dict[str, bytes]]:
    out = tmp_path / "upload.zip"
    described = write_submission(_valid(), Template.default(LABELS, IDS), out, record, root)
    with zipfile.ZipFile(out) as archive:
        return described, {name: archive.read(name) for name in archive.namelist()}


def test_the_zip_holds_the_csv_on_top_and_code_at_the_runs_commit(tmp_path, repository):
    repo, commit = repository
    record = CodeRecord(b"seed: 3\n", "make submit TASK=task1\npython -m apps.submit_cli --task task1", commit, "r1")
    described, files = _upload(tmp_path, record, repo)
    assert sorted(files) == ["code/COMMAND.txt", "code/Makefile", "code/SOURCE.txt", "code/apps/x.py",
                             "code/config.yaml", "upload.csv"]  # fmt: skip
    assert files["upload.csv"] == _csv_bytes()
    assert files["code/apps/x.py"] == b"committed\n"  # the commit, not the edited tree
    assert files["code/config.yaml"] == b"seed: 3\n"
    assert files["code/COMMAND.txt"] == b"make submit TASK=task1\npython -m apps.submit_cli --task task1\n"
    assert described == f"git archive {commit}: the source at the run's commit (run tag mlflow.source.git.commit)"
    assert files["code/SOURCE.txt"].decode().startswith(f"Source: {described}.\nRun: r1; its resolved config is ")
    assert read_zip(tmp_path / "upload.zip")[0] == "upload.csv"


def _csv_bytes() -> bytes:
    return _valid().to_csv(index=False, lineterminator="\n").encode()


@pytest.mark.parametrize(
    ("commit", "reason"),
    [
        (None, "the run recorded no commit"),
        ("unknown", "the run recorded no commit"),
        ("{commit}-dirty", "the run was trained from a tree with uncommitted changes ({commit}-dirty)"),
        ("0" * 40, "the run's commit 0000000000000000000000000000000000000000 is not in the repository at {repo}"),
    ],
)
def test_without_the_runs_commit_the_tracked_working_tree_is_sent_and_said(tmp_path, repository, commit, reason):
    repo, head = repository
    commit = commit.format(commit=head) if commit else commit
    described, files = _upload(tmp_path, CodeRecord(b"a: 1\n", "make submit", commit, "r1"), repo)
    assert files["code/apps/x.py"] == b"edited\n" and "code/apps/untracked.py" not in files
    assert described == (f"the working tree's tracked files (git ls-files, HEAD {head}), because "
                         f"{reason.format(commit=head, repo=repo)}")  # fmt: skip
    assert f"Source: {described}." in files["code/SOURCE.txt"].decode()


def test_without_git_the_projects_own_folders_are_sent(tmp_path, monkeypatch):
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path))
    root = tmp_path / "project"
    for name in ("apps/a.py", "training/b.py", "training/__pycache__/b.pyc", "mlruns/mlflow.db", "Makefile"):
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(name)
    described, files = _upload(tmp_path, CodeRecord(b"a: 1\n", "make submit", "abc123", "r1"), root)
    assert sorted(n for n in files if n.startswith("code/") and not n.endswith((".txt", ".yaml"))) == [
        "code/Makefile", "code/apps/a.py", "code/training/b.py"]  # fmt: skip
    assert described.startswith("the project's folders (apps, configs, evaluation, training, tests, docs, Makefile, "
                                f"pyproject.toml, README.md) at {root}, because the run's commit abc123 is not in "
                                "the repository")  # fmt: skip
    assert described.endswith("and there is no git repository there")


def test_a_zip_without_code_or_with_two_csvs_is_refused_in_one_line(tmp_path):
    path = tmp_path / "upload.zip"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("upload.csv", _csv_bytes())
        archive.writestr("code/a.py", "x")
    with pytest.raises(SubmissionError) as error:
        validate_file(path, Template.default(LABELS, IDS))
    assert _one_line(error) == f"{path}: code/config.yaml is missing"
    with zipfile.ZipFile(path, "a") as archive:
        archive.writestr("other.csv", _csv_bytes())
    with pytest.raises(SubmissionError, match=r"2 CSV file\(s\) at the top level"):
        validate_file(path, Template.default(LABELS, IDS))


def test_out_must_be_a_zip_or_a_csv(tmp_path):
    with pytest.raises(SubmissionError, match=r"a submission is a \.zip .* or a \.csv"):
        write_submission(_valid(), Template.default(LABELS, IDS), tmp_path / "s.txt")
    assert not os.listdir(tmp_path)
