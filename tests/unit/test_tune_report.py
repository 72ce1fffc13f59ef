"""The study's parent run while two workers report into it: best tags, counts, best history and the printed best.

Two workers are two study handles on one SQLite storage and one MLflow store, as two processes would be. A race
(one worker writes what it read before the other worker's newer state landed) is made deterministic by letting
the other worker act at the first write of the first one.
"""

from __future__ import annotations

import ast
import logging
import re
from pathlib import Path

import optuna
import pytest
from mlflow import MlflowClient
from optuna.distributions import CategoricalDistribution, FloatDistribution

from training.tuning.report import log_best

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
METRIC = "val/mAP"
LDAM = {"loss": "ldam", "loss.max_m": 0.5, "loss.s": 30.0, "model.lr": 0.001}
BCE = {"loss": "bce", "model.lr": 0.002}
SPACE = {"loss": CategoricalDistribution(["bce", "ldam"]), "loss.max_m": FloatDistribution(0.0, 1.0),
         "loss.s": FloatDistribution(1.0, 100.0), "model.lr": FloatDistribution(1e-5, 1.0)}  # fmt: skip
WRITES = ("set_tag", "set_tags", "delete_tag", "log_batch", "log_metric")


@pytest.fixture(autouse=True)
def quiet_optuna():
    previous = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    yield
    optuna.logging.set_verbosity(previous)


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> str:
    """One MLflow store for the module (creating one costs seconds); each test gets its own experiment."""
    return f"sqlite:///{tmp_path_factory.mktemp('mlflow')}/mlflow.db"


@pytest.fixture
def workers(tmp_path, store, request):
    """Two workers' handles on one study, the MLflow client and the study's parent run."""
    url = f"sqlite:///{tmp_path}/optuna.db"
    first = optuna.create_study(storage=url, study_name="s", direction="maximize")
    second = optuna.load_study(storage=url, study_name="s")
    client = MlflowClient(store)
    parent = client.create_run(client.create_experiment(request.node.name)).info.run_id
    return first, second, client, parent


def start(study: optuna.Study, params: dict) -> optuna.Trial:
    """A trial of ``study``'s worker that draws exactly ``params`` (queued, as a retry would be) and is RUNNING."""
    study.enqueue_trial(params)
    trial = study.ask({key: SPACE[key] for key in params})
    trial.set_user_attr("mlflow_run_id", f"run-{trial.number}")
    return trial


class RacedClient:
    """``client`` whose first write lets ``other`` act first: its owner then writes what it read before."""

    def __init__(self, client: MlflowClient, other):
        self._client, self._other = client, other

    def __getattr__(self, name):
        attribute = getattr(self._client, name)
        if name not in WRITES or self._other is None:
            return attribute

        def write(*args, **kwargs):
            other, self._other = self._other, None
            other()
            return attribute(*args, **kwargs)

        return write


def best_tags(client: MlflowClient, run_id: str) -> dict[str, str]:
    return {k: v for k, v in client.get_run(run_id).data.tags.items() if k.startswith("best.")}


def expected_tags(trial: optuna.trial.FrozenTrial) -> dict[str, str]:
    return {**{f"best.{k}": str(v) for k, v in trial.params.items()}, "best.mlflow_run_id": trial.user_attrs["mlflow_run_id"]}  # fmt: skip


def history(client: MlflowClient, run_id: str, key: str) -> list[tuple[int, float]]:
    return sorted((m.step, m.value) for m in client.get_metric_history(run_id, key))


def test_best_tags_of_an_earlier_best_with_more_parameters_are_deleted(workers):
    first, second, client, parent = workers
    ldam = start(first, LDAM)
    first.tell(ldam, 0.3)
    log_best(first, client, parent, METRIC)
    assert best_tags(client, parent) == expected_tags(first.trials[0])

    bce = start(second, BCE)
    second.tell(bce, 0.5)  # the new best has no loss.max_m or loss.s
    log_best(second, client, parent, METRIC)
    assert best_tags(client, parent) == expected_tags(second.trials[1])


def test_a_worker_writing_an_older_best_after_the_newer_one_leaves_the_newer(workers):
    first, second, client, parent = workers
    ldam = start(first, LDAM)
    first.tell(ldam, 0.3)
    bce = start(second, BCE)

    def second_finds_a_new_best():
        second.tell(bce, 0.5)
        log_best(second, client, parent, METRIC)

    # The first worker read the study while trial 0 was best; the second one reports trial 1 before it writes.
    log_best(first, RacedClient(client, second_finds_a_new_best), parent, METRIC)
    assert best_tags(client, parent) == expected_tags(second.trials[1])
    assert client.get_run(parent).data.metrics["best/trial"] == 1


def test_counts_reach_zero_running_once_every_trial_ended(workers):
    first, second, client, parent = workers
    first.tell(start(first, BCE), 0.2)
    running = start(second, LDAM)
    log_best(first, client, parent, METRIC)
    metrics = client.get_run(parent).data.metrics
    assert metrics["study/n_running"] == 1 and metrics["study/n_complete"] == 1

    def second_ends_its_trial():
        second.tell(running, 0.1)
        log_best(second, client, parent, METRIC)

    # Again the first worker's older picture (one trial running) lands last; the newest state must still win.
    log_best(first, RacedClient(client, second_ends_its_trial), parent, METRIC)
    metrics = client.get_run(parent).data.metrics
    counts = {key: metrics[key] for key in metrics if key.startswith("study/n_")}
    assert counts == {"study/n_complete": 2, "study/n_running": 0, "study/n_pruned": 0, "study/n_fail": 0,
                      "study/n_waiting": 0, "study/n_trials": 2}  # fmt: skip


