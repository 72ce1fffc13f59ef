"""One training, end to end: data, model, tracked fit, test on the best checkpoint, artifacts."""

from __future__ import annotations

import logging
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import lightning.pytorch as L
from hydra.utils import instantiate
from lightning.pytorch.callbacks import ModelCheckpoint
from omegaconf import DictConfig, OmegaConf, open_dict

from evaluation.conventions import terminal_lines
from evaluation.headline import headline_of
from evaluation.report import summary_lines
from evaluation.test_phase import run_test_phase
from training.checkpoint_io import AtomicCheckpointIO
from training.components import build_component
from training.console import console_callbacks, quiet_lightning
from training.data.datamodule import CXRDataModule
from training.data.images import MAX_PIXELS
from training.data.sources import task_labels
from training.distributed import forget_shared, process_of, share_from_rank_zero
from training.errors import UserError
from training.interrupts import PROCESS_TAG, RESUME_TAG, Interrupted, this_process
from training.models.factory import model_from_config
from training.models.module import MultiLabelClassifier
from training.top_checkpoints import Kept, kept_checkpoints, rank_predictions, upload_kept
from training.tracking.redaction import redact_tags
from training.tracking.run_context import record_context, start_system_metrics
from training.tracking.session import TrackingSession, open_session, tracking_uri
from training.tracking.uri import tracking_client
from training.zeroshot.leak_guard import guard_unseen
from training.zeroshot.training_rule import enforce_training_rule

log = logging.getLogger(__name__)


def build_datamodule(cfg: DictConfig) -> CXRDataModule:
    """The data module a config describes (source, task labels, augmentation, sampler).

    Labels a task takes from its data source are written into ``cfg.task.labels`` here, so the model, the stored
    ``config.yaml`` and every later reload of the run have the same list.
    """
    # A zero-shot task (task.unseen) trains on a manifest copy without the images and columns of its unseen findings.
    source = guard_unseen(instantiate(cfg.data.source), cfg.task.get("unseen"))
    labels = task_labels(cfg.task, source)
    if cfg.task.get("labels") is None:
        with open_dict(cfg.task):
            cfg.task.labels = labels
    return CXRDataModule(
        source=source,
        labels=labels,
        image_size=cfg.data.image_size,
        batch_size=cfg.data.batch_size,
        num_workers=cfg.data.num_workers,
        preload=cfg.data.preload,
        train_augment=cfg.augment.train,
        sampler=build_component(cfg.sampler),
        subset=OmegaConf.to_container(cfg.data.subset) if cfg.data.get("subset") else None,
        extra_columns=list(cfg.data.get("extra_columns") or []),
        seed=cfg.seed,
        resize=cfg.data.get("resize", "stretch"),
        cache=cfg.data.get("cache", True),
        cache_root=cfg.data.get("cache_root") or "data/cache/prepared",
        max_pixels=cfg.data.get("max_pixels", MAX_PIXELS),  # stored configs of older runs lack the two settings
        allow_outside_root=cfg.data.get("allow_outside_root", False),
        # A view-routed model (model.views) trains its experts and router on each image's manifest projection.
        views=list(cfg.model.views) if cfg.model.get("views") else None,
    )


def checkpoint_callbacks(cfg: DictConfig) -> tuple[ModelCheckpoint, ModelCheckpoint]:
    """The kept checkpoints (the ``checkpoint.save_top_k`` best by the monitored metric: the best is what is tested,
    all are logged, :mod:`training.top_checkpoints`) and ``last.ckpt`` (what ``resume=true`` reads).

    ``last.ckpt`` comes from a second, unmonitored callback: a monitored callback's ``save_last`` rewrites it only in
    improving epochs, so a killed run would redo every epoch since its last improvement. It stays end-of-epoch, so a
    resume starts an epoch from its beginning; kept checkpoints follow each validation. ``checkpoint.keep_last``
    keeps the final epoch as ``best.ckpt``: on a validation split of a few dozen images the maximum is mostly noise
    (docs/recipes.md, "Training from scratch on small real sets").
    """
    keep_last = cfg.checkpoint.get("keep_last", False)
    top_k = int(cfg.checkpoint.get("save_top_k", 1))
    if top_k < 1 or (keep_last and top_k != 1):
        raise UserError(f"checkpoint.save_top_k={top_k}: must be 1 or more, and 1 with checkpoint.keep_last=true "
                        "(the final epoch is one checkpoint)")  # fmt: skip
    # Lightning keys a checkpoint callback's saved state by its monitor and mode, not its file name; two unmonitored
    # callbacks with one mode would collide, so the kept-last one says "max" (unused without a monitor) and
    # ``latest`` keeps the default "min".
    best = ModelCheckpoint(
        filename="best" if top_k == 1 else "top-e{epoch}-s{step}", auto_insert_metric_name=False,
        monitor=None if keep_last else cfg.checkpoint.monitor,
        mode="max" if keep_last else cfg.checkpoint.mode, save_top_k=top_k,
        enable_version_counter=False, save_on_train_epoch_end=None,
    )  # fmt: skip
    latest = ModelCheckpoint(filename="last", save_top_k=1, enable_version_counter=False, save_on_train_epoch_end=True)
    return best, latest


