"""``make compare``'s table, read back from a real tracking store: mean ± sample std per group, the whole ranking
chain as columns, and unfinished or foreign runs left out."""

from __future__ import annotations

import numpy as np
import pytest
from mlflow import MlflowClient

from apps.compare import COLUMNS, grid_table
from evaluation.report import ranking_chain


@pytest.fixture()
def client(tmp_path):
    return MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")


def add_run(client, experiment_id, loss, metrics, grid="g1", status="FINISHED"):
    run = client.create_run(experiment_id, tags={"cxrlt.grid": grid})
    client.log_param(run.info.run_id, "loss.name", loss)
    for key, value in metrics.items():
        client.log_metric(run.info.run_id, key, value)
    client.set_terminated(run.info.run_id, status)


def test_grid_table_is_mean_and_sample_std_over_seeds_with_the_whole_chain(client):
    experiment = client.create_experiment("task1")
    chain = [f"test/{name}" for name in ranking_chain()]
    add_run(client, experiment, "asl", {key: 0.2 for key in chain})
    add_run(client, experiment, "asl", {key: 0.4 for key in chain})
    add_run(client, experiment, "bce", {"test/mAP": 0.1})
    add_run(client, experiment, "bce", {"test/mAP": 0.9}, status="FAILED")  # unfinished: left out
    add_run(client, experiment, "bce", {"test/mAP": 0.9}, grid="other")  # another grid: left out

    table = grid_table(client, "task1", "g1", "loss.name").set_index("loss.name")

    assert chain == COLUMNS[: len(chain)]  # the ranking chain leads, in chain order
    std = np.std([0.2, 0.4], ddof=1)
    for name in ranking_chain():
        assert table.at["asl", name] == f"0.3000 ± {std:.4f}"
    assert table.at["asl", "runs"] == 2 and table.at["bce", "runs"] == 1
    assert table.at["bce", "mAP"] == "0.1000 ± 0.0000"


def test_an_unknown_grid_or_experiment_is_named(client):
    client.create_experiment("task1")
    with pytest.raises(ValueError, match="no finished runs tagged cxrlt.grid='nope'"):
        grid_table(client, "task1", "nope", "loss.name")
    with pytest.raises(ValueError, match="no MLflow experiment named 'task9'"):
        grid_table(client, "task9", "g1", "loss.name")
