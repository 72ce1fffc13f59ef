"""User errors: which overrides are refused before a run starts, and how entry points report what users cause."""

from __future__ import annotations

import re

import pytest
from hydra.errors import InstantiationException

from training.data.manifest import ManifestError
from training.errors import OverrideError, ReportedError, check_overrides, hydra_user_errors, user_errors


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["loss.gamma_neg=4"], "loss=bce has no setting 'gamma_neg'; it is a setting of loss=asl"),
        (["loss=focal", "loss.gamma_neg=4"], "loss=focal has no setting 'gamma_neg'; it is a setting of loss=asl"),
        (["data=manifest", "data.source.generator.n_train=9"], "it is a setting of data=synthetic (configs/data/"),
        (["data.root=/x"], "data=synthetic has no setting 'root'; it is a setting of data="),  # ``???`` in those
        (["data.image_size=abc"], "data.image_size=abc: expected an integer (the config's value is 128), got 'abc'"),
        (["debug=smoke", "data.image_size=6.5"], "expected an integer (the config's value is 64), got 6.5"),
        (["evaluation.threshold=high"], "evaluation.threshold=high: expected a number"),
        (["loss=asl", "loss.gama_neg=4"], "no setting 'loss.gama_neg'; did you mean 'loss.gamma_neg'?"),
        (["loss=asll"], "loss=asll: no loss called 'asll' (configs/loss/); did you mean 'asl'? choices: asl, bce, "),
        (["task=task3"], "task=task3: no task called 'task3' (configs/task/); did you mean 'task2'? choices: nih14,"),
        (["model=nope"], "no model called 'nope' (configs/model/); choices: convnext_atto, "),
    ],
)
def test_wrong_overrides_are_refused_with_what_to_do(argv, message):
    with pytest.raises(OverrideError, match=re.escape(message)):
        check_overrides("train", argv)


@pytest.mark.parametrize(
    "argv",
    [
        ["loss=asl", "loss.gamma_neg=4"],
        ["trainer.devices=auto"],  # Lightning takes text there, though the config's value is a number
        ["resume=0123abc"],  # true/false or a run id
        ["data.image_size=96", "model.lr=1e-3", "trainer.gradient_clip_val=null"],
        ["+tags.grid=x", "data.subset={train:4}", "data.source.generator.n_train=100"],
        ["-m", "loss=bce,asl", "seed=0,1"],  # sweeps are Hydra's to expand
        ["ema=null", "loss=db_en_margin"],  # no choice, and a choice whose name is a file of the group
        ["not_a_key=1"],  # nothing better to say than Hydra's own message
    ],
)
def test_valid_or_unjudgeable_overrides_pass(argv):
    check_overrides("train", argv)


def _task(error):
    @hydra_user_errors(KeyError)
    def task(cfg):
        raise error

    return task


def test_hydra_entry_reports_user_errors_compactly_and_bugs_in_full():
    with pytest.raises(ReportedError, match="^m.csv: bad$"):
        _task(ManifestError("m.csv: bad"))(None)
    with pytest.raises(ReportedError, match="'declared'"):
        _task(KeyError("declared"))(None)
    wrapped = InstantiationException("Error in call to target")
    wrapped.__cause__ = ManifestError("m.csv: wrapped by instantiate")
    with pytest.raises(ReportedError, match="^m.csv: wrapped by instantiate$"):
        _task(wrapped)(None)
    with pytest.raises(ZeroDivisionError):  # a bug keeps its type and traceback
        _task(ZeroDivisionError("bug"))(None)


def test_argparse_entry_prints_the_message_and_exits_one(capsys, monkeypatch):
    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)
    with pytest.raises(SystemExit) as stop, user_errors(KeyError):
        raise ManifestError("m.csv: line 3, column 'split': 'x' is not one of ...")
    assert stop.value.code == 1
    assert capsys.readouterr().err.startswith("error: m.csv: line 3, column 'split'")
    with pytest.raises(ManifestError), user_errors(debug=True):
        raise ManifestError("kept for --debug")
    with pytest.raises(ValueError, match="a bug"), user_errors(KeyError):
        raise ValueError("a bug")
