"""`make register` ranks only runs comparable with each other (issue 30, 3).

Tiny fake runs in a tmp store, as training tags them (task, validation-set fingerprint, debug flag), each already
a registered version, so registering only moves the ``champion`` alias and no model has to be built.
"""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
from mlflow import MlflowClient

from apps.registry import register_best
from tests.conftest import PROJECT_ROOT

NAME = "cxrlt-task1"


@pytest.fixture
def store(tmp_path):
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    client = MlflowClient(uri)
    experiment = client.create_experiment("task1", artifact_location=str(tmp_path / "artifacts"))
    client.create_registered_model(NAME)
    made = {}

    def run(key: str, value: float, val_set: str | None = "aaaaaaaaaaaa", debug: bool = False, task: str = "task1",
            status: str = "FINISHED", legacy_debug: bool = False) -> str:  # fmt: skip
        tags = {"task": task}
        if val_set is not None:
            tags["cxrlt.val_fingerprint"] = val_set
            tags["cxrlt.debug"] = str(debug).lower()
        run_id = client.create_run(experiment, start_time=1000 + len(made), tags=tags, run_name=key).info.run_id
        client.log_metric(run_id, "val/mAP_best", value)
        if legacy_debug:  # a smoke run logged before runs were tagged: only its params say so
            client.log_param(run_id, "data.debug_size.train", "320")
        client.set_terminated(run_id, status)
        client.create_model_version(NAME, f"runs:/{run_id}/model", run_id)
        made[key] = run_id
        return run_id

    return {"uri": uri, "client": client, "run": run, "ids": made, "tmp": tmp_path}


def _env(store) -> dict[str, str]:
    return {"MLFLOW_TRACKING_URI": store["uri"], "PATH": "/usr/bin:/bin", "HOME": str(store["tmp"])}


def champion(client: MlflowClient) -> str:
    return client.get_model_version_by_alias(NAME, "champion").run_id


def crown(client: MlflowClient, run_id: str) -> None:
    (version,) = client.search_model_versions(f"name = '{NAME}' and run_id = '{run_id}'")
    client.set_registered_model_alias(NAME, "champion", version.version)


def issue_store(store) -> dict[str, str]:
    """The issue's store: the champion's full runs, a newer smoke run and a newer full run on other data."""
    run = store["run"]
    ids = {"a1": run("a1", 0.30), "a2": run("a2", 0.35)}
    crown(store["client"], ids["a1"])
    ids["smoke"] = run("smoke", 0.90, debug=True)
    ids["old_smoke"] = run("old_smoke", 0.95, val_set=None, legacy_debug=True)
    ids["other"] = run("other", 0.60, val_set="bbbbbbbbbbbb")
    ids["legacy"] = run("legacy", 0.70, val_set=None)
    ids["nih"] = run("nih", 0.80, task="nih14")
    ids["failed"] = run("failed", 0.99, status="FAILED")
    return ids


def test_ranks_the_champions_validation_set_without_debug_runs_and_says_what_it_left_out(store, caplog):
    ids = issue_store(store)
    caplog.set_level("INFO", logger="apps.registry")
    version = register_best(store["client"], "task1", "val/mAP")
    assert version.run_id == ids["a2"] == champion(store["client"])
    assert version.tags["cxrlt.val_fingerprint"] == "aaaaaaaaaaaa" and version.tags["cxrlt.candidates"] == "2"
    text = caplog.text
    assert (f"ranking 2 comparable run(s) by val/mAP (higher is better; the kept checkpoint's val/mAP_best where "
            f"logged), validation set aaaaaaaaaaaa (the champion's, run {ids['a1']}):") in text  # fmt: skip
    assert f"   1. {ids['a2']}  0.3500  a2" in text and f"   2. {ids['a1']}  0.3000  a1" in text
    assert "excluded 6 run(s):" in text
    # the smoke run is newer and scores higher, yet stays out; so does the one only its params mark as debug
    assert f"2 debug run(s) (a debug preset's subset; ARGS=--include-debug ranks them): {ids['old_smoke']}, " \
           f"{ids['smoke']}" in text  # fmt: skip
    assert f"1 on another validation set: {ids['other']}" in text
    assert f"1 without a validation-set fingerprint (logged before runs recorded one; RUN=<id> registers one): " \
           f"{ids['legacy']}" in text  # fmt: skip
    assert f"1 of another task: {ids['nih']}" in text
    assert f"1 unfinished (running, failed or pruned): {ids['failed']}" in text


