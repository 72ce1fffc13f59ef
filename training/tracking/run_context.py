"""What MLflow shows about a run beyond params and metrics: its data sets, a one-line description, and the
machine's load while it trained.

- **Datasets** (``log_inputs``): the manifest's train, val and test rows, each named ``<source>-<split>`` with the
  manifest's fingerprint as digest and the split as context, so the runs table's Dataset column and filter
  work, and two runs on different data cannot be mistaken for comparable.
- **Experiment kind** (``mlflow.experimentKind``): model training, and a saved runs-table view *Headline metrics*
  (the selection metric at the kept checkpoint, the ranking chain, the perturbed mAP, with their intervals; sorted
  as ``make register`` ranks), offered by the runs table's *Views* button to everyone on the server; a release
  that changes its columns replaces it.
- **Source heterogeneity** (``data/heterogeneity.md`` and ``.json``): per source, label composition, native
  resolution, grayscale mean and SD, view shares (:mod:`training.data.heterogeneity`; ``+heterogeneity.sample=N``
  sets how many images per source are decoded, 500 by default).
- **Comparability** (tags ``cxrlt.val_fingerprint``, ``cxrlt.debug``): a content hash of the validation rows the
  run was judged on (image ids and labels, after any subset cut) and whether it trained on a debug preset's
  subset (``data.debug_size``, configs/debug/), so ``make register`` ranks a run only against runs of the same
  validation set and leaves smoke runs out (docs/tuning-registry-submission.md, Registry).
- **Description** (``mlflow.note.content``): task, model, loss, sampler, stage and seed in words, the first thing
  the run page shows.
- **System metrics** (``system/...``: CPU, memory, disk, network; GPU through ``nvidia-ml-py`` when installed),
  sampled every ``tracking.system_metrics.interval_s`` seconds by MLflow's own monitor, so a slow run can be told
  apart from a starved machine.
"""

from __future__ import annotations

import hashlib
import json
import logging
import warnings
from collections.abc import Callable

import mlflow.data
from mlflow.entities import Dataset, DatasetInput, InputTag
from mlflow.exceptions import MlflowException
from mlflow.utils.mlflow_tags import MLFLOW_DATASET_CONTEXT
from omegaconf import DictConfig, OmegaConf
from sqlalchemy.exc import IntegrityError

from evaluation.headline import headline_of
from evaluation.tables import headline_view_tag
from training.data.heterogeneity import measure

log = logging.getLogger(__name__)

SPLITS = ("train", "val", "test")
DESCRIPTION_TAG = "mlflow.note.content"
#: Declares the experiment a model-training one for MLflow's UI and search. MLflow 3.17's UI itself still opens on
#: whatever its sidebar switch (*GenAI | Model training*) was last set to in the browser; README says how to switch.
EXPERIMENT_KIND = ("mlflow.experimentKind", "custom_model_development")
VAL_FINGERPRINT_TAG = "cxrlt.val_fingerprint"
DEBUG_TAG = "cxrlt.debug"


def lost_insert_race(error: Exception) -> bool:
    """Whether a write failed only because another writer inserted the same row (an experiment's tag, a dataset of
    the experiment) between MLflow's look-up and its insert: the store's own IntegrityError on a local store, its
    message behind a server's BAD_REQUEST (SQLite, PostgreSQL and MySQL name it so)."""
    return isinstance(error, IntegrityError) or (
        isinstance(error, MlflowException) and any(word in str(error) for word in ("IntegrityError", "UniqueViolation"))
    )


def shared_write(write: Callable[[], object], attempts: int = 3) -> None:
    """A write of a row several runs share, repeated when it lost an insert race.

    MLflow's stores look such a row up and insert it when missing, without a lock, so two runs starting at once (the
    first trials of two tuning workers) can both insert it, and the second fails on the row's key (docs/scaling.md).
    The winner's row is committed by then, so the same write finds it and succeeds; any other error is raised as is.
    """
    for attempt in range(attempts):
        try:
            write()
            return
        except Exception as error:
            if attempt == attempts - 1 or not lost_insert_race(error):
                raise
            log.info("a concurrent run wrote the same MLflow row first; writing again (%s)", type(error).__name__)


def mark_model_training(client, experiment_id: str, views: dict[str, str] | None = None) -> None:
    """Tag the experiment as model training unless someone chose its kind, and save ``views``: this platform's own,
    so a view whose columns differ (written by an older release) is replaced, and an equal one left as it is."""
    tags = client.get_experiment(experiment_id).tags
    if EXPERIMENT_KIND[0] not in tags:
        shared_write(lambda: client.set_experiment_tag(experiment_id, *EXPERIMENT_KIND))
    for key, value in (views or {}).items():
        if key not in tags or json.loads(tags[key]).get("state") != json.loads(value)["state"]:
            shared_write(lambda key=key, value=value: client.set_experiment_tag(experiment_id, key, value))