def config_callbacks(cfg: DictConfig) -> list[L.Callback]:
    """The Lightning callbacks the config names under ``callbacks.<key>`` (``ema=ema`` adds one); null entries skipped."""
    nodes = cfg.get("callbacks") or {}
    return [build_component(node) for node in nodes.values() if node]


def one_validation_per_epoch(val_check_interval) -> bool:
    """Whether validation runs once per epoch (Lightning's default ``1.0``); a float below 1 runs it several times an
    epoch and an int every that many batches. Then the run's metrics are logged against the optimizer step, not
    the epoch, or the validations of one epoch would share a step and a resumed run could not tell them apart."""
    return isinstance(val_check_interval, float) and val_check_interval == 1.0


def effective_batch_size(batch_size: int, accumulate_grad_batches: int, world_size: int) -> int:
    """Images behind one optimizer step: the per-process batch, times the batches whose gradients are accumulated
    (``trainer.accumulate_grad_batches``), times the processes (``trainer.devices`` x nodes under DDP). It is what a
    learning rate was tuned for, so a run changing any one factor can be compared with the recipe it follows."""
    return int(batch_size) * int(accumulate_grad_batches) * int(world_size)


def error_status(error: BaseException) -> str:
    """MLflow status of a run that ended with ``error``: an interrupt KILLED, anything else FAILED."""
    return "KILLED" if isinstance(error, (Interrupted, KeyboardInterrupt, SystemExit)) else "FAILED"


def run_training(
    cfg: DictConfig,
    callbacks: Sequence[L.Callback] = (),
    extra_tags: Mapping[str, str] | None = None,
    status_on_error: Callable[[BaseException], str] = error_status,
    resume_command: Callable[[str], str] | None = None,
) -> str:
    """Train, test and track one configuration; returns the MLflow run id.

    The manifest is validated before the run is created, so broken data never leaves an empty run behind. The run ends
    FINISHED only once test metrics, predictions and the checkpoint are stored; an error marks it FAILED and an
    interrupt KILLED, either resumable. Under DDP only rank 0 opens, logs, tests and closes the run.

    Args:
        status_on_error: maps the exception that ended the run to its MLflow status (a pruned trial ends KILLED).
        resume_command: the command line that continues a run, given its id; tagged and named when a signal stops it.
    """
    quiet_lightning()  # first: each of Lightning's lines printed once, from the seed's on
    L.seed_everything(cfg.seed, workers=True)
    checkpoint, latest = checkpoint_callbacks(cfg)  # their folder is the run's, set once rank 0 opened it
    # Built before the run exists: its strategy says which process this is. The logger is attached on rank 0 only.
    progress = console_callbacks(cfg.trainer.get("enable_progress_bar", True), str(cfg.checkpoint.monitor))
    trainer = L.Trainer(
        **cfg.trainer, logger=False,
        callbacks=[checkpoint, latest, *progress, *config_callbacks(cfg), *callbacks],
        plugins=[AtomicCheckpointIO()],
        default_root_dir=cfg.tracking.checkpoint_root,
    )  # fmt: skip
    process = process_of(trainer)
    datamodule = build_datamodule(cfg)
    datamodule.prepare_data()
    datamodule.setup("fit")
    stage = build_component(cfg.stage)
    # A zero-shot task: no train/val image of an unseen finding, no parent run that saw one (docs/rules.md §11).
    enforce_training_rule(cfg.task.get("unseen"), datamodule, getattr(stage, "parent_run", None),
                          lambda: tracking_client(tracking_uri(cfg)))  # fmt: skip
    sessions: list[TrackingSession] = []

    def open_run() -> dict:  # rank 0 only
        session = open_session(cfg, {**_run_tags(cfg, datamodule), **stage.tags(), **(extra_tags or {})})
        sessions.append(session)
        resume = str(session.resume_from) if session.resume_from else None
        return {"run_id": session.run_id, "checkpoint_dir": str(session.checkpoint_dir), "resume_from": resume}

    try:
        run = share_from_rank_zero(trainer, process, open_run)
    except BaseException as error:  # the run was opened but the other ranks never got it: do not leave it RUNNING
        for session in sessions:
            session.close(status_on_error(error))
        raise
    checkpoint.dirpath = latest.dirpath = run["checkpoint_dir"]
    if not process.is_zero:  # trains its share, logs nothing; cRT may still read the parent run's checkpoint
        try:
            _fit(cfg, trainer, datamodule, stage, tracking_client(tracking_uri(cfg)), run["resume_from"])
        finally:
            forget_shared()
        return run["run_id"]
    (session,) = sessions
    trainer.logger = session.logger
    if not one_validation_per_epoch(trainer.val_check_interval):
        session.logger.step_of = lambda: trainer.global_step
    monitor = None
    command = resume_command(session.run_id) if resume_command else None
    try:
        session.set_tags(redact_tags({PROCESS_TAG: this_process(), **({RESUME_TAG: command} if command else {})}))
        if session.resume_from is None:  # a resumed run has its datasets and description already
            record_context(session.client, session.run_id, cfg, datamodule)
            session.logger.log_hyperparams({"effective_batch_size": effective_batch_size(
                cfg.data.batch_size, trainer.accumulate_grad_batches, trainer.world_size)})  # fmt: skip
        monitor = start_system_metrics(session.run_id, session.uri, cfg, resumed=session.resume_from is not None)
        model = _fit(cfg, trainer, datamodule, stage, session.client, run["resume_from"])
        _test(cfg, model, datamodule, session, checkpoint)
    except BaseException as error:
        _stop(monitor)
        session.close(status_on_error(error))
        if isinstance(error, Interrupted):
            error.run_id, error.resume_command = session.run_id, command
        raise
    finally:
        forget_shared()
    _stop(monitor)
    session.close("FINISHED")
    log.info("run %s finished: %s (`make ui` serves it)", session.run_id, session.ui_url)
    return session.run_id