def test_include_debug_ranks_smoke_runs_of_the_same_validation_set(store):
    ids = issue_store(store)
    assert register_best(store["client"], "task1", "val/mAP", include_debug=True).run_id == ids["smoke"]


def test_without_a_champion_the_newest_runs_validation_set_is_ranked(store, caplog):
    run = store["run"]
    run("a1", 0.30)
    b1, b2 = run("b1", 0.10, val_set="bbbbbbbbbbbb"), run("b2", 0.20, val_set="bbbbbbbbbbbb")
    run("smoke", 0.90, val_set="cccccccccccc", debug=True)  # the newest, but a debug run picks no group
    caplog.set_level("INFO", logger="apps.registry")
    assert register_best(store["client"], "task1", "val/mAP").run_id == b2
    assert f"validation set bbbbbbbbbbbb (the newest run's, {b2})" in caplog.text
    assert b1 in caplog.text


def test_val_set_chooses_another_group_over_the_champions(store):
    ids = issue_store(store)
    assert register_best(store["client"], "task1", "val/mAP", val_set="bbbbbbbbbbbb").run_id == ids["other"]


def test_an_explicit_run_is_registered_and_said_to_be_incomparable_with_the_champion(store, caplog):
    ids = issue_store(store)
    caplog.set_level("INFO", logger="apps.registry")
    assert register_best(store["client"], "task1", "val/mAP", run_id=ids["other"]).run_id == ids["other"]
    assert (f"note: run {ids['other']} is not comparable with the current champion (run {ids['a1']}): validation "
            "set bbbbbbbbbbbb, the champion's aaaaaaaaaaaa") in caplog.text  # fmt: skip


@pytest.mark.e2e
def test_python_m_apps_registry_prints_the_ranking_and_the_exclusions(store):
    ids = issue_store(store)
    done = subprocess.run([sys.executable, "-m", "apps.registry", "--task", "task1"], env=_env(store),
                          cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout + done.stderr
    assert "ranking 2 comparable run(s) by val/mAP" in out and f"   1. {ids['a2']}  0.3500  a2" in out
    assert "2 debug run(s) (a debug preset's subset; ARGS=--include-debug ranks them)" in out
    assert f"{NAME} version 2 (run {ids['a2']}) is now @champion" in out
    assert champion(store["client"]) == ids["a2"]


def test_nothing_comparable_is_one_line_naming_the_exclusions_and_registers_nothing(store):
    smoke = store["run"]("smoke", 0.9, debug=True)
    done = subprocess.run([sys.executable, "-m", "apps.registry", "--task", "task1"], env=_env(store),
                          cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr[-3000:]
    assert ("error: no comparable finished run in experiment 'task1' logged 'val/mAP' (1 run(s) excluded, listed "
            "above)") in done.stderr.splitlines()  # fmt: skip
    assert f"1 debug run(s) (a debug preset's subset; ARGS=--include-debug ranks them): {smoke}" in done.stderr
    assert store["client"].get_registered_model(NAME).aliases == {}  # no champion named, no version added
    assert len(store["client"].search_model_versions(f"name = '{NAME}'")) == 1


@pytest.mark.parametrize(
    ("task", "hint"),
    [("task3", "no task called 'task3' (configs/task/); did you mean 'task2'? choices: "),
     ("nih14", "train first (make train TASK=nih14)")],
)  # fmt: skip
def test_a_missing_experiment_gets_a_hint_that_works_when_typed(store, task, hint):
    with pytest.raises(ValueError, match=rf"^no MLflow experiment '{task}'; {re.escape(hint)}"):
        register_best(store["client"], task, "val/mAP")
