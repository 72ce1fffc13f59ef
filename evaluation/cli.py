"""Entry point of ``make evaluate RUN=<run id>``: re-run the evaluation of a finished run, into that run."""

from __future__ import annotations

import logging
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

import hydra
import torch
from mlflow import MlflowClient
from omegaconf import DictConfig, OmegaConf

from evaluation.evaluate import evaluate, store
from training.pipeline import build_datamodule, build_model
from training.tracking.session import log_metric_batch
from training.zeroshot.report import report_unseen

log = logging.getLogger(__name__)


@dataclass
class FinishedRun:
    """Writes into an existing run through a plain client (the part of ``TrackingSession`` reports use)."""

    client: MlflowClient
    run_id: str

    def log_metrics(self, metrics: dict[str, float]) -> None:
        log_metric_batch(self.client, self.run_id, metrics)

    def log_artifact(self, path: Path, artifact_path: str | None = None) -> None:
        self.client.log_artifact(self.run_id, str(path), artifact_path)


def evaluate_run(run_id: str, evaluation_cfg: DictConfig, tta_cfg: DictConfig, tracking_uri: str) -> dict[str, float]:
    """Rebuild a run's data and model from its ``config.yaml`` and best checkpoint, evaluate, log into the run.

    The run's own data config is reused, so it is judged on exactly the data it was trained for; the
    evaluation and TTA settings come from the command line. A zero-shot run (``task.unseen``) gets its
    unseen-class report again too, with the transfer its checkpoint chose on validation.
    """
    client = MlflowClient(tracking_uri)
    run = client.get_run(run_id)
    if run.info.status != "FINISHED":
        raise ValueError(f"run {run_id} is {run.info.status}; only finished runs have a best checkpoint to evaluate")
    with tempfile.TemporaryDirectory() as tmp:
        cfg = OmegaConf.load(client.download_artifacts(run_id, "config.yaml", tmp))
        checkpoint = client.download_artifacts(run_id, "checkpoints/best.ckpt", tmp)
        state = torch.load(checkpoint, map_location="cpu", weights_only=True)
    cfg.evaluation, cfg.tta = evaluation_cfg, tta_cfg
    datamodule = build_datamodule(cfg)
    datamodule.prepare_data()
    datamodule.setup("test")
    model = build_model(cfg)
    model.load_state_dict(state["state_dict"])
    if torch.cuda.is_available():
        model = model.cuda()
    result = evaluate(model, datamodule, cfg)
    with tempfile.TemporaryDirectory() as tmp:
        store(
            result,
            lambda metrics: log_metric_batch(client, run_id, metrics),
            lambda folder, path: client.log_artifacts(run_id, str(folder), path),
            Path(tmp),
            cfg.evaluation.plots,
        )
    unseen = report_unseen(model, datamodule, cfg, FinishedRun(client, run_id))
    client.set_tag(run_id, "cxrlt.evaluation", OmegaConf.to_yaml(cfg.evaluation, resolve=True)[:5000])
    return {**result.metrics, **unseen}


@hydra.main(config_path="../configs", config_name="evaluate", version_base="1.3")
def main(cfg: DictConfig) -> None:
    uri = os.environ.get("MLFLOW_TRACKING_URI") or cfg.tracking_uri
    metrics = evaluate_run(str(cfg.run), cfg.evaluation, cfg.tta, uri)
    log.info("run %s re-evaluated: test/mAP %.4f [%.4f, %.4f]", cfg.run, *(metrics.get(k, float("nan"))
             for k in ("test/mAP", "test/mAP_ci_low", "test/mAP_ci_high")))  # fmt: skip


if __name__ == "__main__":
    main()
