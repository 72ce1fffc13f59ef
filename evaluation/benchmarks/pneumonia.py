"""The pediatric-pneumonia protocol (Kermany et al., Cell 2018): which images, drawn how.

- Pools: the release's official ``test`` folder is the test pool (624 images: 234 normal, 390 pneumonia); the
  official ``train`` folder is the train pool (5,216: 1,341 / 3,875). The 16-image ``val`` folder is not used.
- Leakage rule: a train-pool image whose patient number (``person123``, ``IM-0115``, ``NORMAL2-IM-0383``; parsed
  by :func:`training.data.adapters.kermany.patient_key`) also appears anywhere in the test pool is excluded
  before drawing. The rule looks at the whole test pool, not only the drawn test images, so both versions share
  one training subset.
- Versions: ``full`` tests on the whole test pool; ``n100`` draws 100 test images stratified by label. Both draw
  500 training images stratified by label. Draws are :func:`evaluation.benchmarks.sampling.stratified_draw` with
  seed 20261006, ranking on the image id (the path relative to the data root, without its extension, e.g.
  ``test/PNEUMONIA/person1_virus_6``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd

from evaluation.benchmarks.sampling import fingerprint, stratified_draw
from training.data.adapters.kermany import KermanySource

NAME = "pneumonia"
SEED = 20261006
TRAIN_SIZE = 500
VERSIONS: dict[str, int | None] = {"full": None, "n100": 100}
"""Version -> number of test images drawn (``None``: the whole test pool)."""
LABEL = "Pneumonia"
POSITIVE_PROMPT = "a chest x-ray showing pneumonia"
NEGATIVE_PROMPT = "a normal chest x-ray"
COLUMNS = ["image_id", "path", "patient_id", "label"]


@dataclass(frozen=True)
class Subsets:
    """The drawn train and test images of one version, with what the leakage rule removed.

    Attributes:
        version: ``full`` or ``n100``.
        train: the training draw: ``image_id``, ``path`` (relative to the data root), ``patient_id``, ``label``
            (1 = pneumonia), sorted by ``image_id``.
        test: the test images, same columns.
        excluded_images: train-pool images removed by the leakage rule.
        excluded_patients: their patient numbers, sorted.
        pools: size of the train pool (after the leakage rule) and of the test pool.
    """

    version: str
    train: pd.DataFrame
    test: pd.DataFrame
    excluded_images: int = 0
    excluded_patients: tuple[str, ...] = ()
    pools: dict[str, int] = field(default_factory=dict)

    @property
    def fingerprints(self) -> dict[str, str]:
        """Identity of each subset (sorted ids with labels), reported with every result."""
        return {name: fingerprint(part["image_id"], part["label"]) for name, part in self.parts.items()}

    @property
    def parts(self) -> dict[str, pd.DataFrame]:
        return {"train": self.train, "test": self.test}


def exclude_shared_patients(train: pd.DataFrame, test: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Split the train pool into (kept, removed): removed rows are those whose ``patient_id`` is in ``test``."""
    shared = train["patient_id"].isin(set(test["patient_id"]))
    return train[~shared].reset_index(drop=True), train[shared].reset_index(drop=True)


def pools(root: str) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The release's (train pool, test pool) with :data:`COLUMNS`, from the Kermany adapter's manifest rows."""
    table = KermanySource(root).build()
    table = table.assign(label=table[LABEL].astype(int))
    by_split = {name: part[COLUMNS].reset_index(drop=True) for name, part in table.groupby("official_split")}
    missing = {"train", "test"} - set(by_split)
    if missing:
        raise ValueError(f"{root}: no images in the official {' and '.join(sorted(missing))} folder(s)")
    return by_split["train"], by_split["test"]


def build_subsets(root: str, version: str, seed: int = SEED, train_size: int = TRAIN_SIZE) -> Subsets:
    """Apply the protocol to a Kermany release folder: leakage rule, then the stratified draws.

    Args:
        root: folder holding ``train/{NORMAL,PNEUMONIA}`` and ``test/{NORMAL,PNEUMONIA}``.
        version: a key of :data:`VERSIONS`.
        seed: ranking seed (the protocol's is 20261006; other values are for studying draw variance only).
        train_size: training images drawn (500 in the protocol).

    Raises:
        ValueError: unknown version, or a pool too small for its draw.
    """
    if version not in VERSIONS:
        raise ValueError(f"unknown version {version!r}; choose one of {', '.join(VERSIONS)}")
    train_pool, test_pool = pools(root)
    kept, removed = exclude_shared_patients(train_pool, test_pool)
    return Subsets(
        version=version,
        train=stratified_draw(kept, train_size, "label", "image_id", seed),
        test=stratified_draw(test_pool, VERSIONS[version], "label", "image_id", seed),
        excluded_images=len(removed),
        excluded_patients=tuple(sorted(set(removed["patient_id"]))),
        pools={"train": len(kept), "test": len(test_pool)},
    )
