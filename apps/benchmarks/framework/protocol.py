"""What a benchmark protocol hands the shared runner, and what it gets back: the plug-in interface.

A protocol decides which items are scored (its draw), how a model's outputs become answers (its methods) and
how answers are scored (its metrics and bootstrap); the runner owns what is the same for every protocol. The
types are array-shaped and row-aligned with a subset's table, so one index array resamples every per-item field
at once, whatever the task's shape (one image or a prior/current pair; binary, multi-label or multi-class
targets, with readers, boxes, texts, concepts or groups). What does not fit one table of methods by metrics a
protocol returns as :class:`Extras`. See docs/benchmarks.md, "How a protocol plugs in".
"""

from __future__ import annotations

import dataclasses
import json
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal

import numpy as np
import pandas as pd

from apps.benchmarks.framework.bad_input import BadInput  # noqa: F401  (the plug-ins import it from here)
from apps.benchmarks.framework.encoders import Encoded, Encoder, Target
from apps.benchmarks.framework.sampling import fingerprint
from evaluation.bootstrap import resample_indices

TargetKind = Literal["binary", "multilabel", "multiclass"]
TARGET_KINDS = ("binary", "multilabel", "multiclass")


def take(value, index: np.ndarray):
    """Rows ``index`` of a per-item field: an array's rows, a tuple's entries, ``None`` kept."""
    if value is None:
        return None
    if isinstance(value, np.ndarray):
        return value[index]
    return tuple(value[i] for i in index)


@dataclass(frozen=True)
class Box:
    """One rectangle on an image: a reference finding location (grounding) or a model's answer.

    Coordinates are in pixels of a stated frame (``frame_width`` x ``frame_height``), because images reach models
    resized to a square: a box is only meaningful next to the frame it was drawn on. ``x``/``y`` are the top-left
    corner; ``reader`` is ``None`` for a single reference or a model; ``image`` is the image column of a pair it
    lies on.
    """

    finding: str
    x: float
    y: float
    w: float
    h: float
    frame_width: int
    frame_height: int
    reader: str | None = None
    image: str = "path"

    def in_frame(self, width: int, height: int) -> Box:
        """The same region in a ``width`` x ``height`` frame (each axis scaled on its own, as a stretch resize)."""
        sx, sy = width / self.frame_width, height / self.frame_height
        return dataclasses.replace(
            self, x=self.x * sx, y=self.y * sy, w=self.w * sx, h=self.h * sy, frame_width=width, frame_height=height
        )


