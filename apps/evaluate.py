"""Entry point of ``make evaluate RUN=<run id>``: re-run the test phase of a finished run, into that run."""

from __future__ import annotations

import logging

import hydra
import torch
from mlflow import MlflowClient
from omegaconf import DictConfig, OmegaConf

from evaluation.report import summary_lines
from evaluation.test_phase import run_test_phase
from training.config_files import CONFIGS
from training.errors import hydra_user_errors, run_hydra_entry
from training.pipeline import build_datamodule
from training.runs import ModelNotFound, load_finished
from training.targets import UnsafeConfig
from training.tracking.tracked_run import TrackedRun
from training.tracking.uri import resolve_tracking_uri, tracking_client

log = logging.getLogger(__name__)


def evaluate_run(
    run_id: str, evaluation_cfg: DictConfig, tta_cfg: DictConfig, client: MlflowClient
) -> dict[str, float]:
    """Rebuild a run's data and model (:func:`training.runs.load_finished`), run the test phase, log into the run.

    The run's own data config is reused, so it is judged on exactly the data it was trained for; the
    evaluation and TTA settings come from the command line. A zero-shot run gets its unseen-class report again
    too, with the transfer its checkpoint chose on validation.
    """
    finished = load_finished(run_id, client)
    cfg = finished.config
    cfg.evaluation, cfg.tta = evaluation_cfg, tta_cfg
    datamodule = build_datamodule(cfg)
    datamodule.prepare_data()
    datamodule.setup("test")
    model = finished.network.cuda() if torch.cuda.is_available() else finished.network
    sink = TrackedRun(client, finished.run_id)  # the training process is long gone: write through a client
    evaluation, unseen = run_test_phase(model, datamodule, cfg, sink)
    sink.set_tags({"cxrlt.evaluation": OmegaConf.to_yaml(cfg.evaluation, resolve=True)[:5000]})
    return {**evaluation.metrics, **(unseen.metrics if unseen else {})}


@hydra.main(config_path=str(CONFIGS), config_name="evaluate", version_base="1.3")
@hydra_user_errors(UnsafeConfig, ModelNotFound)  # a refused stored config or an unknown run: the message says all
def main(cfg: DictConfig) -> None:
    client = tracking_client(resolve_tracking_uri(cfg.get("tracking_uri")))
    metrics = evaluate_run(str(cfg.run), cfg.evaluation, cfg.tta, client)
    log.info("run %s re-evaluated:\n  %s", cfg.run, "\n  ".join(summary_lines(metrics, metrics)))


if __name__ == "__main__":
    run_hydra_entry(main, "evaluate")
