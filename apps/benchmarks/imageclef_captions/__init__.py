"""ImageCLEFmedical 2024 caption prediction on ROCOv2 as a benchmark: how close is a caption to the reference?

Items are one ROCOv2 split's images with their reference captions (not the 2024 test set, which the report
says). *Nearest caption* retrieves from a hash-drawn pool of training captions, so any model the platform can
load gets a captioner without a decoder; the most common caption is the floor. Metrics follow the organisers'
preprocessing (:mod:`apps.benchmarks.imageclef_captions.scoring`; docs/benchmarks.md, "Caption prediction");
a metric whose model weights are not on this machine is n/a with the reason. Per-caption values are computed
once and carried as the prediction's scores.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import numpy as np
import pandas as pd

from apps.benchmarks.framework.encoders import Encoder, Target
from apps.benchmarks.framework.protocol import Draw, Features, Outcome, Prediction, Protocol, Subset, Targets
from apps.benchmarks.framework.sampling import hash_order
from apps.benchmarks.framework.tables import find_table
from apps.benchmarks.imageclef_captions.scoring import (
    caption_scores,
    constant_caption,
    nearest_caption,
    read_captions,
)

OTHER_SET = ("ROCOv2's own {split} split, not the ImageCLEFmedical 2024 test set (17,237 images): the 2024 "
             "leaderboard's scores are on that set and not comparable with these")  # fmt: skip
"""The report's line on which images are scored, ``{split}`` the split: the one the 2024 task scored differs."""

METRICS = {
    "bertscore": "BERTScore F1 (primary)",
    "rouge1": "ROUGE-1 F (secondary)",
    "bleu1": "BLEU-1",
    "meteor": "METEOR",
    "cider": "CIDEr-D",
    "bleurt": "BLEURT",
    "clipscore": "CLIPScore",
    "refclipscore": "RefCLIPScore",
    "clinicalbleurt": "ClinicalBLEURT",
    "medbertscore": "MedBERTScore",
}


class CaptionProtocol(Protocol):
    """Caption prediction on a ROCOv2 release folder.

    Args:
        layout: ``captions`` (with ``{split}``), ``images`` (with ``{split}``) and ``extension``.
        train_size: pool images drawn from the training split (``None``: all).
        k: neighbours whose consensus caption is returned.
        bertscore_model: the organisers' BERTScore model; scored only when its weights are local.
    """

    methods = {"nearest": "Nearest training caption", "constant": "Most common caption"}

    def __init__(self, name: str, description: str, seed: int, versions: Mapping[str, str], layout: Mapping[str, str],
                 train_size: int | None, k: int, bertscore_model: str, bootstrap: str = "plain"):  # fmt: skip
        super().__init__(name, description, seed, versions, bootstrap)
        self.layout, self.train_size, self.k, self.bertscore_model = dict(layout), train_size, int(k), bertscore_model
        self._targets = (Target("caption", "a radiology image", "a radiology image"),)  # embeddings only

    @property
    def targets(self) -> tuple[Target, ...]:
        return self._targets

    @property
    def metrics(self) -> dict[str, str]:
        return dict(METRICS)

    def subset(self, root: Path, split: str, size: int | None) -> Subset:
        path = find_table(root, self.layout["captions"].format(split=split))
        if path is None:
            raise ValueError(f"no caption table {self.layout['captions'].format(split=split)} "
                             f"(configs/benchmark/{self.name}.yaml)")  # fmt: skip
        captions = read_captions(path)
        ids = sorted(captions)
        if size is not None and size < len(ids):
            ids = sorted(hash_order(ids, self.seed)[:size])
        folder, ext = self.layout["images"].format(split=split), self.layout["extension"]
        table = pd.DataFrame({"image_id": ids, "path": [f"{folder}/{i}{ext}" for i in ids]})
        missing = [p for p in table["path"] if not (root / p).is_file()]
        if missing:
            raise ValueError(f"{len(missing)} of {len(table)} {split} images not found under {root} "
                             f"(e.g. {missing[0]})")  # fmt: skip
        targets = Targets("multilabel", (), np.zeros((len(ids), 0), int), texts=tuple(captions[i] for i in ids))
        return Subset(table, targets, pool=len(captions))

    def draw(self, root: Path, version: str) -> Draw:
        split = self.versions[version]
        test, train = self.subset(root, split, None), self.subset(root, "train", self.train_size)
        description = [f"test: {OTHER_SET.format(split=split)}; {len(test)} captioned images, fingerprint "
                       f"{test.fingerprint}",
                       f"retrieval pool: {len(train)} of {train.pool} training images, fingerprint {train.fingerprint}"]  # fmt: skip
        return Draw(version, {"test": test, "train": train}, {"k": self.k}, description)

    def per_caption(self, draw: Draw, captions: list[str]) -> tuple[np.ndarray, dict[str, str]]:
        """``(N, M)`` per-caption values of :data:`METRICS` (NaN where n/a), and why each n/a one is."""
        ids = draw.test.ids
        result = caption_scores(dict(zip(ids, draw.test.targets.texts, strict=True)),
                                dict(zip(ids, captions, strict=True)), self.bertscore_model)  # fmt: skip
        columns = [np.asarray(result.per_caption.get(key, np.full(len(ids), np.nan)), dtype=float) for key in METRICS]
        return np.column_stack(columns), dict(result.not_computed)

    def predict(self, draw: Draw, encoder: Encoder, features: Features) -> Outcome:
        train = draw.subsets["train"]
        pool = list(train.targets.texts)
        nearest = nearest_caption(features.get("train").embeddings, pool, features.get("test").embeddings, self.k)
        constant = constant_caption(pool)
        methods, notes = {}, []
        for method, captions in (("nearest", list(nearest)), ("constant", [constant] * len(draw.test))):
            values, missing = self.per_caption(draw, captions)
            methods[method] = Prediction(values, texts=tuple(captions))
            notes += [f"{metric}: n/a ({why})" for metric, why in missing.items() if method == "nearest"]
        notes.append(f"nearest caption: cosine of the model's embeddings, consensus of {self.k} neighbour(s); "
                     f"most common caption: {constant!r}")  # fmt: skip
        scores = draw.test.table[["image_id"]].copy()
        scores["reference"] = list(draw.test.targets.texts)
        scores["nearest"] = list(nearest)
        return Outcome(methods, scores, notes)

    def score(self, truth: Targets, prediction: Prediction) -> dict[str, float]:
        values = np.asarray(prediction.scores, dtype=float)
        return {key: float(np.nanmean(values[:, k])) if np.isfinite(values[:, k]).any() else float("nan")
                for k, key in enumerate(METRICS)}  # fmt: skip