@dataclass(frozen=True, eq=False)  # array and table fields: identity, not element-wise, equality
class Targets:
    """The reference answers of a subset's items, row-aligned with its table (``N`` items, ``K`` findings).

    Attributes:
        labels: ``(N,)`` for binary, ``(N, K)`` otherwise; 0/1, or class indices into :attr:`classes`; -1 = no
            reference for that finding. With readers, the consensus the protocol defines (e.g. their majority).
        classes: multi-class only, shared by every finding (``K = 1`` for a plain multi-class task).
        reader_labels: ``(N, R)`` (binary) or ``(N, R, K)`` per-reader labels, coded like :attr:`labels`.
        groups: ``(N,)`` per-item group labels as text; they travel with their items through a resample, so
            per-group results can be bootstrapped too.
    """

    kind: TargetKind
    names: tuple[str, ...]
    labels: np.ndarray
    classes: tuple[str, ...] = ()
    readers: tuple[str, ...] = ()
    reader_labels: np.ndarray | None = None
    boxes: tuple[tuple[Box, ...], ...] | None = None
    texts: tuple[str, ...] | None = None
    concepts: tuple[frozenset[str], ...] | None = None
    groups: np.ndarray | None = None

    ITEM_FIELDS: ClassVar[tuple[str, ...]] = ("labels", "reader_labels", "boxes", "texts", "concepts", "groups")

    def __post_init__(self) -> None:
        if self.groups is not None:  # text, so a fingerprint and a CSV read the same labels back
            object.__setattr__(self, "groups", np.asarray(self.groups).astype(str))
            if self.groups.ndim != 1:
                raise ValueError(f"groups must be (N,), got {self.groups.shape}")
        if self.kind not in TARGET_KINDS:
            raise ValueError(f"target kind must be one of {TARGET_KINDS}, got {self.kind!r}")
        shape = (len(self),) if self.kind == "binary" else (len(self), len(self.names))
        if self.labels.shape != shape:
            raise ValueError(
                f"{self.kind} labels of {len(self.names)} finding(s) must be {shape}, got {self.labels.shape}"
            )
        if (self.kind == "multiclass") != bool(self.classes):
            raise ValueError("class names are given exactly for multiclass targets")
        if bool(self.readers) != (self.reader_labels is not None):
            raise ValueError("reader names and reader labels come together")
        if self.reader_labels is not None and self.reader_labels.shape[:2] != (len(self), len(self.readers)):
            raise ValueError(f"reader labels must start with (N, R) = {(len(self), len(self.readers))}")
        for name in ("boxes", "texts", "concepts", "groups"):
            value = getattr(self, name)
            if value is not None and len(value) != len(self):
                raise ValueError(f"{name} has {len(value)} entries for {len(self)} items")

    def __len__(self) -> int:
        return int(self.labels.shape[0])

    def take(self, index: np.ndarray) -> Targets:
        """The targets of items ``index`` (repeats allowed: a bootstrap resample)."""
        return dataclasses.replace(self, **{name: take(getattr(self, name), index) for name in self.ITEM_FIELDS})

    def strata(self) -> np.ndarray:
        """``(N,)`` label of each item for a label-stratified bootstrap: only defined for a single finding."""
        if self.kind == "binary" or (self.kind == "multiclass" and len(self.names) == 1):
            return self.labels.reshape(len(self))
        raise ValueError(f"a {self.kind} target of {len(self.names)} findings has no one stratum per item; "
                         f"use bootstrap: plain")  # fmt: skip

    def row_keys(self) -> list:
        """Per item, what the subset fingerprint records next to its id.

        A bare binary label stays a number, so a binary subset's fingerprint is ``sampling.fingerprint(ids,
        labels)``; anything richer is one canonical JSON text per item.
        """
        if self.kind == "binary" and all(getattr(self, name) is None for name in self.ITEM_FIELDS[1:]):
            return list(self.labels)
        rows = []
        for i in range(len(self)):
            row = {"labels": np.asarray(self.labels[i]).tolist()}
            if self.reader_labels is not None:
                row["readers"] = dict(zip(self.readers, np.asarray(self.reader_labels[i]).tolist(), strict=True))
            if self.boxes is not None:
                row["boxes"] = sorted(json.dumps(dataclasses.asdict(box), sort_keys=True) for box in self.boxes[i])
            if self.texts is not None:
                row["text"] = self.texts[i]
            if self.concepts is not None:
                row["concepts"] = sorted(self.concepts[i])
            if self.groups is not None:
                row["group"] = str(self.groups[i])
            rows.append(json.dumps(row, sort_keys=True))
        return rows


@dataclass(frozen=True, eq=False)
class Prediction:
    """One method's answers on the test items, row-aligned with the test table (the :class:`Targets` shapes).

    Attributes:
        scores: ``(N,)`` binary, ``(N, K)`` multi-label, ``(N, K, C)`` multi-class class probabilities; ``None``
            for a method that only decides (a reader) or only writes (a captioner).
        decisions: the method's own calls, never a threshold tuned on the test items: booleans of the scores'
            shape, or ``(N, K)`` class indices (multi-class); ``None`` when it has none.
    """

    scores: np.ndarray | None = None
    decisions: np.ndarray | None = None
    boxes: tuple[tuple[Box, ...], ...] | None = None
    texts: tuple[str, ...] | None = None
    concepts: tuple[frozenset[str], ...] | None = None

    ITEM_FIELDS: ClassVar[tuple[str, ...]] = ("scores", "decisions", "boxes", "texts", "concepts")

    def take(self, index: np.ndarray) -> Prediction:
        """The answers for items ``index``."""
        return dataclasses.replace(self, **{name: take(getattr(self, name), index) for name in self.ITEM_FIELDS})


