"""Entry point of ``make evaluate RUN=<run id>``: re-run the test phase of a finished run, into that run.

``RUN=<run id>:rank<n>`` evaluates the ``n``-th best checkpoint the run kept (``checkpoint.save_top_k``) into a
new run nested under it instead, so the training run keeps the numbers of the checkpoint it selected.

The run is looked up in the tracking store before the model stack (torch, Lightning, the data pipeline) is
imported: a mistyped or unfinished run is refused in the seconds the store takes to answer.
"""

from __future__ import annotations

import contextlib
import logging
from typing import TYPE_CHECKING

import hydra
from omegaconf import DictConfig

from training.config_files import CONFIGS
from training.errors import hydra_user_errors, run_hydra_entry
from training.run_lookup import existing_store_client, finished_run, split_checkpoint
from training.tracking.uri import resolve_tracking_uri

if TYPE_CHECKING:
    from mlflow import MlflowClient

log = logging.getLogger(__name__)

#: On the run a kept checkpoint other than the best is evaluated into: which checkpoint (``<run id>:rank<n>``).
CHECKPOINT_TAG = "cxrlt.checkpoint"


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
    rank = split_checkpoint(run_id)[1]
    # The training process is long gone: write through a client. Another kept checkpoint than the best gets a run
    # of its own, nested under the training's, whose test metrics stay those of the checkpoint it selected.
    with contextlib.ExitStack() as stack:
        if rank == 1:
            sink = TrackedRun(client, finished.run_id)
        else:
            experiment = client.get_run(finished.run_id).info.experiment_id
            tags = {"mlflow.parentRunId": finished.run_id, CHECKPOINT_TAG: f"{finished.run_id}:rank{rank}"}
            sink = stack.enter_context(TrackedRun.start(client, experiment, f"rank{rank}-evaluation", tags))
            log.info("checkpoint rank %d of run %s: evaluated into nested run %s", rank, finished.run_id, sink.run_id)
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
