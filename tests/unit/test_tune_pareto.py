"""Multi-objective tuning: objectives and their directions, the Pareto front, its report, and register's rule.

The study tests run the real ``run_study`` (storage, parent run, report, resume) with the training replaced by a
table of hand-made objective values, so the front and the pick are known by hand.
"""

from __future__ import annotations

import logging
import math
import os
import subprocess
from pathlib import Path

import optuna
import pandas as pd
import pytest
from hydra import compose, initialize_config_dir
from mlflow import MlflowClient

from evaluation.metric_registry import SUITE, SuiteMetric, class_ap
from training.tuning.front_choice import FRONT_TAG, FrontRun, choose_from_front, utopia_choice
from training.tuning.goals import Goal, ObjectiveError, parse_goals
from training.tuning.pareto import front
from training.tuning.trial_run import RUN_ATTR

PROJECT = Path(__file__).resolve().parents[2]
CONFIGS = PROJECT / "configs"
MAX, MIN = "maximize", "minimize"
AP_ECE = ("val/mAP", "val/mECE")
#: Trial number -> (val/mAP, val/mECE). Front of the first six: 0, 1, 3, 5 (2 is dominated by 1, 4 by 0).
#: Trials 6 and 7 come with the restart: 6 dominates 5, 7 joins the front.
VALUES = {0: (0.30, 0.10), 1: (0.40, 0.20), 2: (0.35, 0.25), 3: (0.20, 0.05), 4: (0.25, 0.12), 5: (0.45, 0.30),
          6: (0.46, 0.29), 7: (0.19, 0.04)}  # fmt: skip


@pytest.fixture(autouse=True)
def quiet_optuna():
    previous = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    yield
    optuna.logging.set_verbosity(previous)


# --- objectives ----------------------------------------------------------------------------------------------------


def test_directions_come_from_the_metric_registry():
    names = ["val/mAP", "val/mECE", "val/group/rare/mAP", "val/proxy_ood_mAP", "val/ECE_pooled"]
    goals = parse_goals(names)
    expected = [SUITE[n].higher_is_better for n in ("mAP", "mECE", "mAP", "mAP", "ECE_pooled")]
    assert [g.metric for g in goals] == names
    assert [g.direction == MAX for g in goals] == expected == [True, False, True, True, False]
    toy = SuiteMetric("mToyLoss", "Toy", class_ap, key="toy_loss", higher_is_better=False)
    with SUITE.registered(toy):  # a metric added to the registry is an objective at once, with its direction
        assert parse_goals(["val/mAP", "val/group/common/mToyLoss"])[1] == Goal("val/group/common/mToyLoss", MIN)
    with pytest.raises(ObjectiveError, match="mToyLoss"):
        parse_goals(["val/mAP", "val/mToyLoss"])


@pytest.mark.parametrize(
    ("names", "message"),
    [
        (["val/mAP", "val/group/tail/mAP"], r"unknown metric 'val/group/tail/mAP': groups are normal, common, .*"
                                            r"close names: .*val/group/rare/mAP"),
        (["val/mAPP", "val/mECE"], r"unknown metric 'val/mAPP'.* close names: val/mAP"),
        (["test/mAP", "val/mECE"], r"'test/mAP': an objective is a validation metric"),
        (["val/mAP", "val/mAP"], r"val/mAP given more than once"),
        (["val/mAP"], r"one objective; give two or more"),
    ],
)  # fmt: skip
def test_a_bad_objective_list_is_one_message_naming_it(names, message):
    with pytest.raises(ObjectiveError, match=message):
        parse_goals(names)


# --- the front and the rule ----------------------------------------------------------------------------------------


def _study(values: dict[int, tuple[float, ...]], directions=(MAX, MIN)) -> optuna.Study:
    study = optuna.create_study(directions=list(directions))
    for number, point in values.items():
        study.add_trial(optuna.create_trial(values=list(point), user_attrs={RUN_ATTR: f"run-{number}"}))
    study.add_trial(optuna.create_trial(state=optuna.trial.TrialState.FAIL))  # never on a front
    return study


def test_the_front_is_the_non_dominated_complete_trials():
    rows = front(_study({k: VALUES[k] for k in range(6)}))
    assert [r.number for r in rows] == [0, 1, 3, 5]
    assert [r.run_id for r in rows] == ["run-0", "run-1", "run-3", "run-5"]
    assert rows[1].values == VALUES[1]
    # the direction matters: minimising both, (0.20, 0.05) dominates every other point of the six
    assert [r.number for r in front(_study({k: VALUES[k] for k in range(6)}, (MIN, MIN)))] == [3]


def _runs(points: dict[int, tuple[float, ...]]) -> list[FrontRun]:
    return [FrontRun(f"run-{k}", k, v) for k, v in points.items()]