@dataclass(frozen=True, eq=False)
class Subset:
    """One drawn set of items (``train``, ``test``, ...).

    Attributes:
        table: one row per item, sorted canonically (a draw is a set), logged as ``subsets/<name>.csv``.
        images: the image-path columns of ``table``, relative to the data root (``("prior_path", "path")`` for a
            pair); every column is encoded.
        pool: how many items it was drawn from (logged as ``<name>_pool``); ``None`` when not a draw.
    """

    table: pd.DataFrame
    targets: Targets
    images: tuple[str, ...] = ("path",)
    id_column: str = "image_id"
    pool: int | None = None

    def __post_init__(self) -> None:
        missing = {self.id_column, *self.images} - set(self.table.columns)
        if missing:
            raise ValueError(f"subset table lacks column(s) {sorted(missing)}")
        if len(self.table) != len(self.targets):
            raise ValueError(f"{len(self.table)} items but {len(self.targets)} targets")

    def __len__(self) -> int:
        return len(self.table)

    @property
    def ids(self) -> list[str]:
        return self.table[self.id_column].astype(str).tolist()

    @property
    def fingerprint(self) -> str:
        """Identity of the subset (sorted ids with their targets), reported with every result."""
        return fingerprint(self.table[self.id_column], self.targets.row_keys())


@dataclass(frozen=True, eq=False)
class Draw:
    """A protocol applied to one data root at one version.

    Attributes:
        subsets: name -> subset, in report order. ``test`` is the one scored; others feed the methods (the
            linear probe's training draw).
        params: facts of the draw logged as MLflow params (e.g. how many images a leakage rule removed).
        description: report lines about the subsets, without bullets.
    """

    version: str
    subsets: dict[str, Subset]
    params: dict[str, Any] = field(default_factory=dict)
    description: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        if "test" not in self.subsets:
            raise ValueError("a draw needs a 'test' subset: the items it scores")

    @property
    def test(self) -> Subset:
        return self.subsets["test"]

    @property
    def fingerprints(self) -> dict[str, str]:
        return {name: subset.fingerprint for name, subset in self.subsets.items()}


@dataclass(frozen=True, eq=False)
class Features:
    """The model's outputs on every image of a draw, in each subset table's row order.

    One encoder answers every target, so each image is encoded once and its zero-shot outputs hold one column
    per target (``labels`` gives their order). ``cache_dir`` is the runner's model-output cache, for a protocol
    that computes more from the model (heatmaps); ``None``: nothing is stored.
    """

    encoded: Mapping[tuple[str, str], Encoded]
    labels: tuple[str, ...]
    cache_dir: str | Path | None = None

    def get(self, subset: str, column: str = "path") -> Encoded:
        return self.encoded[(subset, column)]

    def column(self, label: str) -> int:
        """The zero-shot column of target ``label``."""
        if label not in self.labels:
            raise KeyError(f"{label!r} is not a target of these features (targets: {', '.join(self.labels)})")
        return self.labels.index(label)

    def zero_shot(self, label: str, subset: str, column: str = "path") -> np.ndarray:
        """``(N,)`` zero-shot scores for ``label``: NaN where the model has none (see ``Encoder.has_zero_shot``)."""
        index, encoded = self.column(label), self.get(subset, column)
        if encoded.zero_shot is None:
            return np.full(len(encoded.embeddings), np.nan)
        return encoded.zero_shot[:, index]

    def decisions(self, label: str, subset: str, column: str = "path") -> np.ndarray:
        """``(N,)`` the model's own calls for ``label``: False where it has no score."""
        index, encoded = self.column(label), self.get(subset, column)
        if encoded.decisions is None:
            return np.zeros(len(encoded.embeddings), dtype=bool)
        return encoded.decisions[:, index]


@dataclass(eq=False)
class Outcome:
    """What a protocol's methods made of the model's outputs on the test items.

    Attributes:
        methods: method key -> its answers, or ``None`` when the model cannot do it (its table rows stay NaN,
            so every table of a protocol has the same shape). Keys match :attr:`Protocol.methods`.
        scores: one row per test item, logged as ``scores.csv``.
    """

    methods: dict[str, Prediction | None]
    scores: pd.DataFrame
    notes: list[str] = field(default_factory=list)
    params: dict[str, Any] = field(default_factory=dict)


