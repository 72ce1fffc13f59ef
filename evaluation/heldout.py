"""Held-out stability subsets: a fixed, seeded sample of one split judged with the test protocol (docs/rules.md §10).

The organisers evaluated every model a second time on a small held-out subset to see whether a ranking survives
a change of images; the platform draws the same kind of subset and scores it like ``test/`` (``heldout/...``).

Why the draw sorts the image ids first: the subset then depends only on which images the split holds and the
seed, not on the manifest's row order, so two copies of the same release draw the same cases. Why the subset
says whether the model saw it: training cases were fitted and validation cases chose the checkpoint, both
making the numbers optimistic; the report, terminal and a run tag say so.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from evaluation.conventions import Conventions, alternative_metrics
from evaluation.evaluate import MACROS, Evaluation, MetricSet, _prefixed
from evaluation.metrics import prevalence_baseline_map
from evaluation.prediction_columns import ID_COLUMN, TRUE_PREFIX
from evaluation.report import TRAINED_ON_CAVEAT
from evaluation.suite import compute_suite
from evaluation.tta import TTAPredictor

PREFIX = "heldout"
#: Where the record of the draw goes, relative to the run's artifact root.
ARTIFACT = "evaluation/heldout.json"
#: Run tag saying whether the model was fitted on the subset's cases (``"true"``: the numbers are optimistic).
TRAINED_ON_TAG = "cxrlt.heldout.trained_on"


@dataclass(frozen=True)
class HeldoutDraw:
    """Which cases a held-out subset holds and what the model knew of them.

    Attributes:
        available: how many images the draw was taken among (the split after any ``data.subset`` cut, or its
            ``pool``).
        rows: positions of the drawn cases in the split's dataset, in sorted-image-id order.
        pool: which of the split's rows the draw was taken among, where not all; empty for all of them.
        released_differs: drawn rows whose labels as released (what they are scored on) differ from the targets
            training used (docs/rules.md §12).
    """

    split: str
    seed: int
    requested: int
    available: int
    rows: np.ndarray
    image_ids: tuple[str, ...]
    pool: str = ""
    released_differs: int = 0

    @property
    def trained_on(self) -> bool:
        """Whether training fitted these cases."""
        return self.split == "train"

    @property
    def caveat(self) -> str | None:
        """What the reader must know before comparing these numbers with ``test/``; None when nothing."""
        if self.trained_on:
            return TRAINED_ON_CAVEAT
        if self.split == "val":
            return "the checkpoint was selected on the split these cases come from: mildly optimistic"
        return None

    def describe(self, with_caveat: bool = True) -> str:
        """One sentence: size, split (and pool) and seed, whether it fell short of the size, and the caveat."""
        among = f", drawn among its {self.available} {self.pool}" if self.pool else ""
        text = f"{len(self.image_ids)} cases of the {self.split} split{among} (seed {self.seed})"
        if len(self.image_ids) < self.requested:
            held = self.pool or "images"
            text += f"; the split has only {self.available} {held}, fewer than the {self.requested} asked for: all used"
        if self.released_differs:
            text += (f"; scored on the labels as released: {self.released_differs} of them have no finding and keep "
                     "their released Normal, which training masks")  # fmt: skip
        return text + (f"; {self.caveat}" if with_caveat and self.caveat else "")

    def record(self) -> dict:
        """The JSON artifact: enough to redraw or audit the subset."""
        return {"split": self.split, "seed": self.seed, "requested": self.requested, "available": self.available,
                "drawn": len(self.image_ids), "drawn_among": self.pool or "every row of the split",
                "trained_on": self.trained_on, "caveat": self.caveat, "released_labels_differ": self.released_differs,
                "image_ids": list(self.image_ids)}  # fmt: skip


@dataclass
class HeldoutSet(MetricSet):
    """The ``heldout`` metric set: a :class:`MetricSet` that carries its draw, so the report can say what it is."""

    draw: HeldoutDraw | None = None


def draw_rows(image_ids: Sequence[str], size: int, seed: int) -> np.ndarray:
    """Positions of ``size`` cases drawn without replacement, returned in sorted-image-id order.

    The ids are sorted as strings, then ``numpy.random.default_rng(seed).choice(n, size, replace=False)`` picks
    among the sorted ids; a split with at most ``size`` images gives all of them.

    Raises:
        ValueError: ``size`` below 1 or repeated image ids (a draw by id needs unique ids).
    """
    if size < 1:
        raise ValueError(f"evaluation.heldout.size must be at least 1, got {size}")
    ids = np.asarray([str(i) for i in image_ids])
    order = np.argsort(ids, kind="stable")
    if len(np.unique(ids)) != len(ids):
        raise ValueError("the held-out draw needs unique image ids; the split repeats some")
    if len(ids) <= size:
        return order
    picked = np.random.default_rng(seed).choice(len(ids), size=size, replace=False)
    return order[np.sort(picked)]


def evaluate_heldout(model, datamodule, cfg, evaluation: Evaluation) -> HeldoutSet | None:
    """Draw the configured subset and judge ``model`` on it with the test protocol; None when switched off.

    Same suite, conventions, resamples, threshold and groups as ``test/``; per source when the subset mixes
    centres. The cases are scored on the labels as released (``datamodule.released_targets``), as a test case is,
    not on the training targets a train-split case carries.
    """
    spec = cfg.evaluation.get("heldout")
    if spec is None or not spec.get("enabled", False):
        return None
    split = str(spec.split)
    if split not in datamodule.datasets:
        raise ValueError(
            f"evaluation.heldout.split={split!r}: the data module has splits {sorted(datamodule.datasets)}"
        )
    frame = datamodule.split_frame(split).reset_index(drop=True)
    rows = draw_rows(frame["image_id"], int(spec.size), int(spec.seed))
    dataset = datamodule.datasets[split]
    targets = datamodule.released_targets(split)[rows]  # (n, C)
    differs = int((targets != dataset.targets.numpy()[rows]).any(axis=1).sum())
    draw = HeldoutDraw(split, int(spec.seed), int(spec.size), len(frame), rows,
                       tuple(str(i) for i in frame["image_id"].iloc[rows]), released_differs=differs)  # fmt: skip
    images = np.stack([dataset.image(int(i)) for i in rows])  # un-augmented, whatever the split's transform
    probs = TTAPredictor(["identity"], batch_size=datamodule.batch_size).predict(model, images)
    conventions = Conventions.from_config(cfg.evaluation)
    suite = dict(labels=evaluation.labels, n_boot=cfg.evaluation.n_boot, seed=cfg.evaluation.seed,
                 **conventions.suite_kwargs())  # fmt: skip
    result = compute_suite(targets, probs, class_groups=evaluation.groups, **suite)
    metrics = _prefixed(PREFIX, result.metrics, macros_only=True)
    other = alternative_metrics(targets, probs, evaluation.labels, conventions, suite["n_boot"], suite["seed"])
    metrics.update({f"{PREFIX}/{key}": value for key, value in other.items()})
    metrics[f"{PREFIX}/prevalence_baseline_mAP"] = prevalence_baseline_map(targets)  # the card's floor of this row
    metrics[f"{PREFIX}/n_images"] = float(len(rows))
    metrics[f"{PREFIX}/trained_on"] = float(draw.trained_on)
    subset = frame.iloc[rows].reset_index(drop=True)
    if "source" in subset and subset["source"].nunique() > 1:
        for name, index in subset.groupby("source").indices.items():
            per_source = compute_suite(targets[index], probs[index], **suite).metrics
            metrics.update({f"{PREFIX}/source/{name}/{k}": v for k, v in per_source.items()
                            if k.split("_ci_")[0] in MACROS and np.isfinite(v)})  # fmt: skip
    return HeldoutSet(PREFIX, probs, result, metrics, draw=draw)


def predictions_frame(heldout: HeldoutSet, datamodule, labels: Sequence[str]) -> pd.DataFrame:
    """The subset's rows as ``predictions/heldout.csv``: ids (and source/view), probabilities, true labels."""
    draw = heldout.draw
    rows = datamodule.split_frame(draw.split).reset_index(drop=True).iloc[draw.rows].reset_index(drop=True)
    meta = rows[[c for c in (ID_COLUMN, "patient_id", "source", "view") if c in rows]]
    truth = datamodule.released_targets(draw.split)[draw.rows].astype(int)
    return pd.concat([meta, pd.DataFrame(heldout.probs, columns=list(labels)),
                      pd.DataFrame(truth, columns=[TRUE_PREFIX + n for n in labels])], axis=1)  # fmt: skip