def test_the_rule_picks_the_trial_nearest_the_utopia_point():
    # front a (0.5, 0.2), b (0.4, 0.1), e (0.6, 0.4), mAP up, ECE down: normalised a (0.5, 2/3), b (0, 1), e (1, 0)
    choice = utopia_choice(_runs({0: (0.5, 0.2), 1: (0.4, 0.1), 4: (0.6, 0.4)}), parse_goals(AP_ECE), "val/mAP")
    assert choice.picked.trial == 0
    assert choice.normalised["run-0"] == pytest.approx((0.5, 2 / 3))
    assert choice.distance == pytest.approx({"run-0": math.hypot(0.5, 1 / 3), "run-1": 1.0, "run-4": 1.0})
    picked = [line for line in choice.lines(parse_goals(AP_ECE)) if line.endswith("<- picked")]
    assert len(picked) == 1 and "run-0" in picked[0]


def test_ties_go_to_the_selection_metric_in_its_direction_then_the_earlier_trial():
    goals = parse_goals(AP_ECE)
    ends = _runs({2: (0.5, 0.3), 1: (0.3, 0.1)})  # two ends of a front: both at distance 1
    assert utopia_choice(ends, goals, "val/mAP").picked.trial == 2  # higher mAP
    assert utopia_choice(ends, goals, "val/mECE").picked.trial == 1  # lower ECE
    assert utopia_choice(ends, goals, "val/proxy_ood_mAP").tie_metric == "val/mAP"  # not an objective: the first
    same = _runs({3: (0.4, 0.2), 1: (0.4, 0.2)})
    assert utopia_choice(same, goals).picked.trial == 1  # constant objectives normalise to 1: all tied
    assert utopia_choice(same, goals).distance == {"run-3": 0.0, "run-1": 0.0}


# --- the study, end to end without training -----------------------------------------------------------------------


class TableObjective:
    """Stands in for :class:`training.tuning.trial_run.Objective`: a run per trial, nested under the parent, with
    the values of :data:`VALUES` logged as the kept checkpoint's (``<metric>_best``)."""

    def __init__(self, compose, overrides, space, metric, direction, parent, study_name, worker=0, goals=None):
        self.parent, self.goals = parent, goals

    def __call__(self, trial):
        trial.suggest_float("model.lr", 1e-5, 1.0)
        client = MlflowClient(os.environ["MLFLOW_TRACKING_URI"])  # not a URI another test set globally
        run = client.create_run(client.get_experiment_by_name("task1").experiment_id,
                                tags={"mlflow.parentRunId": self.parent, "optuna.trial_number": str(trial.number)})  # fmt: skip
        values = VALUES[trial.number]
        for goal, value in zip(self.goals, values, strict=True):
            client.log_metric(run.info.run_id, f"{goal.metric}_best", value)
        client.set_terminated(run.info.run_id, "FINISHED")
        trial.set_user_attr(RUN_ATTR, run.info.run_id)
        return values


def _config(tmp_path: Path, trials: int, objectives=AP_ECE, *extra: str):
    overrides = [f"tune.storage=sqlite:///{tmp_path}/optuna.db", f"tune.trials={trials}", "tune.study=s-pareto",
                 f"tracking.artifact_root={tmp_path}/artifacts", f"tracking.checkpoint_root={tmp_path}/checkpoints",
                 *extra]  # fmt: skip
    if objectives:
        overrides.append(f"tune.objectives=[{','.join(objectives)}]")
    with initialize_config_dir(str(CONFIGS), version_base="1.3"):
        return compose("tune", overrides=overrides)


@pytest.fixture(scope="module")
def tuned(tmp_path_factory):
    """Six trials, PRUNER=median (the default); the tests below use the study in order (the last one resumes it)."""
    import training.tune as tune

    tmp = tmp_path_factory.mktemp("pareto")
    patch = pytest.MonkeyPatch()
    patch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp}/mlflow.db")
    patch.setattr(tune, "Objective", TableObjective)
    lines: list[str] = []
    handler = logging.Handler(logging.INFO)
    handler.emit = lambda record: lines.append(record.getMessage())
    logger, level = logging.getLogger("training"), logging.getLogger("training").level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        study = tune.run_study(_config(tmp, 6), [], compose=None)
        yield {"tune": tune, "study": study, "client": MlflowClient(f"sqlite:///{tmp}/mlflow.db"), "tmp": tmp,
               "log": "\n".join(lines), "parent": study.user_attrs["mlflow_parent_run_id"]}  # fmt: skip
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
        patch.undo()


def _front_tags(client: MlflowClient, study: optuna.Study) -> dict[int, str]:
    return {t.number: client.get_run(t.user_attrs[RUN_ATTR]).data.tags.get(FRONT_TAG) for t in study.trials}