def test_best_history_has_each_step_once_whichever_worker_writes_it(workers):
    first, second, client, parent = workers
    a, b = start(first, BCE), start(second, LDAM)
    first.tell(a, 0.2)
    second.tell(b, 0.4)
    # Both workers report after both trials ended (both see two finished trials), the second one while the
    # first is about to write, and each reports once more when it stops, as write_report does.
    log_best(first, RacedClient(client, lambda: log_best(second, client, parent, METRIC)), parent, METRIC)
    c, d = start(first, BCE), start(second, LDAM)
    first.tell(c, 0.3)
    second.tell(d, 0.6)
    for study in (second, first, second, first):
        log_best(study, client, parent, METRIC)

    assert history(client, parent, f"best/{METRIC}") == [(1, 0.2), (2, 0.4), (3, 0.4), (4, 0.6)]
    assert history(client, parent, "best/trial") == [(1, 0), (2, 1), (3, 1), (4, 3)]


def test_the_printed_best_is_one_trial_as_the_storage_holds_it_while_other_workers_finish(
    tmp_path, store, monkeypatch, caplog
):
    """A worker stops while another worker's five trials still run; they end, each better, while it reports."""
    import training.tune as tune
    from training.tuning.study import PARENT_ATTR

    monkeypatch.setenv("MLFLOW_TRACKING_URI", store)
    url = f"sqlite:///{tmp_path}/optuna.db"
    other = optuna.create_study(storage=url, study_name="task1-default", direction="maximize")
    client = MlflowClient(store)
    other.set_user_attr(PARENT_ATTR, client.create_run(client.create_experiment("task1")).info.run_id)
    running = [start(other, {"model.lr": 0.01 * (k + 1)}) for k in range(5)]  # trials 0-4
    # Once this worker has written its report, every read of the storage lets the other worker end a trial.
    endings = [lambda trial=trial, k=k: other.tell(trial, 0.5 + 0.1 * k) for k, trial in enumerate(running)]

    class Storage:
        def __init__(self, storage):
            self._storage = storage

        def __getattr__(self, name):
            attribute = getattr(self._storage, name)
            if not name.startswith("get_"):
                return attribute

            def read(*args, **kwargs):
                result = attribute(*args, **kwargs)
                if endings:
                    endings.pop(0)()
                return result

            return read

    write_report = tune.write_report

    def report_then_race(study, *args):
        written = write_report(study, *args)
        study._storage = Storage(study._storage)
        return written

    class Objective:  # this worker's trials 5 and 6, without training
        def __init__(self, *args, **kwargs):
            pass

        def __call__(self, trial):
            trial.suggest_float("model.lr", 1e-5, 1.0)
            return 0.2 if trial.number == 5 else 0.1

    monkeypatch.setattr(tune, "write_report", report_then_race)
    monkeypatch.setattr(tune, "Objective", Objective)
    with caplog.at_level(logging.INFO, logger="training.tune"):
        tune.run_study(_tune_config(tmp_path, url, trials=7), [], compose=None)

    (line,) = [r.getMessage() for r in caplog.records if r.getMessage().startswith("best ")]
    found = re.fullmatch(r"best val/mAP ([\d.]+) \(trial (\d+)\)(.*?): (\{.*\})", line)
    assert found, line
    value, number, standing, params = float(found[1]), int(found[2]), found[3], ast.literal_eval(found[4])
    trial = other.trials[number]
    assert trial.state == optuna.trial.TrialState.COMPLETE
    assert (round(trial.value, 4), trial.params) == (value, params), line  # value, number and params of one trial
    # It was the best when it was read: each trial that beats it was still running then, as the line says.
    still_running = int(re.search(r"(\d+) trials? still running", standing)[1]) if standing else 0
    better = [t for t in other.trials if t.state == optuna.trial.TrialState.COMPLETE and t.value > trial.value]
    assert len(better) <= still_running, line


def _tune_config(tmp_path, storage: str, trials: int):
    from hydra import compose, initialize_config_dir

    overrides = [f"tune.storage={storage}", f"tune.trials={trials}", f"tracking.artifact_root={tmp_path}/artifacts",
                 f"tracking.checkpoint_root={tmp_path}/checkpoints"]  # fmt: skip
    with initialize_config_dir(str(CONFIGS), version_base="1.3"):
        return compose("tune", overrides=overrides)


def test_a_worker_deleting_a_tag_the_other_already_deleted_goes_on(workers):
    """Both workers see the new best and drop the old best's extra tags; the slower one finds them gone."""
    first, second, client, parent = workers
    ldam = start(first, LDAM)
    first.tell(ldam, 0.3)
    log_best(first, client, parent, METRIC)
    bce = start(second, BCE)
    second.tell(bce, 0.5)  # the new best has no loss.max_m or loss.s: their tags must go

    class DeleteRaced(RacedClient):  # the second worker acts just before the first one's first deletion
        def __getattr__(self, name):
            return super().__getattr__(name) if name == "delete_tag" else getattr(self._client, name)

    log_best(first, DeleteRaced(client, lambda: log_best(second, client, parent, METRIC)), parent, METRIC)
    assert best_tags(client, parent) == expected_tags(second.trials[1])
