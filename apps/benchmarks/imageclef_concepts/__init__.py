"""ImageCLEFmedical 2024 concept detection on ROCOv2 as a benchmark: which UMLS concepts (CUIs) does an image carry?

Items are one ROCOv2 split's images with their concept sets; ROCOv2's test split is not the 2024 leaderboard's
test set, so the report says so (:data:`OTHER_SET`). The model's concepts are set beside the frequency-prior
floor and scored by the organisers' rules (:mod:`apps.benchmarks.imageclef_concepts.scoring`; docs/benchmarks.md,
"Concept detection: the organisers' rules"). The per-image F1 values are computed once (in
:meth:`ConceptProtocol.predict`) and carried as the prediction's scores, so a bootstrap resample only averages
them.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from apps.benchmarks.framework.encoders import Encoder, Target
from apps.benchmarks.framework.protocol import Draw, Features, Outcome, Prediction, Protocol, Subset, Targets
from apps.benchmarks.framework.tables import find_table
from apps.benchmarks.imageclef_concepts.scoring import (
    frequency_prior,
    manual_vocabulary,
    per_image_f1,
    read_concepts,
    secondary_vocabulary,
)

METRICS = {"f1_primary": "F1, all concepts (primary)", "f1_secondary": "F1, manually validated concepts (secondary)"}

OTHER_SET = ("ROCOv2's own {split} split, not the ImageCLEFmedical 2024 test set (17,237 images): the 2024 "
             "leaderboard's scores are on that set and not comparable with these")  # fmt: skip
"""The report's line on which images are scored, ``{split}`` the split: the one the 2024 task scored differs."""


