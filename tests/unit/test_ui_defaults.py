"""What `make ui` starts and what its Headline metrics view shows, without a browser (`-m browser` for the rest:
tests/integration/test_ui_browser.py)."""

from __future__ import annotations

import json
import subprocess

import click
from mlflow.cli import server
from mlflow.environment_variables import MLFLOW_SERVER_ENABLE_JOB_EXECUTION

from evaluation.tables import headline_view_tag
from tests.conftest import PROJECT_ROOT
from training.tracking.run_context import DEBUG_TAG, mark_model_training
from training.tracking.uri import tracking_client

UI_ADDRESS = "/#/experiments?workflowType=machine_learning"


def _recipe_line(marker: str, *variables: str) -> str:
    """The line of `make -n ui` that holds ``marker`` (setup taken as up to date)."""
    done = subprocess.run(["make", "--no-print-directory", "-n", "-o", "setup", "-o", ".venv/.installed", "ui",
                           *variables], cwd=PROJECT_ROOT, capture_output=True, text=True, check=True)  # fmt: skip
    (line,) = [line for line in done.stdout.splitlines() if marker in line]
    return line


def _environment_of_ui(**ambient: str) -> dict[str, str]:
    """The variables `make ui`'s recipe hands `mlflow ui`, the recipe's prefix run by bash with ``env`` instead."""
    prefix = _recipe_line("mlflow ui").split(" .venv/bin/mlflow ui ", 1)[0]
    done = subprocess.run(["bash", "-c", f"{prefix} env"], env=ambient, capture_output=True, text=True, check=True)
    return dict(line.split("=", 1) for line in done.stdout.splitlines() if "=" in line)


def test_make_ui_starts_one_worker_and_no_job_runner_unless_asked():
    option = next(p for p in server.params if isinstance(p, click.Option) and p.name == "workers")
    workers, jobs = option.envvar, MLFLOW_SERVER_ENABLE_JOB_EXECUTION.name  # the names this MLflow reads
    default = _environment_of_ui()
    assert (default[workers], default[jobs]) == ("1", "false")
    asked = _environment_of_ui(**{workers: "4", jobs: "true"})
    assert (asked[workers], asked[jobs]) == ("4", "true")


def test_make_ui_prints_the_address_of_the_training_view():
    line = _recipe_line("MLflow UI:", "PORT=5123")
    assert f"http://127.0.0.1:5123{UI_ADDRESS}" in line


def _columns(**kwargs) -> list[str]:
    ((_, envelope),) = headline_view_tag("val/mAP", **kwargs).items()
    return json.loads(json.loads(envelope)["state"])["selectedColumns"]


def test_the_headline_view_puts_each_test_figures_interval_beside_it():
    columns = _columns()
    for key in ("test/mAP", "test/mAUROC", "test/mRecall", "test_perturbed/mAP", "heldout/mAP"):
        at = columns.index(f"metrics.`{key}`")
        assert columns[at + 1 : at + 3] == [f"metrics.`{key}_ci_low`", f"metrics.`{key}_ci_high`"]
    assert "metrics.`val/mAP_best_ci_low`" not in columns  # the checkpoint's validation score has no interval
    assert len(columns) == 2 + 8 * 3  # Dataset, the selection metric, 6 chain metrics + 2 mAPs with their CIs


def test_the_headline_view_shows_whether_a_run_was_a_debug_run():
    assert f"tags.`{DEBUG_TAG}`" in _columns(tags=[DEBUG_TAG])
    assert not any(c.startswith("tags.") for c in _columns())


def test_an_experiment_saved_with_an_older_headline_view_gets_the_current_one(tmp_path):
    client = tracking_client(f"sqlite:///{tmp_path}/mlflow.db")
    experiment = client.create_experiment("task1")
    ((key, current),) = headline_view_tag("val/mAP", now_ms=2_000).items()
    state = json.loads(json.loads(current)["state"])
    older = {**state, "selectedColumns": [c for c in state["selectedColumns"] if "_ci_" not in c]}
    client.set_experiment_tag(experiment, key, json.dumps({"name": "Headline metrics", "state": json.dumps(older)}))
    mark_model_training(client, experiment, {key: current})
    assert client.get_experiment(experiment).tags[key] == current
    mark_model_training(client, experiment, headline_view_tag("val/mAP", now_ms=3_000))  # same columns, later
    assert client.get_experiment(experiment).tags[key] == current  # kept: its creation time stays the first one
