"""What ``make submit`` does (its command line: :mod:`apps.submit_cli`): predict the test images with the champion (or an ensemble) and write a validated submission.

Images: the test split of the (first) model's training manifest by default, any ``--manifest``, or the ids of a
``--template``, so the organisers' unlabelled test set is scored the same way. Several ``--model`` are averaged
(probabilities, after each one's own TTA), the checkpoint ensemble of the challenge's winners; ``ensemble:<run
id>`` uses a ``make ensemble`` run's per-class weights instead (:mod:`apps.ensemble`). The file
(:mod:`apps.submission`) is validated before and after it is written, then logged to each member's source run.
What is written depends on the task's ``submission_format`` (:data:`WRITERS`): the CXR-LT probability CSV, or
ImageCLEF's concept run file with thresholds chosen on validation (docs/concepts.md).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shlex
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd
from hydra.utils import instantiate
from mlflow import MlflowClient
from mlflow.exceptions import MlflowException
from omegaconf import OmegaConf

from apps.benchmarks.imageclef_concepts.scoring import empty_rows, write_run
from apps.benchmarks.imageclef_concepts.tables import read_ids, split_concepts, truth_matrix
from apps.ensemble import WEIGHTS_ARTIFACT, EnsembleError, StoredEnsemble, load_weights
from apps.registry import ALIAS, model_name
from apps.serving import Scorer
from apps.submission import (
    COMMIT_TAG,
    CodeRecord,
    SubmissionError,
    Template,
    UploadError,
    build_submission,
    submission_format,
    task_setting,
    write_submission,
)
from evaluation.concept_thresholds import MODES, ConceptThresholds, choose_thresholds, predicted_concepts
from evaluation.prediction_columns import ID_COLUMN
from evaluation.tta import TTAPredictor
from training.allowed_targets import UnsafeConfig
from training.config_files import config_file
from training.data.images import read_grayscale
from training.errors import user_errors
from training.runs import CONFIG, ModelNotFound, read_config
from training.tracking.artifacts import download
from training.tracking.redaction import redact_text
from training.tracking.tracked_run import TrackedRun
from training.tracking.uri import resolve_tracking_uri, tracking_client

log = logging.getLogger(__name__)

TTA_CONFIGS = config_file("tta")
#: The ``make submit`` line as typed, which the Makefile exports for ``code/COMMAND.txt``.
MAKE_COMMAND_ENV = "CXRLT_SUBMIT_COMMAND"
SUBMISSION_SUFFIXES = (".zip", ".csv")


def run_manifest(client: MlflowClient, run_id: str) -> tuple[Path, Path]:
    """``(manifest CSV, image root)`` of the data a run was trained on, rebuilt from its checked ``config.yaml``."""
    with tempfile.TemporaryDirectory() as tmp:
        cfg = read_config(client, run_id, tmp)
    source = instantiate(cfg.data.source)
    return Path(source.prepare()), Path(source.root)


def rows_to_predict(manifest: Path, split: str | None, ids: Sequence[str] | None = None) -> pd.DataFrame:
    """``image_id`` and ``path`` of the rows to predict: the template's ids in order, else the split's rows.

    Raises:
        SubmissionError: ids absent from the manifest (named), or an empty split.
    """
    table = pd.read_csv(manifest, dtype=str, keep_default_na=False)
    if ids is not None:
        by_id = table.drop_duplicates(ID_COLUMN).set_index(ID_COLUMN)
        absent = [i for i in ids if i not in by_id.index]
        if absent:
            raise SubmissionError(f"{len(absent)} template id(s) are not in {manifest}, e.g. {absent[:10]}")
        return by_id.loc[list(ids), ["path"]].reset_index()
    rows = table[table["split"] == split] if split else table
    if rows.empty:
        raise SubmissionError(f"{manifest}: no rows in split {split!r}")
    return rows[[ID_COLUMN, "path"]].reset_index(drop=True)


def ensemble_predict(members: Sequence[Scorer], paths: Sequence[Path], tta: TTAPredictor | None,
                     weights: np.ndarray | None = None) -> np.ndarray:  # fmt: skip
    """Mean ``(N, C)`` probability over members, or their sum weighted by ``(K, C)`` ``weights`` (columns summing
    to one); images are decoded once per image size."""
    labels = members[0].labels
    for member in members[1:]:
        if member.labels != labels:
            raise ValueError(f"ensemble members disagree on labels: run {member.run_id} predicts {member.labels}")
    decoded: dict[int, np.ndarray] = {}
    total = np.zeros((len(paths), len(labels)))
    for k, member in enumerate(members):
        key = (member.image_size, member.resize)  # members trained at other sizes or geometries decode their own
        if key not in decoded:
            decoded[key] = np.stack([read_grayscale(p, member.image_size, member.resize) for p in paths])
        probs = member.predict_images(decoded[key], tta)
        total += probs if weights is None else weights[k] * probs
    return total / len(members) if weights is None else total


def code_record(client: MlflowClient, run_ids: Sequence[str], command: str) -> CodeRecord:
    """What the zip's ``code/`` records of the first run (its ``config.yaml`` artifact and commit tag), the other
    members' configs, and ``command`` redacted like everything the platform logs (the zip leaves the team).

    Raises:
        SubmissionError: a run without its ``config.yaml`` artifact.
    """
    configs = {}
    with tempfile.TemporaryDirectory() as tmp:
        for k, run_id in enumerate(dict.fromkeys(run_ids)):
            try:
                configs[run_id] = Path(download(client, run_id, CONFIG, f"{tmp}/{k}")).read_bytes()
            except (MlflowException, OSError) as error:
                raise SubmissionError(f"run {run_id}: no {CONFIG} artifact for code/ ({error})") from None
    first, *others = configs
    commit = client.get_run(first).data.tags.get(COMMIT_TAG)
    return CodeRecord(configs[first], redact_text(command), commit, first, {run: configs[run] for run in others})


def python_command(task: str, models: Sequence[str], out: Path, template_path: Path | None, manifest: Path | None,
                   root: Path | None, split: str, tta: str | None, id_column: str | None) -> str:  # fmt: skip
    """The ``python -m apps.submit_cli`` line equivalent to a call of :func:`submit`."""
    words = ["python", "-m", "apps.submit_cli", "--task", task]
    for model in models:
        words += ["--model", model]
    options = {"--template": template_path, "--manifest": manifest, "--root": root, "--tta": tta,
               "--id-column": id_column, "--out": out}  # fmt: skip
    words += [w for name, value in options.items() if value is not None for w in (name, str(value))]
    return shlex.join(words + (["--split", split] if split != "test" else []))


def submit(client: MlflowClient, models: Sequence[str], out: Path, template_path: Path | None = None,
           manifest: Path | None = None, root: Path | None = None, split: str = "test",
           tta: str | None = None, id_column: str | None = None, command: str | None = None) -> pd.DataFrame:  # fmt: skip
    """Predict, build, validate, write and log a submission (a ``.zip`` upload or a bare ``.csv``); returns the
    written frame.

    Args:
        id_column: the id column's name (``dicom_id`` for the challenge page); default the template's own, else
            ``ImageID``.
        command: the command line(s) for ``code/COMMAND.txt``; default the ``python -m apps.submit_cli`` line
            equivalent to this call.
    """
    if out.suffix not in SUBMISSION_SUFFIXES:
        raise SubmissionError(f"--out {out}: a submission is a .zip (the upload: the CSV and code/) or a .csv")
    stored = ensemble_weights(client, models)
    members = [Scorer.load(uri, client) for uri in (stored.members if stored else models)]
    if stored:
        for member in members:
            if member.labels != stored.labels:
                raise EnsembleError(f"run {member.run_id} predicts other labels than ensemble run {stored.run_id} "
                                    f"weighs ({WEIGHTS_ARTIFACT}); refit it with make ensemble")  # fmt: skip
    labels = members[0].labels
    task = members[0].finished.task
    command = command or python_command(task, models, out, template_path, manifest, root, split, tta, id_column)
    if manifest is None:
        manifest, root = run_manifest(client, members[0].run_id)
    root = root or manifest.parent
    template = Template.read(template_path, members[0].submission_labels) if template_path else None
    rows = rows_to_predict(manifest, None if template else split, template.ids if template else None)
    template = template or Template.default(members[0].submission_labels, rows[ID_COLUMN].tolist())
    template = template.with_id_column(id_column) if id_column else template
    run_ids = [m.run_id for m in members if m.run_id]
    record = None
    if out.suffix == ".zip":
        record = code_record(client, run_ids, command)
    predictor = TTAPredictor.from_config(OmegaConf.load(TTA_CONFIGS / f"{tta}.yaml")) if tta else None
    log.info("predicting %d images with %d model(s)%s", len(rows), len(members), f", TTA {tta}" if tta else "")
    probs = ensemble_predict(members, [root / p for p in rows["path"]], predictor, stored.weights if stored else None)
    frame = build_submission(template, rows[ID_COLUMN].tolist(), probs, labels)
    described = write_submission(frame, template, out, record)
    if described:
        log.info("code/ in %s: %s", out, described)
    for run_id in dict.fromkeys([*run_ids, *([stored.run_id] if stored else [])]):
        run = TrackedRun(client, run_id)
        run.log_artifact(out, "submissions")
        run.set_tags({"cxrlt.last_submission": out.name})
    if template_path is None:  # the split's own rows: its labels score the file
        predictions = out
        if out.suffix == ".zip":
            predictions = out.with_suffix(".csv")
            log.info("score it: unzip -o %s %s -d %s", out, predictions.name, out.parent)
        log.info("score it: make score TASK=%s PREDICTIONS=%s MANIFEST=%s SPLIT=%s", task, predictions, manifest,
                 split)  # fmt: skip
    return frame


ENSEMBLE_PREFIX = "ensemble:"


def ensemble_weights(client: MlflowClient, models: Sequence[str]) -> StoredEnsemble | None:
    """The checked weights of ``ensemble:<run id>``, or None for ordinary models (the plain mean).

    The weights were fitted for exactly those members, so an ensemble run cannot be mixed with other models.
    """
    named = [m for m in models if m.startswith(ENSEMBLE_PREFIX)]
    if not named:
        return None
    if len(models) != 1:
        raise EnsembleError(f"{named[0]} brings its own members and weights; give it alone as MODEL")
    with tempfile.TemporaryDirectory() as tmp:
        return load_weights(client, named[0].removeprefix(ENSEMBLE_PREFIX), tmp)


def validation_concept_thresholds(manifest: Path, root: Path, members: Sequence[Scorer], tta: TTAPredictor | None,
                                  mode: str) -> ConceptThresholds:  # fmt: skip
    """Thresholds maximising the mean per-image F1 on the validation split of ``manifest`` (the first member's own
    data, :func:`run_manifest`).

    The ensemble predicts the validation images exactly as it predicts the test images (same members, same TTA),
    so the thresholds fit the scores they are applied to. The truth is each image's full concept set (the
    manifest's ``concepts`` column; the label columns when a manifest has none), so true concepts outside the
    model's labels count as missed, as the official score counts them.
    """
    table = pd.read_csv(manifest, dtype=str, keep_default_na=False)
    rows = table[table["split"] == "val"].reset_index(drop=True)
    if rows.empty:
        raise SubmissionError(f"{manifest}: no validation rows to choose the concept thresholds on")
    labels = members[0].labels
    if "concepts" in rows:
        sets = [split_concepts(cell) for cell in rows["concepts"]]
    else:
        sets = [frozenset(name for name in labels if row[name] == "1") for _, row in rows.iterrows()]
    truth, missed = truth_matrix(sets, labels)
    probs = ensemble_predict(members, [root / p for p in rows["path"]], tta)
    return choose_thresholds(truth, probs, mode, missed)


def submit_concepts(client: MlflowClient, models: Sequence[str], out: Path, template_path: Path | None = None,
                    manifest: Path | None = None, root: Path | None = None, split: str = "test",
                    tta: str | None = None, mode: str = "per_class"
                    ) -> tuple[dict[str, tuple[str, ...]], ConceptThresholds]:  # fmt: skip
    """Predict each test image's concepts, write and log the ImageCLEF run file; returns it and the thresholds.

    The test ids are the template's (any CSV whose first column lists them, e.g. the organisers' test table) or the
    split's rows of the manifest; every one gets a line, with no concept when none reaches its threshold.
    """
    members = [Scorer.load(uri, client) for uri in models]
    labels = members[0].labels
    for member in members[1:]:
        if member.labels != labels:
            raise SubmissionError(f"ensemble members disagree on concepts: run {member.run_id} predicts other ones")
    own = run_manifest(client, members[0].run_id)  # its validation split chooses the thresholds
    manifest, root = own if manifest is None else (manifest, root or manifest.parent)
    rows = rows_to_predict(
        manifest, None if template_path else split, read_ids(template_path) if template_path else None
    )
    predictor = TTAPredictor.from_config(OmegaConf.load(TTA_CONFIGS / f"{tta}.yaml")) if tta else None
    chosen = validation_concept_thresholds(*own, members, predictor, mode)
    log.info("thresholds (%s) on validation: mean per-image F1 %.4f (one global threshold %.3f: %.4f)", mode,
             chosen.val_f1, chosen.global_threshold, chosen.global_f1)  # fmt: skip
    log.info("predicting %d images with %d model(s)%s", len(rows), len(members), f", TTA {tta}" if tta else "")
    probs = ensemble_predict(members, [root / p for p in rows["path"]], predictor)
    ids = rows["image_id"].tolist()
    out.parent.mkdir(parents=True, exist_ok=True)
    run = write_run(out, dict(zip(ids, predicted_concepts(probs, chosen.thresholds, labels), strict=True)), ids)
    if empty_rows(run):  # the 2026 format allows an empty CUIs cell, the 2026 check's code as written does not
        log.warning("%d of %d images have no concept (written as ID,); the organisers' 2026 check code refuses an "
                    "empty CUIs cell although their format allows it", len(empty_rows(run)), len(run))  # fmt: skip
    sidecar = out.with_name(out.name + ".thresholds.json")
    sidecar.write_text(json.dumps(chosen.to_dict(labels), indent=1) + "\n")
    for run_id in dict.fromkeys(m.run_id for m in members if m.run_id):
        source = TrackedRun(client, run_id)
        source.log_artifact(out, "submissions")
        source.log_artifact(sidecar, "submissions")
        source.set_tags({"cxrlt.last_submission": out.name})
    return run, chosen


def command_lines(args: argparse.Namespace) -> str:
    """``code/COMMAND.txt``: the ``make submit`` line as typed (when make ran it) and the Python line it ran."""
    python = shlex.join(["python", "-m", "apps.submit_cli", *getattr(args, "argv", [])])
    return "\n".join(line for line in (os.environ.get(MAKE_COMMAND_ENV, "").strip(), python) if line)


def _write_probabilities(client: MlflowClient, models: Sequence[str], out: Path, args: argparse.Namespace) -> str:
    frame = submit(client, models, out, args.template, args.manifest, args.root, args.split, args.tta,
                   args.id_column, command_lines(args) if hasattr(args, "argv") else None)  # fmt: skip
    kind = "the upload (CSV and code/)" if out.suffix == ".zip" else "CSV"
    return (f"wrote {out}, {kind}: {len(frame)} rows x {frame.shape[1] - 1} classes, validated; logged to the "
            "source run(s)")  # fmt: skip


def _write_concepts(client: MlflowClient, models: Sequence[str], out: Path, args: argparse.Namespace) -> str:
    if any(m.startswith(ENSEMBLE_PREFIX) for m in models):
        raise SubmissionError("ensemble weights (make ensemble) are for probability submissions, not concept tasks")
    if out.suffix == ".zip":
        raise SubmissionError(f"--out {out}: a concept task writes ImageCLEF's run file, not a zip; give a .csv")
    mode = args.thresholds or str(task_setting(args.task, "thresholds", "per_class"))
    if mode not in MODES:
        raise SubmissionError(f"thresholds {mode!r} is not one of {sorted(MODES)}")
    run, chosen = submit_concepts(client, models, out, args.template, args.manifest, args.root, args.split, args.tta,
                                  mode)  # fmt: skip
    return (f"wrote {out}: ImageCLEF run file, {len(run)} images, {sum(len(c) for c in run.values())} concepts "
            f"predicted; {mode} thresholds (validation F1 {chosen.val_f1:.4f}) in {out.name}.thresholds.json; "
            "logged to the source run(s)")  # fmt: skip


#: The task's ``submission_format`` -> what ``make submit`` writes (see the module docstring).
WRITERS = {"probabilities": _write_probabilities, "concepts": _write_concepts}


def run(args: argparse.Namespace) -> None:
    """The submission :mod:`apps.submit_cli` asked for, its arguments already checked."""
    uri = resolve_tracking_uri()
    models = args.model or [f"models:/{model_name(args.task)}@{ALIAS}"]
    # A file that must not be sent, an unknown or unsafe model: the message names it; anything else is a bug.
    with user_errors(SubmissionError, UploadError, UnsafeConfig, ModelNotFound, EnsembleError, debug=args.debug):
        kind = submission_format(args.task)
        suffix = ".zip" if kind == "probabilities" else ".csv"  # the CXR-LT upload; ImageCLEF's run file
        out = args.out or Path("mlruns/submissions") / f"{args.task}-{time.strftime('%Y%m%d-%H%M%S')}{suffix}"
        message = WRITERS[kind](tracking_client(uri), models, out, args)
    log.info("%s", message)
