"""The pediatric-pneumonia protocol (Kermany et al., Cell 2018): which images, drawn how, answered and scored how.

The pools, item ids, leakage rule, versions, decisions (the card's rule, :data:`CARD_RULE`), floor and caveats
are the pneumonia model card's, stated in docs/benchmarks.md, "Pediatric pneumonia". Because a result is only
comparable with another on the same training draw, and the leakage rule makes versions train on different
sets, every draw reports each version's training fingerprint and how many training images the versions share
(hashing ids only). Draws rank on the card's item id, so a draw is the card's draw whatever the order of the
files. Each ``<method>/<metric>`` is also logged under the card's name (:data:`CARD_METRICS`).
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import pandas as pd

from apps.benchmarks.framework.encoders import Encoder, Target
from apps.benchmarks.framework.methods import PROBE_PARAMS, PROBE_THRESHOLD, binary_probe
from apps.benchmarks.framework.metrics import METRICS, binary_metrics
from apps.benchmarks.framework.platform_models import PlatformRunEncoder
from apps.benchmarks.framework.protocol import (
    Draw,
    Extras,
    Features,
    Outcome,
    Prediction,
    Protocol,
    Subset,
    Targets,
)
from apps.benchmarks.framework.sampling import stratified_draw
from training.data.adapters.kermany import KermanySource

ID_COLUMN = "item_id"
COLUMNS = [ID_COLUMN, "path", "patient_id", "label"]
"""The subset tables (and ``subsets/*.csv``): label 1 = pneumonia; ``item_id`` is the card's id (:func:`item_id`)."""

CARD_RULE = {"probability": PROBE_THRESHOLD, "margin": 0.0}
"""Zero-shot score kind -> the card's cut: the model calls pneumonia when its score is strictly above it (a
classifier's probability above 0.5, as the probe's; an image-text model's prompt margin above 0). Nothing is tuned."""

CARD_METRICS = {"auroc": "roc_auc", "accuracy": "accuracy", "sensitivity": "sensitivity",
                "specificity": "specificity", "ap": "average_precision"}  # fmt: skip
"""Platform metric -> the pneumonia model card's metric stem; the card names a value ``<stem>_<method>``
(``roc_auc_zero_shot``, ``accuracy_probe``)."""


def item_id(path: str) -> str:
    """The card's id of the image at ``path`` (relative to the release folder, ``<split>/<CLASS>/<file>``):
    ``pneumonia-<split>-<file stem>``, e.g. ``test/PNEUMONIA/person136_bacteria_648.jpeg`` ->
    ``pneumonia-test-person136_bacteria_648``."""
    parts = Path(path).parts
    if len(parts) != 3:
        raise ValueError(f"{path}: expected <split>/<class folder>/<file> under the release folder")
    return f"pneumonia-{parts[0]}-{Path(parts[2]).stem}"


def with_item_ids(table: pd.DataFrame) -> pd.DataFrame:
    """``table`` with the card's :data:`ID_COLUMN` from its ``path`` column; two files with one id are refused,
    naming both, since the card (and every draw keyed on its ids) could not tell them apart."""
    ids = table["path"].map(item_id)
    clash = ids.duplicated(keep=False)
    if clash.any():
        first = ids[clash].iloc[0]
        paths = ", ".join(table.loc[ids == first, "path"])
        raise ValueError(f"the card's item id {first} names more than one image ({paths}); ids are "
                         "pneumonia-<split>-<file stem>, so a file stem must be unique within its split")  # fmt: skip
    return table.assign(**{ID_COLUMN: ids})


def exclude_shared_patients(train: pd.DataFrame, test: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Split the train pool into (kept, removed): removed rows are those whose ``patient_id`` is in ``test``."""
    shared = train["patient_id"].isin(set(test["patient_id"]))
    return train[~shared].reset_index(drop=True), train[shared].reset_index(drop=True)


def card_metrics(table: pd.DataFrame) -> dict[str, float]:
    """The metric table's point values under the card's names (``roc_auc_probe``); rows without a value left out."""
    rows = table[table["metric"].isin(list(CARD_METRICS))].dropna(subset=["value"])
    return {f"{CARD_METRICS[row.metric]}_{row.protocol}": float(row.value) for row in rows.itertuples()}


def card_decisions(scores: np.ndarray, kind: str) -> np.ndarray:
    """The card's call on zero-shot ``scores`` of ``kind`` (a key of :data:`CARD_RULE`): strictly above its cut.

    A missing score (NaN) is never a call of pneumonia."""
    if kind not in CARD_RULE:
        raise ValueError(f"the card has no decision rule for zero-shot scores of kind {kind!r} "
                         f"(known: {', '.join(CARD_RULE)})")  # fmt: skip
    return np.asarray(scores, dtype=np.float64) > CARD_RULE[kind]


def run_thresholds(encoder: Encoder) -> bool:
    """Whether the model has a decision of its own other than the card's: a platform run's stored validation
    thresholds (an open_clip margin's own call, and a run without thresholds, already are the card's rule)."""
    return isinstance(encoder, PlatformRunEncoder) and encoder.thresholds is not None


def floor_line(labels: np.ndarray, word: str) -> str:
    """The always-pneumonia floor in words, from the test items' own prevalence."""
    positives, n = int(np.sum(labels)), len(labels)
    return (f"floor: always {word} (every test image called {word}) has accuracy = prevalence = {positives}/{n} = "
            f"{positives / n:.3f}, sensitivity 1, specificity 0, ROC-AUC 0.5 and average precision = prevalence; "
            "read accuracy and average precision against it, not against 0.5")  # fmt: skip


OVERLAP_CAVEAT = (
    "caveat, training overlap: a model pretrained or fine-tuned on any copy of the Kermany release (Mendeley Data "
    "doi:10.17632/rscbjbr9sj, Kaggle's 'Chest X-Ray Images (Pneumonia)', MedMNIST's PneumoniaMNIST, which is "
    "built from it) may have seen these test images or other films of their patients, and even a patient-disjoint "
    "one is in-distribution (one hospital's children); its figures are not a transfer result. This platform's own "
    "`TASK=pneumonia` runs train on the release's train folder; a model card that does not state its training "
    "data should be read as possibly overlapping"
)
"""The caveat every report carries (docs/benchmarks.md, "Pediatric pneumonia")."""


def overlap_notes(encoder: Encoder) -> list[str]:
    """The general caveat, then what is known of this model: the Kermany folder a platform run was trained on.

    Which of the two cases holds depends on that folder, so the note names it: a run trained on this release
    folder never saw its test folder (the Kermany adapter keeps it out of training and drops the train films of
    test patients); a run trained on another Kermany copy may have (a folder made from the official train split,
    as kermany-dev is, tests on images the official train split holds).
    """
    notes = [OVERLAP_CAVEAT]
    config = getattr(getattr(encoder, "finished", None), "config", None)
    source = None if config is None else config.get("data", {}).get("source", {})
    kermany = f"{KermanySource.__module__}.{KermanySource.__qualname__}"
    if source and source.get("_target_") == kermany:
        notes.append(f"this run was trained on the Kermany folder {source.get('root')}: if that is this release "
                     "folder, the Kermany adapter kept its test folder and the train films of its test patients out "
                     "of training (no test image or test patient seen, but in-distribution); if it is another copy, "
                     "it may have trained on these test images or their patients")  # fmt: skip
    return notes


def label_counts(subset: Subset, word: str) -> str:
    """``"500 images (141 normal / 359 pneumonia)"``: how a report line states a subset's size and label mix."""
    labels = subset.table["label"].value_counts().to_dict()
    return f"{len(subset)} images ({labels.get(0, 0)} normal / {labels.get(1, 0)} {word})"


def pools(root: str | Path, label: str = "Pneumonia") -> tuple[pd.DataFrame, pd.DataFrame]:
    """The release's (train pool, test pool) with :data:`COLUMNS`, from the Kermany adapter's manifest rows."""
    table = with_item_ids(KermanySource(str(root)).build())
    table = table.assign(label=table[label].astype(int))
    by_split = {name: part[COLUMNS].reset_index(drop=True) for name, part in table.groupby("official_split")}
    missing = {"train", "test"} - set(by_split)
    if missing:
        raise ValueError(f"{root}: no images in the official {' and '.join(sorted(missing))} folder(s)")
    return by_split["train"], by_split["test"]


class PneumoniaProtocol(Protocol):
    """Normal vs pneumonia on a Kermany release folder (``train/`` and ``test/``, each ``NORMAL/`` and ``PNEUMONIA/``).

    Args:
        name, description, seed, versions, bootstrap: see :class:`~apps.benchmarks.framework.protocol.Protocol`;
            a version's value is the number of test images drawn (``None``: the whole test pool).
        label: the finding (the output a platform classifier must have for zero-shot).
        prompts: ``positive`` and ``negative`` texts an image-text model compares each image with.
        train_size: training images drawn for the probe.
    """

    methods = {"zero_shot": "Zero-shot", "probe": "Linear probe", "always_pneumonia": "Always pneumonia (floor)",
               "zero_shot_run_threshold": "Zero-shot at the run's own threshold (not the card's rule)"}  # fmt: skip

    def __init__(self, name: str, description: str, seed: int, versions: Mapping[str, int | None], label: str,
                 prompts: Mapping[str, str], train_size: int, bootstrap: str = "stratified"):  # fmt: skip
        super().__init__(name, description, seed, versions, bootstrap)
        self.label, self.train_size = label, int(train_size)
        self.target = Target(label, prompts["positive"], prompts["negative"])

    @property
    def targets(self) -> tuple[Target, ...]:
        return (self.target,)

    @property
    def metrics(self) -> dict[str, str]:
        return dict(METRICS)

    def subset(self, table: pd.DataFrame, pool: int) -> Subset:
        targets = Targets("binary", (self.label,), table["label"].to_numpy().astype(int))
        return Subset(table, targets, id_column=ID_COLUMN, pool=pool)

    def draw_version(self, train_pool: pd.DataFrame, test_pool: pd.DataFrame,
                     version: str) -> tuple[Subset, Subset, pd.DataFrame]:  # fmt: skip
        """(test, train, removed) of one version: its test draw, then the leakage rule against those test images,
        then the training draw from what is left (a pool too small for its draw raises ``ValueError``)."""
        test_table = stratified_draw(test_pool, self.versions[version], "label", ID_COLUMN, self.seed)
        kept, removed = exclude_shared_patients(train_pool, test_table)
        train = self.subset(stratified_draw(kept, self.train_size, "label", ID_COLUMN, self.seed), len(kept))
        return self.subset(test_table, len(test_pool)), train, removed

    def draw(self, root: Path, version: str) -> Draw:
        """This version's subsets, with every version's training draw beside them for the overlap report.

        Another version that cannot be drawn on this folder (a pool too small for its draw) is reported as
        such rather than failing this one.
        """
        train_pool, test_pool = pools(root, self.label)
        test, train, removed = self.draw_version(train_pool, test_pool, version)
        trains: dict[str, Subset] = {}
        missing: list[str] = []
        for name in self.versions:
            try:
                trains[name] = train if name == version else self.draw_version(train_pool, test_pool, name)[1]
            except ValueError as error:
                missing.append(f"{name} cannot be drawn here ({error})")
        word = self.label.lower()
        description = [
            f"test: {label_counts(test, word)} of a pool of {test.pool}, fingerprint {test.fingerprint}",
            f"train (probe): {label_counts(train, word)} of a pool of {train.pool} after the leakage rule removed "
            f"{len(removed)} image(s) of {removed['patient_id'].nunique()} test patient(s) of this version, "
            f"fingerprint {train.fingerprint}",
            "training draw of each version: "
            + "; ".join([*(f"{name} {label_counts(subset, word)}, fingerprint {subset.fingerprint}"
                           for name, subset in trains.items()), *missing]),
        ]  # fmt: skip
        params: dict[str, object] = {"excluded_train_images": len(removed)}
        for name, subset in trains.items():
            labels = subset.table["label"].value_counts().to_dict()
            params.update({f"train_fingerprint_{name}": subset.fingerprint, f"train_normal_{name}": labels.get(0, 0),
                           f"train_{word}_{name}": labels.get(1, 0)})  # fmt: skip
        for first, second in itertools.combinations(trains, 2):
            shared = len(set(trains[first].ids) & set(trains[second].ids))
            params[f"train_shared_{first}_{second}"] = shared
            description.append(f"{shared} of {self.train_size} training images shared between {first} and {second}")
        description.append(f"item ids: the card's, pneumonia-<split>-<file stem> (e.g. {test.ids[0]}); the draws "
                           "rank on them")  # fmt: skip
        return Draw(version, {"train": train, "test": test}, params, description)

    def zero_shot(self, encoder: Encoder, features: Features) -> tuple[dict, dict[str, np.ndarray], list[str]]:
        """The card's zero-shot (the model's score, called by :data:`CARD_RULE`) and, for a run with validation
        thresholds, the extra at those thresholds: ``(method -> answers or None, scores.csv columns, notes)``."""
        word = self.label.lower()
        if not encoder.has_zero_shot(self.label):
            note = f"zero-shot: not available: {encoder.zero_shot_notes[self.label]}"
            return {"zero_shot": None, "zero_shot_run_threshold": None}, {}, [note]
        scores = features.zero_shot(self.label, "test")  # (N,)
        card = card_decisions(scores, encoder.zero_shot_kind)
        kind = encoder.zero_shot_kind
        notes = [f"zero-shot score: {kind}, {word} when above {CARD_RULE[kind]:g} (the card's rule; no threshold "
                 "is tuned)"]  # fmt: skip
        methods = {"zero_shot": Prediction(scores, card), "zero_shot_run_threshold": None}
        columns = {"zero_shot_score": scores, f"zero_shot_{word}": card.astype(int)}
        if run_thresholds(encoder):
            own = features.decisions(self.label, "test")
            methods["zero_shot_run_threshold"] = Prediction(scores, own)
            columns[f"zero_shot_{word}_run_threshold"] = own.astype(int)
            notes.append(f"zero-shot at the run's own threshold (an extra column, not the card's rule): {word} when "
                         f"{encoder.decision_rule(self.label)}; its ROC-AUC and average precision are the "
                         "zero-shot column's (they do not depend on a threshold)")  # fmt: skip
        else:
            notes.append("zero-shot at the run's own threshold: n/a, the model has no validation threshold (its own "
                         "call is the card's rule)")  # fmt: skip
        return methods, columns, notes

    def predict(self, draw: Draw, encoder: Encoder, features: Features) -> Outcome:
        zero_shot, columns, notes = self.zero_shot(encoder, features)
        probe = binary_probe(features, draw.subsets["train"].targets.labels, self.label)
        n = len(draw.test)
        floor = Prediction(np.ones(n), np.ones(n, dtype=bool))
        scores = draw.test.table[COLUMNS].copy()
        for column, values in {**columns, **probe.columns}.items():
            scores[column] = values
        methods = {"zero_shot": zero_shot["zero_shot"], "probe": probe.prediction, "always_pneumonia": floor,
                   "zero_shot_run_threshold": zero_shot["zero_shot_run_threshold"]}  # fmt: skip
        word = self.label.lower()
        notes = [notes[0], f"{probe.note}; {word} when its probability is above {PROBE_THRESHOLD:g}", *notes[1:],
                 floor_line(draw.test.targets.labels, word), *overlap_notes(encoder)]  # fmt: skip
        return Outcome(methods, scores, notes, dict(PROBE_PARAMS))

    def score(self, truth: Targets, prediction: Prediction) -> dict[str, float]:
        return binary_metrics(truth.labels, np.asarray(prediction.scores), np.asarray(prediction.decisions))

    def extras(self, draw: Draw, outcome: Outcome, table: pd.DataFrame, n_boot: int) -> Extras:
        """The table's values again under the card's metric names, beside the platform's ``<method>/<metric>``."""
        return Extras(metrics=card_metrics(table))
