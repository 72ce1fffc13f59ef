"""``make submit``, ``make score`` and ``make serve`` as typed: the loop closes, and a missing input is one line.

The model is a fabricated FINISHED smoke run (:func:`tests.finished_runs.fabricate_finished_run`: untrained
weights, no training), which is all submitting and scoring need.
"""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pandas as pd
import pytest
from mlflow import MlflowClient

from apps import serve
from evaluation.organiser_names import TASK1_COLUMNS
from tests.conftest import PROJECT_ROOT
from tests.finished_runs import fabricate_finished_run

#: The organisers' Task 1 header (DESIGN.md §8, without the date and patient columns).
TASK1_HEADER = "ImageID," + ",".join(TASK1_COLUMNS.values())


def make(*arguments: str, env: dict, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run(["make", "--no-print-directory", "-C", str(PROJECT_ROOT), *arguments], env=env,
                          capture_output=True, text=True, timeout=timeout)  # fmt: skip


def store_env(tmp_path: Path) -> dict:
    return {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path}/mlflow.db", "PYTHONUNBUFFERED": "1",
            "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false"}  # fmt: skip


def one_error(done: subprocess.CompletedProcess) -> str:
    """The ``error:`` line of a refused command, checked to be its whole report (no traceback)."""
    assert done.returncode != 0, done.stdout[-2000:]
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    (line,) = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
    return line


def test_make_serve_without_a_store_is_one_line_and_creates_nothing(tmp_path):
    done = make("serve", "PORT=1", env=store_env(tmp_path), timeout=120)
    assert one_error(done) == (f"error: no MLflow store at {tmp_path}/mlflow.db (sqlite:///{tmp_path}/mlflow.db): "
                               "train a run first, or set MLFLOW_TRACKING_URI to the store that holds it; `make "
                               "register TASK=<task>` registers a champion to serve")  # fmt: skip
    assert list(tmp_path.iterdir()) == []  # no empty mlflow.db left behind


def reported(main, argv: list[str], capsys) -> str:
    """The one ``error:`` line an entry point's ``main`` ends with (in process: what ``make`` runs, minus startup)."""
    with pytest.raises(SystemExit) as stopped:
        main(argv)
    assert stopped.value.code == 1
    (line,) = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error: ")]
    return line


def test_serving_an_unregistered_model_is_one_line(tmp_path, monkeypatch, capsys):
    env = store_env(tmp_path)
    MlflowClient(env["MLFLOW_TRACKING_URI"]).search_experiments()  # a store without any registered model
    monkeypatch.setenv("MLFLOW_TRACKING_URI", env["MLFLOW_TRACKING_URI"])
    assert reported(serve.main, [], capsys) == (
        f"error: models:/cxrlt-task1@champion: no such registered model version in sqlite:///{tmp_path}/mlflow.db; "
        "`make register TASK=<task>` registers a champion to serve"
    )
    assert reported(serve.main, ["--image-root", f"{tmp_path}/nowhere"], capsys) == (
        f"error: --image-root {tmp_path}/nowhere: no such folder"
    )


MISSING_TEMPLATE = ("error: --template organisers.csv: no such file (the organisers' template comes with their test "
                    "images; without TEMPLATE the test split of the model's data is submitted)")  # fmt: skip


#: Runs ``python -m <module> <args>``, then prints whether torch or MLflow were imported.
PROBE = """
import runpy, sys
module, sys.argv = sys.argv[1], sys.argv[1:]
try:
    runpy.run_module(module, run_name="__main__", alter_sys=True)
finally:
    print("heavy:", sorted(m for m in ("torch", "mlflow") if m in sys.modules))
"""


def test_a_missing_template_is_one_line_before_torch_or_mlflow_load(tmp_path):
    out = tmp_path / "s.csv"
    done = subprocess.run([sys.executable, "-c", PROBE, "apps.submit_cli", "--template", "organisers.csv", "--out",
                           str(out)], cwd=PROJECT_ROOT, env=store_env(tmp_path), capture_output=True, text=True,
                          timeout=120)  # fmt: skip
    assert one_error(done) == MISSING_TEMPLATE and done.returncode == 1
    assert done.stdout.splitlines()[-1] == "heavy: []"  # refused in the time Python takes to start
    assert list(tmp_path.iterdir()) == []  # no submission, and no store opened


def test_a_malformed_template_is_one_line_before_torch_or_mlflow_load(tmp_path):
    template = tmp_path / "CXRLT_2026_TEST_ALL_TASK2.csv"
    template.write_text("ImageID,StudyDate_DICOM,PatientID\na.png,20140512,3.24E+38\na.png,20140512,3.24E+38")
    done = subprocess.run([sys.executable, "-c", PROBE, "apps.submit_cli", "--template", str(template), "--out",
                           str(tmp_path / "s.zip")], cwd=PROJECT_ROOT, env=store_env(tmp_path), capture_output=True,
                          text=True, timeout=120)  # fmt: skip
    assert one_error(done) == f"error: {template}, line 3: id 'a.png' is listed again (first on line 2)"
    assert done.stdout.splitlines()[-1] == "heavy: []"
    assert sorted(p.name for p in tmp_path.iterdir()) == [template.name]