def attach(evaluation: Evaluation, heldout: HeldoutSet, datamodule) -> None:
    """Make the subset one more metric set of ``evaluation``, so ``store`` logs it and the report shows it."""
    evaluation.sets[PREFIX] = heldout
    evaluation.metrics.update(heldout.metrics)
    evaluation.predictions[PREFIX] = predictions_frame(heldout, datamodule, evaluation.labels)


def write_record(draw: HeldoutDraw, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(draw.record(), indent=1) + "\n")
    return path


def tags(draw: HeldoutDraw) -> dict[str, str]:
    return {TRAINED_ON_TAG: str(draw.trained_on).lower(), "cxrlt.heldout.split": draw.split}


#: The record of Task 2's draw scored on the unseen classes (``heldout_unseen/...``, docs/zero-shot.md).
UNSEEN_ARTIFACT = "evaluation/heldout_unseen.json"
#: Which rows Task 2's draw is taken among (``HeldoutDraw.pool``).
UNSEEN_POOL = "rows labelled for an unseen class"


@dataclass
class UnseenHeldout:
    """The held-out draw of a zero-shot task, predicted on its unseen classes.

    Attributes:
        draw: which cases (same rule, seed and size as ``heldout/``).
        rows: the drawn manifest rows (ids, source), in draw order.
        targets: ``(n, U)`` their unseen-class labels, -1 where not labelled.
        probs: ``(n, U)`` the model's unseen-class probabilities.
    """

    draw: HeldoutDraw
    rows: pd.DataFrame
    targets: np.ndarray
    probs: np.ndarray


