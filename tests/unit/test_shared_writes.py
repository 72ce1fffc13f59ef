"""Two runs that start together write rows they share (the experiment's kind tag, the datasets of the experiment):
MLflow looks such a row up, then inserts it, so both can insert and the second fails on the row's key. This is what
failed a tuning trial when two workers' first trials started at the same moment; here the moment is forced."""

from __future__ import annotations

import threading

import pytest
from mlflow.entities import Dataset, DatasetInput
from sqlalchemy import event
from sqlalchemy.engine import Engine

from training.tracking.run_context import EXPERIMENT_KIND, lost_insert_race, mark_model_training, shared_write
from training.tracking.uri import tracking_client


class InsertGate:
    """Holds the first two INSERTs into ``table`` until both are issued, so both writers have looked the row up and
    found nothing: the race, every time."""

    def __init__(self, table: str):
        self.prefix = f"INSERT INTO {table.upper()} "
        self.barrier = threading.Barrier(2, timeout=30)
        self.seen = 0
        self.lock = threading.Lock()

    def __call__(self, conn, cursor, statement, parameters, context, executemany):
        if statement.lstrip().upper().startswith(self.prefix):
            with self.lock:
                self.seen += 1
                first_two = self.seen <= 2
            if first_two:
                self.barrier.wait()


def together(table: str, *writes) -> list[Exception]:
    """Run ``writes`` in threads with their first INSERTs into ``table`` held for each other; their errors."""
    gate, errors = InsertGate(table), []

    def run(write):
        try:
            write()
        except Exception as error:  # noqa: BLE001 - collected for the assertions
            errors.append(error)

    event.listen(Engine, "before_cursor_execute", gate)
    try:
        threads = [threading.Thread(target=run, args=(write,)) for write in writes]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
    finally:
        event.remove(Engine, "before_cursor_execute", gate)
    assert gate.seen >= 2  # both reached the insert: the race happened
    return errors


@pytest.fixture
def client(tmp_path):
    return tracking_client(f"sqlite:///{tmp_path}/mlflow.db")


def _datasets(digest: str) -> list[DatasetInput]:
    return [DatasetInput(Dataset(name="synthetic-train", digest=digest, source_type="local", source="/data"), [])]


def test_two_runs_logging_one_dataset_at_once_both_keep_it(client):
    experiment = client.create_experiment("task1")
    first, second = (client.create_run(experiment).info.run_id for _ in range(2))
    # MLflow's own call, as the platform made it: one of the two runs fails on the dataset's key.
    raw = together("datasets", *(lambda run=run: client.log_inputs(run, datasets=_datasets("a1")) for run in (first, second)))  # fmt: skip
    assert len(raw) == 1 and lost_insert_race(raw[0]), raw

    runs = [client.create_run(experiment).info.run_id for _ in range(2)]
    writes = [lambda run=run: shared_write(lambda: client.log_inputs(run, datasets=_datasets("b2"))) for run in runs]
    assert together("datasets", *writes) == []
    for run in runs:
        assert [(i.dataset.name, i.dataset.digest) for i in client.get_run(run).inputs.dataset_inputs] == [
            ("synthetic-train", "b2")
        ]


def test_two_runs_marking_a_new_experiment_at_once_both_succeed(client):
    experiment = client.create_experiment("task1")
    assert together("experiment_tags", *(lambda: mark_model_training(client, experiment) for _ in range(2))) == []
    assert client.get_experiment(experiment).tags[EXPERIMENT_KIND[0]] == EXPERIMENT_KIND[1]


def test_any_other_error_is_raised_at_once():
    calls = []

    def refused():
        calls.append(1)
        raise ConnectionError("refused")

    with pytest.raises(ConnectionError):
        shared_write(refused)
    assert calls == [1]