def describe(cfg: DictConfig, source_name: str, fingerprint: str) -> str:
    """The run in one sentence, as the run page's description."""
    stage = cfg.get("stage", {}).get("name", "scratch")
    adapter = cfg.get("adapter", {}).get("name", "none")
    parts = [f"{cfg.task.name}: {cfg.model.name} with {cfg.loss.name} loss and {cfg.sampler.name} sampling"]
    if adapter != "none":
        parts.append(f"zero-shot adapter {adapter}")
    if stage != "scratch":
        parts.append(f"stage {stage}")
    parts.append(f"seed {cfg.seed}; data {source_name} (manifest {fingerprint})")
    return ", ".join(parts) + "."


def dataset_inputs(datamodule) -> list[DatasetInput]:
    """One MLflow dataset per split of the data module's manifest (see the module docstring)."""
    manifest = datamodule.manifest
    inputs = []
    for split in SPLITS:
        frame = datamodule.split_frame(split)
        with warnings.catch_warnings():  # MLflow registers the local-file source twice and says so on every call
            warnings.filterwarnings("ignore", message="The specified dataset source can be interpreted")
            dataset = mlflow.data.from_pandas(frame, source=str(manifest.source_file),
                                              name=f"{datamodule.source.name}-{split}", digest=manifest.fingerprint)  # fmt: skip
        inputs.append(DatasetInput(Dataset(**dataset.to_dict()), tags=[InputTag(MLFLOW_DATASET_CONTEXT, split)]))
    return inputs


def split_fingerprint(frame, labels) -> str:
    """First 12 hex digits of the SHA-256 of a split's image ids and labels, in order: equal exactly when two runs
    were judged on the same images with the same labels, whatever manifest or training rows surrounded them."""
    text = frame[["image_id", *labels]].astype(str).to_csv(index=False)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def comparability_tags(cfg: DictConfig, datamodule) -> dict[str, str]:
    """What ``make register`` groups runs by: the validation set's fingerprint and whether this is a debug run."""
    debug = OmegaConf.select(cfg, "data.debug_size", default=None) is not None
    return {VAL_FINGERPRINT_TAG: split_fingerprint(datamodule.split_frame("val"), datamodule.manifest.labels),
            DEBUG_TAG: str(debug).lower()}  # fmt: skip


def record_context(client, run_id: str, cfg: DictConfig, datamodule) -> None:
    """Log the datasets, the comparability tags, the source heterogeneity report and the description of a new run
    (a resumed run already has them); mark its experiment."""
    headline = headline_of(cfg.task).prefix  # the classes the task is ranked on (Task 2: its unseen ones)
    view = headline_view_tag(str(cfg.checkpoint.monitor), headline, cfg.checkpoint.mode == "max", tags=[DEBUG_TAG])
    mark_model_training(client, client.get_run(run_id).info.experiment_id, view)
    datasets = dataset_inputs(datamodule)
    shared_write(lambda: client.log_inputs(run_id, datasets=datasets))
    client.set_tag(run_id, DESCRIPTION_TAG, describe(cfg, datamodule.source.name, datamodule.manifest.fingerprint))
    for key, value in comparability_tags(cfg, datamodule).items():
        client.set_tag(run_id, key, value)
    manifest = datamodule.manifest
    # a new run reads only the sample's headers: every header of a 143k-image release would delay each start
    settings = {"resolution_from": "sample", **(cfg.get("heterogeneity") or {})}
    report = measure(manifest.table, manifest.root, manifest.labels, **settings)
    client.log_text(run_id, report.markdown(), "data/heterogeneity.md")
    client.log_text(run_id, report.to_json(), "data/heterogeneity.json")


def start_system_metrics(run_id: str, uri: str, cfg: DictConfig, resumed: bool):
    """MLflow's system-metrics monitor on the run, or None when switched off or unavailable (``finish()`` it)."""
    settings = cfg.tracking.get("system_metrics") or {}
    if not settings.get("enabled", True):
        return None
    try:
        from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor
    except ImportError as error:  # psutil missing: train anyway, say why the charts are empty
        log.warning("no system metrics: %s", error)
        return None
    monitor = SystemMetricsMonitor(run_id, sampling_interval=float(settings.get("interval_s", 10)),
                                   resume_logging=resumed, tracking_uri=uri)  # fmt: skip
    monitor.start()
    return monitor
