"""What a person sees in MLflow 3's UI for the runs this platform writes (`-m browser`, needs Chromium).

The REST API says a run *has* ``test/mAP`` and ``evaluation/per_class.json``; these tests say the UI *shows* them
where docs/evaluation.md ("Comparing runs in the MLflow UI") sends people: the runs table's column picker, the
*Headline metrics* saved view, the *Artifact evaluation* view of the per-class table, and report.html with its
figures. Those rest on UI conventions read from MLflow's JS bundle (evaluation/tables.py), so an MLflow upgrade
that changes them fails here rather than in a user's browser.

The runs are written by :func:`evaluation.evaluate.store` itself, on a small synthetic evaluation, through an
``MlflowClient`` sink: what the UI is given is exactly what a training run logs, without training a model.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
from mlflow import MlflowClient
from mlflow.entities import Metric

from evaluation.evaluate import Evaluation, MetricSet, store
from evaluation.suite import compute_suite
from evaluation.tables import HEADLINE_VIEW_ID, PER_CLASS_TABLE, headline_view_tag
from tests.cdp import Browser, chromium_binary
from tests.conftest import PROJECT_ROOT, free_port, wait_for_http
from training.tracking.run_context import mark_model_training

pytestmark = pytest.mark.browser

LABELS = ["Atelectasis", "Cardiomegaly", "Hernia", "Pleural Effusion"]
ROWS = "document.querySelectorAll('.ag-center-cols-container .ag-row').length"


def _evaluation(seed: int) -> Evaluation:
    rng = np.random.default_rng(seed)
    n = 120
    targets = (rng.random((n, len(LABELS))) < [0.3, 0.2, 0.05, 0.15]).astype(int)
    probs = np.clip(targets * 0.3 + rng.random(targets.shape) * 0.7, 0, 1)
    groups = {"common": [0, 1, 3], "rare": [2]}
    result = compute_suite(targets, probs, LABELS, n_boot=100, seed=0, class_groups=groups,
                           val_thresholds=np.full(len(LABELS), 0.5))  # fmt: skip
    metrics = {f"test/{k}": v for k, v in result.metrics.items() if np.isfinite(v)}
    frame = pd.DataFrame(probs, columns=LABELS).assign(**{f"true/{c}": targets[:, i] for i, c in enumerate(LABELS)})
    return Evaluation({"test": MetricSet("test", probs, result, metrics)}, metrics, {"test": frame}, LABELS, groups,
                      targets.mean(axis=0), {})  # fmt: skip


@pytest.fixture(scope="module")
def tracked(tmp_path_factory):
    """A task experiment marked as training marks it, carrying the headline view's tag, with two finished runs
    written by ``store``."""
    tmp = tmp_path_factory.mktemp("ui")
    uri = f"sqlite:///{tmp}/mlflow.db"
    client = MlflowClient(uri)
    experiment = client.create_experiment("task1", artifact_location=(tmp / "artifacts").as_uri())
    mark_model_training(client, experiment)
    for key, value in headline_view_tag("val/mAP").items():
        client.set_experiment_tag(experiment, key, value)
    runs = {}
    for seed, loss in ((1, "bce"), (2, "asl")):
        run = client.create_run(experiment, run_name=f"resnet18-{loss}-random-s{seed}").info.run_id
        client.log_param(run, "loss.name", loss)
        evaluation = _evaluation(seed)
        work = tmp / run
        store(evaluation,
              lambda metrics, run=run: client.log_batch(run, metrics=_metrics(metrics)),
              lambda folder, path, run=run: client.log_artifacts(run, str(folder), path),
              work, make_plots=True,
              set_tags=lambda tags, run=run: [client.set_tag(run, k, v) for k, v in tags.items()])  # fmt: skip
        client.log_metric(run, "val/mAP_best", 0.5 + seed / 10)
        client.set_terminated(run, "FINISHED")
        runs[loss] = (run, evaluation)
    return uri, experiment, runs


def _metrics(values: dict[str, float]) -> list[Metric]:
    return [Metric(key, float(value), 0, 0) for key, value in values.items()]


@pytest.fixture(scope="module")
def ui(tracked):
    """``mlflow ui`` on the store, in its own process group so that every worker it forks goes with it."""
    uri = tracked[0]
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "mlflow", "ui", "--backend-store-uri", uri, "--host", "127.0.0.1", "--port", str(port)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True,
        env={**os.environ, "MLFLOW_WORKERS": "1", "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"},  # as make ui
    )  # fmt: skip
    try:
        wait_for_http(f"http://127.0.0.1:{port}/health", server, 180, "mlflow ui")
        yield f"http://127.0.0.1:{port}"
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait(timeout=10)


@pytest.fixture
def browser():
    binary = chromium_binary()
    if binary is None:
        pytest.skip("no Chromium on PATH (Debian: apt-get install chromium)")
    browser = Browser(binary, width=1600, height=1000)
    try:
        yield browser
    finally:
        browser.close()


def _close_assistant(browser: Browser) -> None:
    """Close MLflow's assistant panel, which opens on first load and narrows the table: the grid only renders the
    columns in view, so a column pushed off screen is not in the page at all."""
    browser.js("document.querySelector('[data-component-id=\"mlflow.assistant.chat_panel.close\"]')?.click()")


def _headers(browser: Browser) -> list[str]:
    return browser.js("[...new Set([...document.querySelectorAll('[role=columnheader]')]"
                      ".map(e => e.innerText.trim()).filter(Boolean))]")  # fmt: skip


def test_the_address_make_ui_prints_opens_the_model_training_pages(ui, browser):
    recipe = subprocess.run(["make", "-n", "-o", "setup", "-o", ".venv/.installed", "ui"], cwd=PROJECT_ROOT,
                            capture_output=True, text=True, check=True).stdout  # fmt: skip
    (page,) = re.findall(r"MLflow UI: http://127\.0\.0\.1:\d+(\S+)\"", recipe)
    browser.goto(ui + page)
    text = browser.wait_for("document.body.innerText.includes('task1') && document.body.innerText",
                            what="experiment list")  # fmt: skip
    assert "Model registry" in text and "Prompts" not in text  # the sidebar of model training, not of GenAI


def test_the_model_training_switch_makes_the_experiment_link_open_the_runs_table(ui, tracked, browser):
    _, experiment, _ = tracked
    browser.goto(f"{ui}/#/experiments")
    browser.wait_for("document.body.innerText.includes('task1')", what="experiment list")
    browser.click("[...document.querySelectorAll('*')].find(e => e.children.length < 2 && "
                  "e.innerText === 'Model training')")  # fmt: skip
    browser.wait_for("localStorage.getItem('mlflow.workflowType_v1') === '\"machine_learning\"'",
                     what="the switch is remembered by the browser")  # fmt: skip
    browser.click("[...document.querySelectorAll('a')].find(e => e.innerText.trim() === 'task1')")
    browser.wait_for(f"location.hash.startsWith('#/experiments/{experiment}/runs') && {ROWS} === 2",
                     what="runs table after the switch")  # fmt: skip


def test_the_column_picker_finds_test_mAP_and_shows_each_runs_value(ui, tracked, browser):
    _, experiment, runs = tracked
    browser.goto(f"{ui}/#/experiments/{experiment}/runs?workflowType=machine_learning")
    browser.wait_for(f"{ROWS} === 2", what="runs table")
    _close_assistant(browser)
    assert "test/mAP" not in _headers(browser)  # MLflow 3 shows no metric column until one is picked
    browser.click("[...document.querySelectorAll('button')].find(e => e.innerText.trim() === 'Columns')")
    browser.wait_for("!!document.querySelector(\"input[placeholder='Search columns']\")")
    browser.js("document.querySelector(\"input[placeholder='Search columns']\").focus()")
    browser.type_text("test/mAP")
    hits = browser.wait_for("(() => { const t = [...document.querySelectorAll('.du-bois-light-tree-treenode')]"
                            ".map(n => n.innerText.trim()).filter(s => s.startsWith('test/')); "
                            "return t.length ? t : null; })()")  # fmt: skip
    assert hits[0] == "test/mAP" and all(h.startswith("test/mAP") for h in hits)
    browser.js("[...document.querySelectorAll('.du-bois-light-tree-treenode')].find(n => n.innerText.trim() === "
               "'test/mAP').querySelector('.du-bois-light-tree-checkbox').click()")  # fmt: skip
    browser.escape()
    browser.wait_for("[...document.querySelectorAll('[role=columnheader]')].some(e => e.innerText.trim() === "
                     "'test/mAP')", what="test/mAP column")  # fmt: skip
    cells = browser.js("[...document.querySelectorAll('.ag-center-cols-container [col-id*=\"test/mAP\"]')]"
                       ".map(e => e.innerText.trim())")  # fmt: skip
    expected = {str(evaluation.metrics["test/mAP"])[:6] for _, evaluation in runs.values()}
    assert {cell[:6] for cell in cells} == expected  # the grid cuts long numbers short, it does not round them


def test_the_headline_view_opens_with_the_ranking_chain_as_columns(ui, tracked, browser):
    _, experiment, _ = tracked
    browser.goto(f"{ui}/#/experiments/{experiment}/runs?workflowType=machine_learning"
                 f"&viewStateShareKey={HEADLINE_VIEW_ID}")  # fmt: skip
    browser.wait_for(f"{ROWS} === 2", what="runs table in the saved view")
    _close_assistant(browser)
    browser.wait_for("document.body.innerText.includes('Headline metrics')", what="the view's name")
    headers = browser.wait_for("(() => { const h = [...document.querySelectorAll('[role=columnheader]')]"
                               ".map(e => e.innerText.trim()); return h.includes('test/mAP') ? h : null; })()")  # fmt: skip
    assert {"test/mAP", "test/mAP_ci_low", "test/mAP_ci_high", "test/mAUROC"} <= set(headers)
    assert "Sort: val/mAP_best" in browser.js("document.body.innerText")


def test_artifact_evaluation_compares_the_per_class_ap_across_runs(ui, tracked, browser):
    _, experiment, runs = tracked
    browser.goto(f"{ui}/#/experiments/{experiment}/runs?workflowType=machine_learning")
    browser.wait_for(f"{ROWS} === 2", what="runs table")
    browser.js("document.querySelector('input[value=ARTIFACT]').click()")
    controls = browser.wait_for("(() => { const c = [...document.querySelectorAll('button')].map(e => "
                                "e.innerText.replace(/\\n/g, ' ').trim()).filter(t => /^(Table|Group by|Compare):/"
                                ".test(t)); return c.length === 3 ? c : null; })()", what="artifact view controls")  # fmt: skip
    assert controls == [f"Table: {PER_CLASS_TABLE}", "Group by: class", "Compare: test/ap"]
    text = browser.wait_for("document.body.innerText.includes('Hernia') && document.body.innerText")
    for _, evaluation in runs.values():  # each run's AP of the first class, as the table rounds it
        assert f"{evaluation.metrics['test/ap/Atelectasis']:.4f}".rstrip("0") in text


def test_report_html_renders_with_its_figures_embedded(ui, tracked, browser):
    _, experiment, runs = tracked
    run = runs["bce"][0]
    browser.goto(f"{ui}/#/experiments/{experiment}/runs/{run}/artifacts/evaluation/report.html"
                 "?workflowType=machine_learning")  # fmt: skip
    browser.wait_for("!!document.querySelector('iframe[src^=\"blob:\"]')", what="report iframe")
    session = browser.attach_iframe("blob:")
    report = browser.wait_for(
        "(() => { const imgs = [...document.querySelectorAll('img')]; if (!imgs.length || "
        "!imgs.every(i => i.complete && i.naturalWidth > 0)) return null; return {n: imgs.length, "
        "embedded: imgs.filter(i => i.src.startsWith('data:image/png')).length, "
        "sections: [...document.querySelectorAll('h2')].map(h => h.innerText)}; })()",
        what="report figures", session=session,
    )  # fmt: skip
    assert report["n"] >= 4 and report["embedded"] == report["n"]  # no link to a file the viewer cannot follow
    assert {"Headline", "Per class (test)", "Figures"} <= set(report["sections"])
