"""Entry point of ``make evaluate RUN=<run id>``: re-run the test phase of a finished run, into that run.

The run is looked up in the tracking store before the model stack (torch, Lightning, the data pipeline) is
imported: a mistyped or unfinished run is refused in the seconds the store takes to answer.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import hydra
from omegaconf import DictConfig

from training.config_files import CONFIGS
from training.errors import hydra_user_errors, run_hydra_entry
from training.run_lookup import existing_store_client, finished_run
from training.tracking.uri import resolve_tracking_uri

if TYPE_CHECKING:
    from mlflow import MlflowClient

log = logging.getLogger(__name__)


def evaluate_run(
    run_id: str, evaluation_cfg: DictConfig, tta_cfg: DictConfig, client: MlflowClient
) -> dict[str, float]:
    """Rebuild a run's data and model (:func:`training.runs.load_finished`), run the test phase, log into the run.

    The run's own data config is reused, so it is judged on exactly the data it was trained for; the
    evaluation and TTA settings come from the command line. A zero-shot run gets its unseen-class report again
    too, with the transfer its checkpoint chose on validation.
    """
    import torch
    from omegaconf import OmegaConf

    from evaluation.test_phase import run_test_phase
    from training.pipeline import build_datamodule
    from training.runs import load_finished
    from training.tracking.tracked_run import TrackedRun

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
@hydra_user_errors()  # a refused stored config (UnsafeConfig) or an unknown run (ModelNotFound): UserErrors
def main(cfg: DictConfig) -> None:
    reference = str(cfg.run)  # `run=???` (no RUN given) is refused here, before MLflow is imported
    client = existing_store_client(resolve_tracking_uri(cfg.get("tracking_uri")))  # a missing store is not created
    run, _ = finished_run(reference, client)  # an unknown or unfinished run, before the model stack is imported
    from evaluation.conventions import Conventions, terminal_lines
    from evaluation.headline import logged_headline
    from evaluation.report import summary_lines

    metrics = evaluate_run(reference, cfg.evaluation, cfg.tta, client)
    lines = summary_lines(metrics, metrics, logged_headline(run.data.params))
    lines += terminal_lines(Conventions.from_config(cfg.evaluation), metrics)
    log.info("run %s re-evaluated:\n  %s", reference, "\n  ".join(lines))


if __name__ == "__main__":
    run_hydra_entry(main, "evaluate")
