"""The pediatric-pneumonia protocol (Kermany et al., Cell 2018): which images, drawn how, answered and scored how.

- Pools: the release's official ``test`` folder is the test pool (624 images: 234 normal, 390 pneumonia); the
  official ``train`` folder is the train pool (5,216: 1,341 / 3,875). The 16-image ``val`` folder is not used.
- Leakage rule: the version's test images are drawn first; a train-pool image whose patient number
  (``person123``, ``IM-0115``, ``NORMAL2-IM-0383``; parsed by :func:`training.data.adapters.kermany.patient_key`)
  appears among **that version's** test images is then excluded, and the training images are drawn from the
  rest. It is the pneumonia model card's rule (docs/benchmarks.md, "Pediatric pneumonia"), so the versions train
  on different sets wherever a test patient also has training films; because a result is only comparable with
  another on the same training draw, every draw reports each version's training fingerprint and label counts
  and how many training images the versions share, which costs only the other versions' draws (hashing ids,
  no image is read).
- Versions (``configs/benchmark/pneumonia.yaml``): ``full`` tests on the whole test pool; ``n100`` draws 100
  test images stratified by label. Both draw ``train_size`` (500) training images stratified by label. Draws
  are :func:`apps.benchmarks.framework.sampling.stratified_draw` with the protocol's seed, ranking on the image id
  (the path relative to the data root, without its extension, e.g. ``test/PNEUMONIA/person1_virus_6``).
- Methods: zero-shot (the model's own score for the label and its own call: a platform run's validation
  threshold, 0.5 without one, or a prompt margin above 0) and a linear probe fit on the training draw
  (:mod:`apps.benchmarks.framework.methods`); the binary metrics of :mod:`apps.benchmarks.framework.metrics`, with a
  label-stratified bootstrap. Each ``<method>/<metric>`` is also logged under the card's name
  (:data:`CARD_METRICS`), so the card's figures and a run's can be matched by name.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import pandas as pd

from apps.benchmarks.framework.encoders import Encoder, Target
from apps.benchmarks.framework.methods import PROBE_PARAMS, binary_probe, binary_zero_shot
from apps.benchmarks.framework.metrics import METRICS, binary_metrics
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

COLUMNS = ["image_id", "path", "patient_id", "label"]
"""The subset tables (and ``subsets/*.csv``): label 1 = pneumonia."""

CARD_METRICS = {"auroc": "roc_auc", "accuracy": "accuracy", "sensitivity": "sensitivity",
                "specificity": "specificity", "ap": "average_precision"}  # fmt: skip
"""Platform metric -> the pneumonia model card's metric stem; the card names a value ``<stem>_<method>``
(``roc_auc_zero_shot``, ``accuracy_probe``)."""


def exclude_shared_patients(train: pd.DataFrame, test: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Split the train pool into (kept, removed): removed rows are those whose ``patient_id`` is in ``test``."""
    shared = train["patient_id"].isin(set(test["patient_id"]))
    return train[~shared].reset_index(drop=True), train[shared].reset_index(drop=True)


def card_metrics(table: pd.DataFrame) -> dict[str, float]:
    """The metric table's point values under the card's names (``roc_auc_probe``); rows without a value left out."""
    rows = table[table["metric"].isin(list(CARD_METRICS))].dropna(subset=["value"])
    return {f"{CARD_METRICS[row.metric]}_{row.protocol}": float(row.value) for row in rows.itertuples()}


def label_counts(subset: Subset, word: str) -> str:
    """``"500 images (141 normal / 359 pneumonia)"``: how a report line states a subset's size and label mix."""
    labels = subset.table["label"].value_counts().to_dict()
    return f"{len(subset)} images ({labels.get(0, 0)} normal / {labels.get(1, 0)} {word})"


def pools(root: str | Path, label: str = "Pneumonia") -> tuple[pd.DataFrame, pd.DataFrame]:
    """The release's (train pool, test pool) with :data:`COLUMNS`, from the Kermany adapter's manifest rows."""
    table = KermanySource(str(root)).build()
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

    methods = {"zero_shot": "Zero-shot", "probe": "Linear probe"}

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
        return Subset(table, targets, pool=pool)

    def draw_version(self, train_pool: pd.DataFrame, test_pool: pd.DataFrame,
                     version: str) -> tuple[Subset, Subset, pd.DataFrame]:  # fmt: skip
        """(test, train, removed) of one version: its test draw, then the leakage rule against those test images,
        then the training draw from what is left (a pool too small for its draw raises ``ValueError``)."""
        test_table = stratified_draw(test_pool, self.versions[version], "label", "image_id", self.seed)
        kept, removed = exclude_shared_patients(train_pool, test_table)
        train = self.subset(stratified_draw(kept, self.train_size, "label", "image_id", self.seed), len(kept))
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
        return Draw(version, {"train": train, "test": test}, params, description)

    def predict(self, draw: Draw, encoder: Encoder, features: Features) -> Outcome:
        zero_shot = binary_zero_shot(encoder, features, self.label)
        probe = binary_probe(features, draw.subsets["train"].targets.labels, self.label)
        scores = draw.test.table[COLUMNS].copy()
        for column, values in {**zero_shot.columns, **probe.columns}.items():
            scores[column] = values
        return Outcome(
            {"zero_shot": zero_shot.prediction, "probe": probe.prediction},
            scores, [zero_shot.note, probe.note], dict(PROBE_PARAMS),
        )  # fmt: skip

    def score(self, truth: Targets, prediction: Prediction) -> dict[str, float]:
        return binary_metrics(truth.labels, np.asarray(prediction.scores), np.asarray(prediction.decisions))

    def extras(self, draw: Draw, outcome: Outcome, table: pd.DataFrame, n_boot: int) -> Extras:
        """The table's values again under the card's metric names, beside the platform's ``<method>/<metric>``."""
        return Extras(metrics=card_metrics(table))
