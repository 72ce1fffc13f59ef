"""Search-space parsing and sampling: known distributions, conditional parameters, overrides, bad declarations."""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest
from omegaconf import OmegaConf
from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

from training.tuning.space import SearchSpace, SearchSpaceError, parse_distribution, to_overrides
from training.tuning.trial_run import merge_overrides, train_config

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


@pytest.mark.parametrize(
    ("text", "kind", "args"),
    [
        ("log_uniform(1e-5, 1e-2)", "log_uniform", (1e-5, 1e-2)),
        ("uniform(0, 0.5)", "uniform", (0, 0.5)),
        ("int(1, 8)", "int", (1, 8)),
        ("int(16, 64, 16)", "int", (16, 64, 16)),
        ("quniform(0.1, 0.9, 0.2)", "quniform", (0.1, 0.9, 0.2)),
        ("choice(asl, ldam, db)", "choice", ("asl", "ldam", "db")),
        (" choice( 32 , 64 ) ", "choice", (32, 64)),
    ],
)
def test_parse_known_distributions(text, kind, args):
    parsed = parse_distribution(text)
    assert parsed.kind == kind and parsed.args == args
    assert all(type(a) is type(b) for a, b in zip(parsed.args, args, strict=True))  # 1e-5 is a float, 1 an int


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("log_uniform(1e-5, 1e-2)", FloatDistribution(1e-5, 1e-2, log=True)),
        ("uniform(0, 0.5)", FloatDistribution(0.0, 0.5)),
        ("quniform(0.1, 0.9, 0.2)", FloatDistribution(0.1, 0.9, step=0.2)),
        ("int(16, 64, 16)", IntDistribution(16, 64, step=16)),
        ("log_int(1, 128)", IntDistribution(1, 128, log=True)),
        ("choice(asl, ldam, db)", CategoricalDistribution(["asl", "ldam", "db"])),
    ],
)
def test_each_distribution_becomes_the_matching_optuna_distribution(text, expected):
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    trial = study.ask()
    value = parse_distribution(text).suggest(trial, "x")
    assert trial.distributions["x"] == expected
    assert expected._contains(expected.to_internal_repr(value))


def test_log_uniform_draws_stay_in_range_and_spread_over_decades():
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=1))
    draws = [parse_distribution("log_uniform(1e-5, 1e-1)").suggest(study.ask(), "lr") for _ in range(400)]
    assert all(1e-5 <= d <= 1e-1 for d in draws)
    below = sum(d < 1e-3 for d in draws) / len(draws)
    assert 0.4 < below < 0.6  # half the log range lies below 1e-3; a linear draw would put ~1% there


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("normal(0, 1)", "unknown distribution 'normal'"),
        ("uniform(0)", "bad arguments"),
        ("uniform(0, 1, 2, 3)", "bad arguments"),
        ("1e-3", "is not a distribution"),
    ],
)
def test_bad_declarations_are_named(text, message):
    with pytest.raises(SearchSpaceError, match=message) as error:
        parse_distribution(text, "model.lr")
    assert "model.lr" in str(error.value)


SPACE = {
    "params": {"model.lr": "log_uniform(1e-4, 1e-2)", "loss": "choice(bce, asl, ldam)"},
    "conditional": {"loss": {"asl": {"loss.gamma_neg": "uniform(1, 6)"}, "ldam": {"loss.max_m": "uniform(0.2, 0.8)"}}},
}


def test_conditional_parameters_only_with_their_option():
    space = SearchSpace.from_config(OmegaConf.create(SPACE))
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    seen = set()
    for _ in range(30):
        values = space.sample(study.ask())
        seen.add(values["loss"])
        extra = set(values) - {"model.lr", "loss"}
        assert extra == {"bce": set(), "asl": {"loss.gamma_neg"}, "ldam": {"loss.max_m"}}[values["loss"]]
        assert list(values)[:2] == ["model.lr", "loss"]  # parents before their children
    assert seen == {"bce", "asl", "ldam"}


def test_conditional_on_an_unknown_option_or_a_non_choice_is_rejected():
    bad_option = {**SPACE, "conditional": {"loss": {"focal": {"loss.gamma": "uniform(0, 3)"}}}}
    with pytest.raises(SearchSpaceError, match="focal"):
        SearchSpace.from_config(bad_option)
    not_choice = {**SPACE, "conditional": {"model.lr": {"0.1": {"loss.gamma": "uniform(0, 3)"}}}}
    with pytest.raises(SearchSpaceError, match="not a choice"):
        SearchSpace.from_config(not_choice)


def test_shipped_search_spaces_parse_and_sample():
    for path in sorted((CONFIGS / "hparams_search").glob("*.yaml")):
        space = SearchSpace.from_config(OmegaConf.load(path))
        values = space.sample(optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0)).ask())
        assert set(space.params) <= set(values), path.name


def test_overrides_keep_exact_values_and_the_search_space_wins():
    overrides = to_overrides({"model.lr": 0.000123456789, "loss": "asl", "loss.clip": 0.0, "flag": True})
    assert overrides == ["model.lr=0.000123456789", "loss=asl", "loss.clip=0.0", "flag=true"]
    merged = merge_overrides(["debug=smoke", "loss=bce", "+tags.x=1"], overrides)
    assert merged == ["debug=smoke", "+tags.x=1", *overrides]


def test_trial_config_checkpoints_on_the_objective_and_drops_study_keys():
    cfg = OmegaConf.create({"tune": {"metric": "val/x"}, "hparams_search": {}, "pruner": {}, "run_name": "${name}-s1",
                            "name": "m", "checkpoint": {"monitor": "val/mAP", "mode": "max"}})  # fmt: skip
    trial_cfg = train_config(cfg, "val/loss", "minimize", "m-s1-t3")
    assert set(trial_cfg) == {"run_name", "name", "checkpoint"}
    assert trial_cfg.checkpoint.monitor == "val/loss" and trial_cfg.checkpoint.mode == "min"
    assert trial_cfg.run_name == "m-s1-t3"
