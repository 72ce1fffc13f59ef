"""The NIH grounding protocol: does a model's heatmap for a finding point at the radiologists' box?

The images with boxes (:func:`apps.benchmarks.framework.boxes.read_nih_boxes`) keep their boxes in the release's
1024-px frame, moved to the size the model sees whatever size the stored files have. Heatmaps
(:mod:`apps.benchmarks.framework.heatmaps`) are scored by :mod:`apps.benchmarks.framework.grounding` beside a
centre prior and seeded random maps, so a model's figures are read against what no model at all would reach;
an image keeps all its boxes in a resample. docs/benchmarks.md, "NIH grounding", states the protocol.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import numpy as np
import pandas as pd

from apps.benchmarks.framework.boxes import read_nih_boxes
from apps.benchmarks.framework.encoders import Encoder, Target
from apps.benchmarks.framework.grounding import POINTING_TOLERANCE, Example, overlay_figure, score_heatmaps
from apps.benchmarks.framework.protocol import (
    BadInput,
    Box,
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

GROUNDING_METRICS = {"pg": "Pointing game", "cnr": "CNR"}
OVERALL = "overall"


class GroundingProtocol(Protocol):
    """Boxes only, on an NIH release folder (``images/``, ``BBox_List_2017.csv``, ``Data_Entry_2017_v2020.csv``).

    Args:
        findings: finding (the box file's, in NIH spelling) -> the prompt an image-text model grounds.
        batch_size: images per heatmap pass (maps are reduced to scores batch by batch: all full-size maps would
            not fit in memory).
        tolerance: the pointing game's margin in pixels of the boxes' frame (0: the peak must lie in a box).
    """

    methods = {"model": "Model", "centre": "Centre prior", "random": "Random"}

    def __init__(self, name: str, description: str, seed: int, versions: Mapping[str, int | None],
                 findings: Mapping[str, str], negative_prompt: str, batch_size: int = 32, examples: int = 3,
                 bootstrap: str = "plain", tolerance: float = POINTING_TOLERANCE):  # fmt: skip
        super().__init__(name, description, seed, versions, bootstrap)
        if not float(tolerance) >= 0:
            raise BadInput(f"tolerance must be a distance in pixels of the boxes' frame, 0 or more; got {tolerance} "
                             f"(configs/benchmark/{name}.yaml)")  # fmt: skip
        self.tolerance = float(tolerance)
        self.findings = tuple(findings)
        self._targets = tuple(Target(f, prompt, negative_prompt) for f, prompt in findings.items())
        self.batch_size, self.examples = int(batch_size), int(examples)
        self.root = Path(".")
        self.shown: dict[str, list[Example]] = {}

    @property
    def targets(self) -> tuple[Target, ...]:
        return self._targets

    @property
    def metrics(self) -> dict[str, str]:
        out = {}
        for finding in (*self.findings, OVERALL):
            for metric, title in GROUNDING_METRICS.items():
                out[f"{metric}/{finding.lower()}"] = f"{title}, {finding}" if finding != OVERALL else f"{title}, all"
        return out

    def draw(self, root: Path, version: str) -> Draw:
        self.root = root
        boxes = read_nih_boxes(root)
        unknown = sorted(set(boxes["finding"]) - set(self.findings))
        if unknown:
            raise ValueError(f"box finding(s) {', '.join(unknown)} are not findings of this protocol "
                             f"({', '.join(self.findings)}; configs/benchmark/{self.name}.yaml)")  # fmt: skip
        images = (boxes.groupby(["image_id", "path"], sort=True)["finding"].agg(lambda f: "|".join(sorted(set(f))))
                  .reset_index().rename(columns={"finding": "findings"}))  # fmt: skip
        images["first_finding"] = images["findings"].str.split("|").str[0]
        size = self.versions[version]
        drawn = stratified_draw(images, size, "first_finding", "image_id", self.seed)
        per_image = {image: tuple(
            Box(r.finding, float(r.x), float(r.y), float(r.w), float(r.h), int(r.frame_width), int(r.frame_height))
            for r in rows.itertuples()) for image, rows in boxes.groupby("image_id")}  # fmt: skip
        labels = np.array([[int(f in row.split("|")) for f in self.findings] for row in drawn["findings"]])
        targets = Targets("multilabel", self.findings, labels, boxes=tuple(per_image[i] for i in drawn["image_id"]))
        test = Subset(drawn[["image_id", "path", "findings"]], targets, pool=len(images))
        counts = ", ".join(f"{f} {int(labels[:, k].sum())}" for k, f in enumerate(self.findings))
        description = [f"test: {len(test)} images of {len(images)} with boxes ({int(labels.sum())} image-finding "
                       f"pairs: {counts}), fingerprint {test.fingerprint}",
                       f"{sum(len(b) for b in targets.boxes)} boxes in the release's 1024-px frame, moved to the "
                       f"size each model sees"]  # fmt: skip
        return Draw(version, {"test": test}, {"n_boxes": sum(len(b) for b in targets.boxes)}, description)

    def predict(self, draw: Draw, encoder: Encoder, features: Features) -> Outcome:
        test = draw.test
        grounded = score_heatmaps(encoder, self.root, test.table["path"].tolist(), test.targets.boxes, self.findings,
                                  self.seed, self.batch_size, self.examples, self.tolerance,
                                  cache_dir=features.cache_dir)  # fmt: skip
        self.shown = grounded.examples
        scores = test.table[["image_id", "findings"]].copy()
        model = grounded.methods["model"]
        for j, finding in enumerate(self.findings):
            if model is not None:
                scores[f"pg_{finding.lower()}"], scores[f"cnr_{finding.lower()}"] = model[:, j, 0], model[:, j, 1]
        methods = {key: None if values is None else Prediction(values) for key, values in grounded.methods.items()}
        return Outcome(methods, scores, grounded.notes, {"heatmap_size": encoder.image_size})

    def score(self, truth: Targets, prediction: Prediction) -> dict[str, float]:
        values = np.asarray(prediction.scores)  # (N, K, 2)
        out = {}
        for j, finding in enumerate((*self.findings, OVERALL)):
            picked = values[:, j] if finding != OVERALL else values.reshape(-1, 2)
            for m, metric in enumerate(GROUNDING_METRICS):
                column = picked[:, m]
                finite = column[np.isfinite(column)]
                out[f"{metric}/{finding.lower()}"] = float(finite.mean()) if finite.size else float("nan")
        return out

    def extras(self, draw: Draw, outcome: Outcome, table: pd.DataFrame, n_boot: int) -> Extras:
        extras = Extras()
        for finding, shown in self.shown.items():
            if shown:
                images, maps, boxes, titles = zip(*shown, strict=True)
                extras.figures[f"overlays_{finding.lower()}"] = overlay_figure(images, maps, boxes,
                                                                               [f"{finding}: {t}" for t in titles])  # fmt: skip
        return extras