def test_a_multi_objective_study_logs_its_front_and_register_picks_by_the_rule(tuned, tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tuned['tmp']}/mlflow.db")
    study, client, parent = tuned["study"], tuned["client"], tuned["parent"]
    assert [d.name for d in study.directions] == ["MAXIMIZE", "MINIMIZE"]  # mECE: lower is better (registry)
    assert isinstance(study.pruner, optuna.pruners.NopPruner)
    assert "pruner MedianPruner is not used: Optuna cannot prune a multi-objective trial" in tuned["log"]
    run = client.get_run(parent)
    assert run.info.status == "FINISHED" and run.data.metrics["pareto/n_front"] == 4
    assert run.data.tags["cxrlt.objectives"] == '[["val/mAP", "maximize"], ["val/mECE", "minimize"]]'
    table = pd.read_csv(client.download_artifacts(parent, "pareto_front.csv", str(tmp_path)))
    assert table["trial"].tolist() == [0, 1, 3, 5]
    assert table["mlflow_run_id"].tolist() == [study.trials[k].user_attrs[RUN_ATTR] for k in (0, 1, 3, 5)]
    assert table[["val/mAP", "val/mECE"]].to_numpy().tolist() == [list(VALUES[k]) for k in (0, 1, 3, 5)]
    artifacts = {a.path for a in client.list_artifacts(parent)}
    assert {"pareto_front.png", "pareto_front.json", "trials.csv", "plots.html"} <= artifacts
    page = Path(client.download_artifacts(parent, "plots.html", str(tmp_path))).read_text()
    assert 'id="plot-pareto_front"' in page
    assert _front_tags(client, study) == {0: "true", 1: "true", 2: "false", 3: "true", 4: "false", 5: "true"}
    assert "Pareto front: 4 trial(s)" in tuned["log"] and "ARGS=--pareto-front" in tuned["log"]

    said = []
    # normalised over the front: 0 -> (0.4, 0.8), 1 -> (0.8, 0.4), 3 -> (0, 1), 5 -> (1, 0): 0 and 1 tie at
    # sqrt(0.4); the task's selection metric val/mAP breaks it for trial 1
    picked = choose_from_front(client, "task1", "val/mAP", say=said.append)
    assert picked == study.trials[1].user_attrs[RUN_ATTR]
    assert said[-1].startswith(f"picked trial 1 (run {picked}): the smallest distance, 0.632, tied with 1")


def test_make_register_pareto_front_registers_the_rules_pick(tuned, monkeypatch):
    import apps.registry as registry

    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tuned['tmp']}/mlflow.db")
    asked = {}

    class Version:
        name, version, run_id = "cxrlt-task1", "1", "r"

    def register_best(client, task, metric, experiment, run_id, *args, **kwargs):
        asked.update(task=task, metric=metric, run_id=run_id)
        return Version()

    monkeypatch.setattr(registry, "register_best", register_best)
    registry.main(["--task", "task1", "--pareto-front", "--include-debug"])
    assert asked == {"task": "task1", "metric": "val/mAP", "run_id": tuned["study"].trials[1].user_attrs[RUN_ATTR]}


def test_the_restart_resumes_the_study_and_moves_the_front_tags(tuned, monkeypatch):
    tune, client, tmp = tuned["tune"], tuned["client"], tuned["tmp"]
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp}/mlflow.db")
    monkeypatch.setattr(tune, "Objective", TableObjective)
    study = tune.run_study(_config(tmp, 8), [], compose=None)
    assert len(study.trials) == 8 and study.user_attrs["mlflow_parent_run_id"] == tuned["parent"]
    assert _front_tags(client, study) == {0: "true", 1: "true", 2: "false", 3: "true", 4: "false", 5: "false",
                                          6: "true", 7: "true"}  # fmt: skip  # 6 dominates 5
    with pytest.raises(ObjectiveError, match=r"exists with objectives \[\['val/mAP', 'maximize'\], .* choose another"):
        tune.run_study(_config(tmp, 9, ("val/mAP", "val/mAUROC")), [], compose=None)
    with pytest.raises(ObjectiveError, match="not a single objective"):
        tune.run_study(_config(tmp, 9, None), [], compose=None)


def test_an_unknown_objective_is_refused_before_a_study_or_run_exists(tmp_path):
    import training.tune as tune

    with pytest.raises(ObjectiveError, match="unknown metric 'val/group/tail/mAP'"):
        tune.run_study(_config(tmp_path, 2, ("val/mAP", "val/group/tail/mAP")), [], compose=None)
    assert not list(tmp_path.iterdir())  # no study storage, no tracking store


@pytest.mark.slow
def test_make_tune_with_an_unknown_objective_is_one_line_and_starts_nothing(tmp_path):
    env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path}/mlflow.db"}
    done = subprocess.run(["make", "--no-print-directory", "-C", str(PROJECT), "tune", "TRIALS=2",
                           "OBJECTIVES=val/mAP val/group/tail/mAP", f"STORAGE=sqlite:///{tmp_path}/optuna.db"],
                          env=env, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.returncode == 1
    assert "tune.objectives: unknown metric 'val/group/tail/mAP'" in done.stderr, done.stderr[-2000:]
    assert "close names: " in done.stderr and "Traceback" not in done.stderr
    assert not list(tmp_path.iterdir())  # no study storage, no tracking store
