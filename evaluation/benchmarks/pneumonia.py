"""The pediatric-pneumonia protocol (Kermany et al., Cell 2018): which images, drawn how, answered and scored how.

- Pools: the release's official ``test`` folder is the test pool (624 images: 234 normal, 390 pneumonia); the
  official ``train`` folder is the train pool (5,216: 1,341 / 3,875). The 16-image ``val`` folder is not used.
- Leakage rule: a train-pool image whose patient number (``person123``, ``IM-0115``, ``NORMAL2-IM-0383``; parsed
  by :func:`training.data.adapters.kermany.patient_key`) also appears anywhere in the test pool is excluded
  before drawing. The rule looks at the whole test pool, not only the drawn test images, so all versions share
  one training subset.
- Versions (``configs/benchmark/pneumonia.yaml``): ``full`` tests on the whole test pool; ``n100`` draws 100
  test images stratified by label. Both draw ``train_size`` (500) training images stratified by label. Draws
  are :func:`evaluation.benchmarks.sampling.stratified_draw` with the protocol's seed, ranking on the image id
  (the path relative to the data root, without its extension, e.g. ``test/PNEUMONIA/person1_virus_6``).
- Methods: zero-shot (the model's own score for the label and its own call: a platform run's validation
  threshold, 0.5 without one, or a prompt margin above 0) and a linear probe fit on the training draw
  (:mod:`evaluation.benchmarks.methods`); the binary metrics of :mod:`evaluation.benchmarks.metrics`, with a
  label-stratified bootstrap.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import numpy as np
import pandas as pd

from evaluation.benchmarks.encoders import Encoder, Target
from evaluation.benchmarks.methods import PROBE_PARAMS, binary_probe, binary_zero_shot
from evaluation.benchmarks.metrics import METRICS, binary_metrics
from evaluation.benchmarks.protocol import Draw, Features, Outcome, Prediction, Protocol, Subset, Targets
from evaluation.benchmarks.sampling import stratified_draw
from training.data.adapters.kermany import KermanySource

COLUMNS = ["image_id", "path", "patient_id", "label"]
"""The subset tables (and ``subsets/*.csv``): label 1 = pneumonia."""


def exclude_shared_patients(train: pd.DataFrame, test: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Split the train pool into (kept, removed): removed rows are those whose ``patient_id`` is in ``test``."""
    shared = train["patient_id"].isin(set(test["patient_id"]))
    return train[~shared].reset_index(drop=True), train[shared].reset_index(drop=True)


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
        name, description, seed, versions, bootstrap: see :class:`~evaluation.benchmarks.protocol.Protocol`;
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

    def draw(self, root: Path, version: str) -> Draw:
        """Leakage rule, then the stratified draws (a pool too small for its draw raises ``ValueError``)."""
        train_pool, test_pool = pools(root, self.label)
        kept, removed = exclude_shared_patients(train_pool, test_pool)
        train = self.subset(stratified_draw(kept, self.train_size, "label", "image_id", self.seed), len(kept))
        test_size = self.versions[version]
        test = self.subset(stratified_draw(test_pool, test_size, "label", "image_id", self.seed), len(test_pool))
        patients = set(removed["patient_id"])
        word = self.label.lower()

        def counts(subset: Subset) -> str:
            labels = subset.table["label"].value_counts().to_dict()
            return f"{len(subset)} images ({labels.get(0, 0)} normal / {labels.get(1, 0)} {word})"

        description = [
            f"test: {counts(test)} of a pool of {test.pool}, fingerprint {test.fingerprint}",
            f"train (probe): {counts(train)} of a pool of {train.pool} after the leakage rule removed {len(removed)} "
            f"image(s) of {len(patients)} test patient(s), fingerprint {train.fingerprint}",
        ]
        return Draw(version, {"train": train, "test": test}, {"excluded_train_images": len(removed)}, description)

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
