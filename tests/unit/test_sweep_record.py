"""Hydra's multirun.yaml is rewritten without the command line's secrets as soon as a job of the sweep starts."""

from __future__ import annotations

from omegaconf import OmegaConf

from training.tracking.redaction import REDACTED
from training.tracking.sweep_record import RECORD, RedactSweepRecord


def test_the_sweep_record_loses_its_secrets_and_keeps_everything_else(tmp_path):
    record = tmp_path / RECORD
    saved = {"foo": {"hub_token": "tok-in-record-1"}, "model": {"lr": 0.001},
             "hydra": {"sweep": {"dir": "mlruns/sweeps/${now:%Y%m%d}"},
                       "overrides": {"task": ["loss=bce,asl", "+foo.hub_token=tok-in-record-1"]}}}  # fmt: skip
    OmegaConf.save(OmegaConf.create(saved), record)
    job = OmegaConf.create({"hydra": {"mode": "MULTIRUN", "runtime": {"output_dir": str(tmp_path / "0")}}})
    RedactSweepRecord().on_job_start(job, task_function=None)
    text = record.read_text()
    assert "tok-in-record-1" not in text
    rewritten = OmegaConf.to_container(OmegaConf.load(record), resolve=False)
    assert rewritten["foo"]["hub_token"] == REDACTED and rewritten["model"]["lr"] == 0.001
    assert rewritten["hydra"]["overrides"]["task"] == ["loss=bce,asl", f"+foo.hub_token={REDACTED}"]
    assert rewritten["hydra"]["sweep"]["dir"] == "mlruns/sweeps/${now:%Y%m%d}"  # interpolations as written