def _stop(monitor) -> None:
    if monitor is not None:
        monitor.finish()


def _run_tags(cfg: DictConfig, datamodule: CXRDataModule) -> dict[str, str]:
    manifest = datamodule.manifest
    return {
        "task": cfg.task.name,
        "data_source": datamodule.source.name,
        "dataset_fingerprint": manifest.fingerprint,
        "synthetic_data": str(datamodule.source.name == "synthetic").lower(),
        **getattr(datamodule.source, "run_tags", {}),  # the leak guard's record of dropped label columns
        **{f"cxrlt.{key}": str(value) for key, value in (cfg.get("tags") or {}).items()},
    }


def _fit(cfg: DictConfig, trainer: L.Trainer, datamodule: CXRDataModule, stage, client, resume_from: str | None):
    model = model_from_config(cfg)
    stage.prepare(model, client)  # on resume the weights then come from last.ckpt; freezing still holds
    trainer.fit(model, datamodule=datamodule, ckpt_path=resume_from)
    if trainer.interrupted:
        raise KeyboardInterrupt("training was interrupted")
    return model


def _test(
    cfg: DictConfig, model: MultiLabelClassifier, datamodule: CXRDataModule, session: TrackingSession, checkpoint
) -> None:
    """Rank 0 alone: the best checkpoint on the whole test split in one process, then the artifacts."""
    best = Path(checkpoint.best_model_path)
    state = AtomicCheckpointIO().load_checkpoint(best, map_location="cpu")
    model.load_state_dict(state["state_dict"])
    # The monitored value of the kept checkpoint, beside the per-epoch series: what `make register` ranks by. A
    # kept-last checkpoint has no best score; its value is the final validation's.
    score = checkpoint.best_model_score
    if score is None and checkpoint.monitor is None:
        score = model.trainer.callback_metrics.get(cfg.checkpoint.monitor)
    best_score = {f"{cfg.checkpoint.monitor}_best": float(score)} if score is not None else {}
    session.log_metrics({"best_epoch": state["epoch"], **best_score})
    evaluation, unseen = run_test_phase(model, datamodule, cfg, session)  # zero-shot tasks: test_unseen/... too
    if "logit_temperature" in state["state_dict"]:  # what the test phase fitted (temperature, a tau-normalised head)
        fitted = model.state_dict()  # the stored weights must carry it
        state["state_dict"].update({k: v.detach().cpu().clone() for k, v in fitted.items() if k in state["state_dict"]})
        AtomicCheckpointIO().save_checkpoint(state, best)
    kept = _kept(cfg, checkpoint, best, state, score)
    upload_kept(session, kept)
    if len(kept) > 1:  # what `make ensemble` weighs the ranks by; the model is left with the last rank's weights
        with tempfile.TemporaryDirectory() as tmp:
            rank_predictions(model, datamodule, kept, Path(tmp))
            session.log_artifacts(Path(tmp) / "predictions", "predictions")
    lines = summary_lines(evaluation.metrics, unseen.metrics if unseen else None, headline_of(cfg.task))
    lines += terminal_lines(evaluation.conventions, {**evaluation.metrics, **(unseen.metrics if unseen else {})})
    lines.append(f"report: {session.artifact_uri}/evaluation/report.html")
    log.info("run %s, best epoch %d:\n  %s", session.run_id, state["epoch"], "\n  ".join(lines))


def _kept(cfg: DictConfig, checkpoint: ModelCheckpoint, best: Path, state: dict, score) -> list[Kept]:
    """The checkpoints the run keeps, best first; the best is the one tested (``best_model_path``) whatever the
    order of equal scores."""
    monitor = str(cfg.checkpoint.monitor)
    if checkpoint.monitor is None or len(checkpoint.best_k_models) <= 1:
        value = float(score) if score is not None else float("nan")
        return [Kept(str(best), 1, int(state["epoch"]), int(state["global_step"]), monitor, value)]
    return kept_checkpoints(checkpoint.best_k_models, cfg.checkpoint.mode, monitor, first=str(best))