def draw_unseen(scorer, datamodule, cfg, unseen: Sequence[str]) -> UnseenHeldout | None:
    """Draw the configured held-out subset from the split as released and predict its unseen classes.

    The draw is taken from the full manifest's split (``datamodule.unseen_split``): a training rule that sets images
    aside must not take them out of an evaluation. And only among rows that carry a label of an unseen class: a row
    without one adds nothing to the figures but takes a place in the draw. None when the subset is switched off.

    Raises:
        ValueError: the full manifest has no row of the split, or none of its rows carries an unseen-class label.
    """
    spec = cfg.evaluation.get("heldout")
    if spec is None or not spec.get("enabled", False):
        return None
    split = str(spec.split)
    frame, targets, dataset = datamodule.unseen_split(list(unseen), split)
    if len(frame) == 0:
        raise ValueError(f"evaluation.heldout.split={split!r}: the full manifest has no {split} rows")
    labelled = np.flatnonzero((np.asarray(targets) >= 0).any(axis=1))  # (n,) rows with an unseen-class label
    if len(labelled) == 0:
        raise ValueError(f"evaluation.heldout.split={split!r}: none of the full manifest's {len(frame)} {split} rows "
                         f"has a label for an unseen class ({', '.join(unseen)}), so there is no development set "
                         "to draw from")  # fmt: skip
    rows = labelled[draw_rows(frame[ID_COLUMN].iloc[labelled], int(spec.size), int(spec.seed))]
    draw = HeldoutDraw(split, int(spec.seed), int(spec.size), len(labelled), rows,
                       tuple(str(i) for i in frame[ID_COLUMN].iloc[rows]), UNSEEN_POOL)  # fmt: skip
    images = np.stack([dataset.image(int(i)) for i in rows])  # (n, H, W) uint8, un-augmented
    probs = TTAPredictor(["identity"], batch_size=datamodule.batch_size).predict(scorer, images)  # (n, U)
    return UnseenHeldout(draw, frame.iloc[rows].reset_index(drop=True), np.asarray(targets)[rows], probs)