@dataclass(eq=False)
class Extras:
    """What a protocol reports beyond its method x metric table (:meth:`Protocol.extras`).

    Attributes:
        tables: name -> table, logged as ``<name>.csv`` without its index (keep keys in columns); a name may
            hold a folder (``agreement/kappa``).
        figures: name -> matplotlib Figure, logged as ``<name>.png`` and closed.
        sections: markdown blocks printed after the report's notes (and so logged in ``table.md``).
        metrics: extra MLflow metrics; NaN values are left out, as undefined table values are.
    """

    tables: dict[str, pd.DataFrame] = field(default_factory=dict)
    figures: dict[str, Any] = field(default_factory=dict)
    sections: list[str] = field(default_factory=list)
    metrics: dict[str, float] = field(default_factory=dict)
    params: dict[str, Any] = field(default_factory=dict)


def _stratified(truth: Targets, n_boot: int, seed: int) -> np.ndarray:
    return resample_indices(len(truth), n_boot, seed, strata=truth.strata())


def _plain(truth: Targets, n_boot: int, seed: int) -> np.ndarray:
    return resample_indices(len(truth), n_boot, seed)


Resampler = Callable[[Targets, int, int], np.ndarray]
BOOTSTRAPS: dict[str, tuple[str, Resampler]] = {
    "stratified": ("stratified by label", _stratified),
    "plain": ("of the test items", _plain),
}
"""Bootstrap kind -> (report phrase, ``(targets, n_boot, seed) -> (n_boot, N)`` item indices). Stratified keeps
every resample's class counts (ratios keep their denominators, no resample lacks a class); plain resamples whole
items (a study with all its readers and findings), which is the choice for multi-label or multi-reader targets."""


class Protocol(ABC):
    """A fixed benchmark protocol, built from ``configs/benchmark/<name>.yaml``.

    The YAML's ``_target_`` names the subclass and its other keys are the constructor's arguments, so a
    protocol's settings (seed, sizes, prompts) live in one reviewed file and the code holds none of them.
    ``seed`` seeds the draw, any random initialisation of the model and the bootstrap; the first of ``versions``
    is the default. :attr:`methods` maps a method key (metric prefix ``<method>/<metric>``) to its column title.
    """

    methods: ClassVar[dict[str, str]] = {}

    def __init__(self, name: str, description: str, seed: int, versions: Mapping[str, Any],
                 bootstrap: str = "stratified"):  # fmt: skip
        if not versions:
            raise ValueError(f"benchmark {name}: no versions")
        if bootstrap not in BOOTSTRAPS:
            raise ValueError(f"benchmark {name}: bootstrap must be one of {sorted(BOOTSTRAPS)}, got {bootstrap!r}")
        self.name, self.description, self.seed = name, description, int(seed)
        self.versions, self.bootstrap = dict(versions), bootstrap

    @property
    def default_version(self) -> str:
        return next(iter(self.versions))

    @property
    @abstractmethod
    def targets(self) -> Sequence[Target]:
        """The findings the model is asked about, with their prompts and classifier outputs: one encoder answers
        them all, each a column of its zero-shot outputs, in this order."""

    @property
    @abstractmethod
    def metrics(self) -> dict[str, str]:
        """Metric key -> table row title, in table order: the keys :meth:`score` returns."""

    @abstractmethod
    def draw(self, root: Path, version: str) -> Draw:
        """The subsets of ``version`` on the data set under ``root`` (an existing folder, a known version).

        Raises ``ValueError`` (or :class:`BadInput`) when the folder does not hold the data set.
        """

    @abstractmethod
    def predict(self, draw: Draw, encoder: Encoder, features: Features) -> Outcome:
        """Each method's answers on the test items, from the encoder (which targets it can score, and how) and its
        outputs on the draw."""

    @abstractmethod
    def score(self, truth: Targets, prediction: Prediction) -> dict[str, float]:
        """Every metric of one method on some items (all test items, or a bootstrap resample of them).

        NaN where a metric is undefined on those items; such resamples are left out of the interval.
        """

    def extras(self, draw: Draw, outcome: Outcome, table: pd.DataFrame, n_boot: int) -> Extras:
        """What the method x metric ``table`` cannot hold (per-group tables, agreement, figures), computed once
        the runner has bootstrapped ``table`` (``runner.TABLE_COLUMNS``) with ``n_boot`` resamples. None by
        default."""
        return Extras()

    def report_table(self, result: Any) -> str | None:
        """The printed table for ``result`` (a ``runner.BenchmarkResult``), when the generic one (a row per metric,
        a column per method) would not read well, e.g. with hundreds of metrics; ``None`` keeps the generic one."""
        return None