@pytest.mark.slow
def test_make_submit_with_a_missing_template_is_one_line_and_writes_nothing(tmp_path):
    out = tmp_path / "s.csv"
    done = make("submit", "TEMPLATE=organisers.csv", f"OUT={out}", env=store_env(tmp_path))
    assert one_error(done) == MISSING_TEMPLATE
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_make_score_scores_what_make_submit_wrote(tmp_path):
    """The README's loop: the submission file, as written, is scored against the split it predicted."""
    _, run_id, _ = fabricate_finished_run(tmp_path)
    env = store_env(tmp_path)
    out = tmp_path / "submission.csv"
    submitted = make("submit", f"MODEL={run_id}", f"OUT={out}", env=env)
    assert submitted.returncode == 0, submitted.stderr[-3000:]
    assert out.read_text().split("\n")[0] == TASK1_HEADER  # the organisers' order and spelling, not the platform's
    (hint,) = [line for line in submitted.stderr.splitlines() if line.startswith("score it: make score ")]
    (manifest,) = (tmp_path / "synthetic").glob("*/manifest.csv")
    assert hint == f"score it: make score TASK=task1 PREDICTIONS={out} MANIFEST={manifest} SPLIT=test"
    scored = make("score", f"PREDICTIONS={out}", f"MANIFEST={manifest}", env=env)
    assert scored.returncode == 0, scored.stderr[-3000:]
    lines = scored.stdout.splitlines()
    assert lines[0] == f"{out} on {manifest} [test], 160 images (pooled, resampled within source), 95% bootstrap CIs"
    row, *_ = [line.split() for line in lines if line.split()[:2] == ["1.", "mAP"]]  # pooled, then each centre
    assert 0 < float(row[2]) < 1


@pytest.mark.slow
def test_make_submit_writes_the_upload_zip_for_the_released_test_list(tmp_path):
    """`make submit TEMPLATE=<the Task 1 test list as released> OUT=<zip>`: the CSV on top in the organisers'
    header and the list's row order, ``code/`` with the run's config, the command as typed and the source."""
    from apps.submit import run_manifest  # the run's data, generated as make submit generates it

    client, run_id, _ = fabricate_finished_run(tmp_path)
    manifest, _ = run_manifest(client, run_id)
    table = pd.read_csv(manifest, dtype=str, keep_default_na=False)
    ids = table.loc[table["split"] == "test", "image_id"].sample(frac=1.0, random_state=1).tolist()
    release = tmp_path / "release"
    release.mkdir()
    template = release / "CXRLT_2026_TEST_ALL_TASK1.csv"  # three id columns, 30 empty headers, 30 empty fields
    lines = ["ImageID,StudyDate_DICOM,PatientID" + "," * 30, *(f"{i},20140512,3.24E+38" + "," * 30 for i in ids)]
    template.write_text("\n".join(lines) + "\n")
    out = tmp_path / "upload.zip"
    done = make("submit", f"MODEL={run_id}", f"TEMPLATE={template}", f"OUT={out}", env=store_env(tmp_path))
    assert done.returncode == 0, done.stderr[-3000:]
    with zipfile.ZipFile(out) as archive:
        names = archive.namelist()
        submitted, config = archive.read("upload.csv").decode(), archive.read("code/config.yaml")
        command, source = archive.read("code/COMMAND.txt").decode(), archive.read("code/SOURCE.txt").decode()
    assert submitted.split("\n")[0] == TASK1_HEADER
    assert [line.split(",")[0] for line in submitted.splitlines()[1:]] == ids
    assert [n for n in names if "/" not in n] == ["upload.csv"]
    assert {"code/apps/submission.py", "code/Makefile", "code/pyproject.toml"} <= set(names)
    assert config == Path(client.download_artifacts(run_id, "config.yaml", str(tmp_path))).read_bytes()
    assert command == (
        f'make submit TASK=task1 MODEL="{run_id}" TEMPLATE="{template}" OUT="{out}"\n'
        f"python -m apps.submit_cli --task task1 --model {run_id} --template {template} --out {out}\n"
    )
    assert source.startswith("Source: the working tree's tracked files (git ls-files, HEAD ")
    assert "because the run recorded no commit." in source
    (logged,) = [line for line in done.stderr.splitlines() if line.startswith(f"code/ in {out}: ")]
    assert logged.endswith("because the run recorded no commit")
