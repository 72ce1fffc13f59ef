"""One training, end to end: data, model, tracked fit, test on the best checkpoint, artifacts."""

from __future__ import annotations

import logging
import tempfile
from pathlib import Path

import lightning.pytorch as L
import pandas as pd
from hydra.utils import instantiate
from lightning.pytorch.callbacks import ModelCheckpoint
from omegaconf import DictConfig, OmegaConf

from evaluation.metrics import prevalence_baseline_map
from training.data.datamodule import CXRDataModule
from training.models.module import MultiLabelClassifier
from training.tracking.session import TrackingSession, open_session

log = logging.getLogger(__name__)


def build_datamodule(cfg: DictConfig) -> CXRDataModule:
    """The data module a config describes (source, task labels, augmentation, sampler)."""
    return CXRDataModule(
        source=instantiate(cfg.data.source),
        labels=list(cfg.task.labels),
        image_size=cfg.data.image_size,
        batch_size=cfg.data.batch_size,
        num_workers=cfg.data.num_workers,
        preload=cfg.data.preload,
        train_augment=cfg.augment.train,
        sampler=instantiate({k: v for k, v in cfg.sampler.items() if k != "name"}),
        subset=OmegaConf.to_container(cfg.data.subset) if cfg.data.get("subset") else None,
        extra_columns=list(cfg.data.get("extra_columns") or []),
        seed=cfg.seed,
    )


def build_model(cfg: DictConfig) -> MultiLabelClassifier:
    return MultiLabelClassifier(
        OmegaConf.to_container(cfg.model, resolve=True),
        OmegaConf.to_container(cfg.loss, resolve=True),
        list(cfg.task.labels),
    )


def predictions_frame(datamodule: CXRDataModule, split: str, result: dict, labels: list[str]) -> pd.DataFrame:
    """Per-image probabilities (one column per class) beside the ground truth (``true/<class>``, -1 = unlabelled)."""
    rows = datamodule.split_frame(split).iloc[result["index"]]
    frame = rows[["image_id", "patient_id"] + [c for c in ("source", "view") if c in rows]].reset_index(drop=True)
    probs = pd.DataFrame(result["probs"], columns=labels)
    truth = pd.DataFrame(result["targets"].astype(int), columns=[f"true/{name}" for name in labels])
    return pd.concat([frame, probs, truth], axis=1)


def run_training(cfg: DictConfig) -> str:
    """Train, test and track one configuration; returns the MLflow run id.

    The manifest is validated before the run is created, so broken data never leaves an empty run behind. The
    run ends FINISHED only once test metrics, predictions and the checkpoint are stored; an error marks it
    FAILED and an interrupt KILLED, and either can be resumed with ``resume=true``.
    """
    L.seed_everything(cfg.seed, workers=True)
    datamodule = build_datamodule(cfg)
    datamodule.prepare_data()
    datamodule.setup("fit")
    manifest = datamodule.manifest
    tags = {
        "task": cfg.task.name,
        "data_source": datamodule.source.name,
        "dataset_fingerprint": manifest.fingerprint,
        "synthetic_data": str(datamodule.source.name == "synthetic").lower(),
    }
    session = open_session(cfg, tags)
    try:
        _fit_and_test(cfg, datamodule, session)
    except BaseException as error:
        session.close("KILLED" if isinstance(error, (KeyboardInterrupt, SystemExit)) else "FAILED")
        raise
    session.close("FINISHED")
    log.info("run %s finished; compare it with `make ui`", session.run_id)
    return session.run_id


def _fit_and_test(cfg: DictConfig, datamodule: CXRDataModule, session: TrackingSession) -> None:
    model = build_model(cfg)
    checkpoint = ModelCheckpoint(
        dirpath=session.checkpoint_dir, filename="best", monitor=cfg.checkpoint.monitor, mode=cfg.checkpoint.mode,
        save_top_k=1, save_last=True, enable_version_counter=False,
    )  # fmt: skip
    trainer = L.Trainer(**cfg.trainer, logger=session.logger, callbacks=[checkpoint], default_root_dir=session.checkpoint_dir)
    trainer.fit(model, datamodule=datamodule, ckpt_path=session.resume_from)
    if trainer.interrupted:
        raise KeyboardInterrupt("training was interrupted")

    best = Path(checkpoint.best_model_path)
    trainer.test(model, datamodule=datamodule, ckpt_path=str(best), verbose=False)
    labels = list(cfg.task.labels)
    baseline = prevalence_baseline_map(model.test_result["targets"])
    session.logger.log_metrics({"test/prevalence_baseline_mAP": baseline, "best_epoch": _epoch_of(best)})
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "test.csv"
        predictions_frame(datamodule, "test", model.test_result, labels).to_csv(path, index=False)
        session.log_artifact(path, "predictions")
    session.log_artifact(best, "checkpoints")
    log.info("test/mAP %.4f (prevalence baseline %.4f)", model.test_result["metrics"]["mAP"], baseline)


def _epoch_of(checkpoint_path: Path) -> int:
    import torch

    return int(torch.load(checkpoint_path, map_location="cpu", weights_only=True)["epoch"])