class ConceptProtocol(Protocol):
    """Concept detection on a ROCOv2 release folder.

    Args:
        layout: file names with ``{split}``: ``concepts``, ``manual``, ``names`` (CUI -> name, optional),
            ``images`` (the image folder) and ``extension``.
        min_count: a concept is asked about when the training split has it at least this often.
        secondary: the secondary score's vocabulary: a file stem of ``configs/benchmark/imageclef-secondary/``
            (``2024``, ``2025``) or ``manual`` (every concept of the manual tables).
        prompt: an image-text model's prompt, with ``{name}`` (the concept's name, or its CUI without a name file).
    """

    methods = {"model": "Model", "prior": "Frequency prior"}

    def __init__(self, name: str, description: str, seed: int, versions: Mapping[str, str], layout: Mapping[str, str],
                 min_count: int, secondary: str, prompt: str, negative_prompt: str, bootstrap: str = "plain"):  # fmt: skip
        super().__init__(name, description, seed, versions, bootstrap)
        self.layout, self.min_count, self.secondary = dict(layout), int(min_count), str(secondary)
        try:  # a named vocabulary is read now, so a wrong name fails before any data is read
            self.named = None if self.secondary == "manual" else secondary_vocabulary(self.secondary)
        except ValueError as error:
            raise ValueError(f"benchmark {name}: secondary: {error}") from None
        self.prompt, self.negative_prompt = prompt, negative_prompt
        self._targets: tuple[Target, ...] = ()
        self.train: dict[str, frozenset[str]] = {}
        self.manual: dict[str, frozenset[str]] | None = None
        self.allowed: frozenset[str] = frozenset()

    @property
    def targets(self) -> tuple[Target, ...]:
        return self._targets

    @property
    def metrics(self) -> dict[str, str]:
        return dict(METRICS)

    def table(self, root: Path, key: str, split: str) -> Path | None:
        return find_table(root, self.layout[key].format(split=split))

    def draw(self, root: Path, version: str) -> Draw:
        split = self.versions[version]
        train_path, test_path = self.table(root, "concepts", "train"), self.table(root, "concepts", split)
        if train_path is None or test_path is None:
            raise ValueError(f"no concept tables {self.layout['concepts'].format(split='train')} and "
                             f"{self.layout['concepts'].format(split=split)} (configs/benchmark/{self.name}.yaml)")  # fmt: skip
        self.train, truth = read_concepts(train_path), read_concepts(test_path)
        manual_path = self.table(root, "manual", split)
        self.manual = read_concepts(manual_path) if manual_path is not None else None
        if self.manual is not None:
            vocabulary = set(manual_vocabulary(self.manual))
            for other in ("train", "valid", "test"):
                path = self.table(root, "manual", other)
                if path is not None and other != split:
                    vocabulary |= set(manual_vocabulary(read_concepts(path)))
            self.allowed = self.named if self.named is not None else frozenset(vocabulary)
        counts = Counter(c for concepts in self.train.values() for c in concepts)
        kept = sorted(c for c, n in counts.items() if n >= self.min_count)
        names = self.concept_names(root)
        self._targets = tuple(Target(c, self.prompt.format(name=names.get(c, c)), self.negative_prompt, outputs=(c,))
                              for c in kept)  # fmt: skip
        ids = sorted(truth)
        folder, ext = self.layout["images"].format(split=split), self.layout["extension"]
        table = pd.DataFrame({"image_id": ids, "path": [f"{folder}/{i}{ext}" for i in ids]})
        missing = [p for p in table["path"] if not (root / p).is_file()]
        if missing:
            raise ValueError(f"{len(missing)} of {len(table)} {split} images not found under {root} (e.g. "
                             f"{missing[0]}); this benchmark scores a model on the images")  # fmt: skip
        targets = Targets("multilabel", (), np.zeros((len(ids), 0), int), concepts=tuple(truth[i] for i in ids))
        test = Subset(table, targets, pool=len(truth))
        description = [
            f"test: {OTHER_SET.format(split=split)}; {len(test)} images ({sum(1 for i in ids if truth[i])} with "
            f"concepts), fingerprint {test.fingerprint}",
            f"asked about: {len(kept)} concepts seen at least {self.min_count} times in {len(self.train)} training "
            f"images (of {len(counts)} there)",
            "secondary: "
            + (
                f"{len(self.allowed)} manually validated concepts ({self.secondary})"
                if self.manual is not None
                else "n/a (no manual table for this split)"
            ),  # fmt: skip
        ]
        return Draw(version, {"test": test}, {"concepts_asked": len(kept), "min_count": self.min_count}, description)

    def concept_names(self, root: Path) -> dict[str, str]:
        """CUI -> name from the release's mapping file, when it has one (``CUI,Canonical name``)."""
        path = find_table(root, self.layout.get("names", "cui_names.csv"))
        if path is None:
            return {}
        table = pd.read_csv(path, dtype=str, keep_default_na=False)
        return dict(zip(table.iloc[:, 0].str.strip().str.upper(), table.iloc[:, 1], strict=True))

    def per_image(self, draw: Draw, predicted: Sequence[frozenset[str]]) -> np.ndarray:
        """``(N, 2)`` per-image F1, primary and secondary (NaN where the organisers leave the image out)."""
        ids = draw.test.ids
        truth = dict(zip(ids, draw.test.targets.concepts, strict=True))
        run = dict(zip(ids, predicted, strict=True))
        _, primary = per_image_f1(truth, run)
        if self.manual is None:
            return np.column_stack([primary, np.full(len(ids), np.nan)])
        manual = {i: self.manual.get(i, frozenset()) for i in ids}
        _, secondary = per_image_f1(manual, run, allowed=set(self.allowed))
        return np.column_stack([primary, secondary])

    def predict(self, draw: Draw, encoder: Encoder, features: Features) -> Outcome:
        notes, methods, sets = [], {}, {}
        if encoder.any_zero_shot:
            calls = np.column_stack([features.decisions(t.label, "test") for t in self.targets])  # (N, K)
            labels = np.array([t.label for t in self.targets])
            sets["model"] = [frozenset(labels[row]) for row in calls]
            methods["model"] = Prediction(self.per_image(draw, sets["model"]), concepts=tuple(sets["model"]))
            answered = sum(encoder.has_zero_shot(t.label) for t in self.targets)
            notes.append(f"model: {answered} of {len(self.targets)} asked concepts are outputs of the model")
        else:
            methods["model"] = None
            notes.append("model: n/a (none of the asked concepts is an output of the model)")
        prior = frozenset(frequency_prior(self.train))
        sets["prior"] = [prior] * len(draw.test)
        methods["prior"] = Prediction(self.per_image(draw, sets["prior"]), concepts=tuple(sets["prior"]))
        notes.append(f"frequency prior: the {len(prior)} most common training concepts ({', '.join(sorted(prior))})")
        scores = draw.test.table[["image_id"]].copy()
        scores["true"] = [";".join(sorted(c)) for c in draw.test.targets.concepts]
        for method, predicted in sets.items():
            scores[f"{method}_concepts"] = [";".join(sorted(c)) for c in predicted]
        return Outcome(methods, scores, notes)

    def score(self, truth: Targets, prediction: Prediction) -> dict[str, float]:
        values = np.asarray(prediction.scores, dtype=float)
        return {key: float(np.nanmean(values[:, k])) if np.isfinite(values[:, k]).any() else float("nan")
                for k, key in enumerate(METRICS)}  # fmt: skip
