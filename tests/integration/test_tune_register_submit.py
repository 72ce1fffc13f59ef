"""`make tune` -> `make register` -> `make submit` -> `mlflow models serve`, end to end on a smoke-sized study.

One study store for the module: six trials with an aggressive pruner, then a restart with TRIALS=8; the champion
is registered from those trials, a submission is written against a shuffled, re-spelt template, and the served
champion must answer with the same probabilities the submission holds.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np
import optuna
import pandas as pd
import pytest
from mlflow import MlflowClient

from apps.submission import Template, validate_file
from apps.submit import submit
from tests.conftest import PROJECT_ROOT, free_port, stop_process_group, wait_for_http
from tests.tune_support import tune_command
from training.data.findings import TASK1_LABELS
from training.data.label_names import ORGANISER_SPELLING

pytestmark = pytest.mark.e2e  # trains through the real CLI: make test-e2e (docs/development.md)

SMOKE = ("debug=smoke", "data.subset={train:96,val:64,test:32}", "trainer.max_epochs=2", "evaluation.n_boot=20",
         "evaluation.per_source=false")  # fmt: skip


def _run(command: list[str], env: dict, timeout: int = 400) -> subprocess.CompletedProcess:
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    return done


def _children(client: MlflowClient, parent: str) -> dict[int, object]:
    experiment = client.get_experiment_by_name("task1")
    runs = client.search_runs([experiment.experiment_id], filter_string=f"tags.`mlflow.parentRunId` = '{parent}'")
    return {int(run.data.tags["optuna.trial_number"]): run for run in runs}


def _snapshot(tmp: Path, client: MlflowClient) -> dict:
    study = optuna.load_study(study_name="task1-default", storage=f"sqlite:///{tmp}/optuna.db")
    parent = study.user_attrs["mlflow_parent_run_id"]
    return {"trials": study.get_trials(), "parent": parent, "children": _children(client, parent)}


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("tune")
    env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{tmp}/mlflow.db", "PYTHONUNBUFFERED": "1",
           "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false"}  # fmt: skip
    client = MlflowClient(env["MLFLOW_TRACKING_URI"])
    started = time.perf_counter()
    tuned = _run(tune_command(tmp, 6, "pruner=aggressive", *SMOKE), env)
    first = _snapshot(tmp, client)
    first["printed"] = tuned.stdout + tuned.stderr
    first["seconds"] = time.perf_counter() - started
    _run(tune_command(tmp, 8, "pruner=aggressive", *SMOKE), env)
    return {"tmp": tmp, "env": env, "client": client, "first": first, "second": _snapshot(tmp, client)}


def test_six_trials_some_pruned_each_a_child_run_with_its_state(study):
    first, client = study["first"], study["client"]
    trials = first["trials"]
    assert [t.number for t in trials] == list(range(6))
    states = [t.state.name for t in trials]
    assert set(states) <= {"COMPLETE", "PRUNED"} and "PRUNED" in states and "COMPLETE" in states
    children = first["children"]
    assert sorted(children) == list(range(6))
    for trial in trials:
        run = children[trial.number]
        assert run.data.tags["optuna.state"] == trial.state.name
        assert run.info.status == {"COMPLETE": "FINISHED", "PRUNED": "KILLED"}[trial.state.name]
        assert run.data.tags["mlflow.parentRunId"] == first["parent"]
        assert trial.user_attrs["mlflow_run_id"] == run.info.run_id
        for key, value in trial.params.items():  # the sampled values are what the run trained with
            assert run.data.params.get(key, run.data.params.get(f"{key}.name")) == str(value), key  # group: <g>.name
        assert f"-t{trial.number}-" in run.info.run_name  # the trial's number, then the config key's start
        if trial.state.name == "COMPLETE":
            assert run.data.metrics["val/mAP_best"] == pytest.approx(trial.value)
            assert "test/mAP" in run.data.metrics
        else:  # pruned after the epoch it reported; no test, no working checkpoint left behind
            assert "test/mAP" not in run.data.metrics
            assert max(trial.intermediate_values) == int(run.data.tags["optuna.pruned_epoch"])
            assert not (study["tmp"] / "checkpoints" / run.info.run_id).exists()
        history = client.get_metric_history(run.info.run_id, "val/mAP")
        assert [m.step for m in history] == sorted(trial.intermediate_values)  # per-epoch metrics, epoch = step


def test_parent_run_holds_best_value_table_and_plots(study, tmp_path):
    client, second = study["client"], study["second"]
    parent = client.get_run(second["parent"])
    assert parent.info.status == "FINISHED" and parent.data.tags["cxrlt.kind"] == "tuning-study"
    complete = [t for t in second["trials"] if t.state.name == "COMPLETE"]
    best = max(complete, key=lambda t: t.value)
    assert parent.data.metrics["best/val/mAP"] == pytest.approx(best.value)
    assert parent.data.metrics["best/trial"] == best.number and parent.data.metrics["study/n_trials"] == 8
    assert parent.data.tags["best.model.lr"] == str(best.params["model.lr"])
    table = pd.read_csv(client.download_artifacts(parent.info.run_id, "trials.csv", str(tmp_path)))
    assert table["number"].tolist() == list(range(8))
    assert sorted(table["state"]) == sorted(t.state.name for t in second["trials"])
    page = Path(client.download_artifacts(parent.info.run_id, "plots.html", str(tmp_path))).read_text()
    for section in ("optimization_history", "parallel_coordinate", "intermediate_values"):
        assert f'id="plot-{section}"' in page  # an interactive plotly figure, not a picture
    assert page.count("<script") >= 4 and "plotly" in page
    if len(complete) >= 2:  # Optuna needs two complete trials to assess importance; fewer only skips that plot
        assert 'id="plot-param_importances"' in page


def test_restart_with_more_trials_adds_two_to_the_same_study(study):
    first, second = study["first"], study["second"]
    assert second["parent"] == first["parent"]  # the same study, the same parent run
    assert [t.number for t in second["trials"]] == list(range(8))
    assert sorted(second["children"]) == list(range(8))
    for number in range(6):  # the first six are untouched
        assert second["trials"][number].state == first["trials"][number].state
        assert second["children"][number].info.run_id == first["children"][number].info.run_id
    params = [json.dumps(t.params, sort_keys=True) for t in second["trials"]]
    assert len(set(params)) == 8  # the restart drew new points instead of replaying the first ones


def test_the_printed_next_step_is_the_register_command_that_works_on_smoke_trials(study):
    """Smoke trials are debug runs, which make register ranks only with --include-debug: the hint says so, and the
    champion fixture below registers with exactly that option."""
    assert (
        "next: `make register TASK=task1 ARGS=--include-debug` registers the best finished run"
        in study["first"]["printed"]
    )


@pytest.fixture(scope="module")
def champion(study):
    _run([sys.executable, "-m", "apps.registry", "--task", "task1", "--include-debug"], study["env"])  # smoke trials
    client = study["client"]
    return client.get_model_version_by_alias("cxrlt-task1", "champion")


def test_register_picks_the_best_complete_trial(study, champion):
    client = study["client"]
    complete = [t for t in study["second"]["trials"] if t.state.name == "COMPLETE"]
    best = max(complete, key=lambda t: (t.value, -t.number))
    assert str(champion.version) == "1" and champion.run_id == best.user_attrs["mlflow_run_id"]
    assert champion.tags["cxrlt.rank_metric"] == "val/mAP"
    source = client.get_run(champion.run_id)
    assert source.info.status == "FINISHED"  # logging the model into the run left it finished
    # The trial was tested with the plain metric set only; registering gave it the full evaluation first.
    assert {"test_tta/mAP", "test_perturbed/mAP"} <= set(source.data.metrics)
    assert "evaluation/report.html" in [a.path for a in client.list_artifacts(champion.run_id, "evaluation")]
    other = next(r for r in study["second"]["children"].values()
                 if r.info.status == "FINISHED" and r.info.run_id != champion.run_id)  # fmt: skip
    assert "test_tta/mAP" not in client.get_run(other.info.run_id).data.metrics  # only the champion
    # Registering again keeps one version per run: the alias stays, no duplicate.
    _run([sys.executable, "-m", "apps.registry", "--task", "task1", "--include-debug"], study["env"])  # smoke trials
    assert len(client.search_model_versions("name = 'cxrlt-task1'")) == 1


def _manifest(tmp: Path) -> tuple[Path, pd.DataFrame]:
    (path,) = (tmp / "synthetic").glob("*/manifest.csv")
    return path, pd.read_csv(path, dtype=str, keep_default_na=False)


@pytest.fixture(scope="module")
def submission(study, champion):
    tmp = study["tmp"]
    _, manifest = _manifest(tmp)
    ids = manifest.loc[manifest["split"] == "test", "image_id"].sample(frac=1.0, random_state=0).tolist()
    labels = list(TASK1_LABELS)
    columns = [ORGANISER_SPELLING[name] for name in reversed(labels)]
    columns[0] = columns[0].replace(" ", "_").title()  # a spelling variant the organisers might use
    template = tmp / "template.csv"
    pd.DataFrame({"ImageID": ids, **{c: "" for c in columns}}).to_csv(template, index=False)
    out = tmp / "submission.csv"
    _run([sys.executable, "-m", "apps.submit_cli", "--task", "task1", "--template", str(template), "--out", str(out)],
         study["env"])  # fmt: skip
    return {"template": template, "out": out, "ids": ids, "columns": columns}


def test_submission_follows_the_template_and_passes_the_validator(study, champion, submission, tmp_path):
    frame = validate_file(submission["out"], Template.read(submission["template"]))
    assert list(frame.columns) == ["ImageID", *submission["columns"]]
    assert frame["ImageID"].tolist() == submission["ids"]
    values = frame.iloc[:, 1:].astype(float).to_numpy()
    assert values.shape == (160, 30) and ((values >= 0) & (values <= 1)).all() and values.std() > 0
    logged = study["client"].list_artifacts(champion.run_id, "submissions")
    assert "submissions/submission.csv" in [a.path for a in logged]


def test_ensemble_averages_its_members(study, champion, tmp_path):
    client = study["client"]
    other = next(r.info.run_id for r in study["second"]["children"].values()
                 if r.info.status == "FINISHED" and r.info.run_id != champion.run_id)  # fmt: skip
    frames = {}
    for name, models in {"a": [champion.run_id], "b": [other], "ab": [champion.run_id, other]}.items():
        frames[name] = submit(client, models, tmp_path / f"{name}.csv").set_index("ImageID")
    assert frames["ab"].index.tolist() == frames["a"].index.tolist()
    np.testing.assert_allclose(
        frames["ab"].to_numpy(), (frames["a"].to_numpy() + frames["b"].to_numpy()) / 2, atol=1e-12
    )
    assert not np.allclose(frames["a"].to_numpy(), frames["b"].to_numpy())


def _score(base: str, frame: dict) -> list[dict]:
    body = json.dumps({"dataframe_split": frame}).encode()
    request = urllib.request.Request(f"{base}/invocations", body, {"Content-Type": "application/json"})
    return json.load(urllib.request.urlopen(request, timeout=60))["predictions"]


def test_make_serve_scores_an_image_like_the_submission(study, champion, submission):
    tmp = study["tmp"]
    manifest_path, manifest = _manifest(tmp)
    row = manifest[manifest["image_id"] == submission["ids"][0]].iloc[0]
    image = manifest_path.parent / row["path"]
    port = free_port()
    # The command a user types (the Makefile once broke while a test calling mlflow directly passed).
    server = subprocess.Popen(
        ["make", "--no-print-directory", "-C", str(PROJECT_ROOT), "serve", "TASK=task1", f"PORT={port}",
         f"IMAGE_ROOT={manifest_path.parent}"],  # paths are read only under the root the server is given
        env=study["env"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True,
    )  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    try:
        wait_for_http(f"{base}/ping", server, 180, "mlflow models serve")
        (by_path,) = _score(base, {"columns": ["image"], "data": [[str(image)]]})
        (by_bytes,) = _score(
            base, {"columns": ["image_b64"], "data": [[base64.b64encode(image.read_bytes()).decode()]]}
        )
    finally:
        stop_process_group(server)  # make, mlflow and its uvicorn workers: the whole group
    assert list(by_path) == list(TASK1_LABELS)  # one probability per class, in label order
    probs = np.array(list(by_path.values()))
    assert ((probs >= 0) & (probs <= 1)).all()
    np.testing.assert_allclose(probs, list(by_bytes.values()), atol=1e-7)
    submitted = pd.read_csv(submission["out"]).set_index("ImageID").loc[row["image_id"]]
    expected = [submitted[ORGANISER_SPELLING[name] if ORGANISER_SPELLING[name] in submitted else
                          ORGANISER_SPELLING[name].replace(" ", "_").title()] for name in TASK1_LABELS]  # fmt: skip
    np.testing.assert_allclose(probs, expected, atol=1e-6)  # the server answers in JSON, the file at full precision
