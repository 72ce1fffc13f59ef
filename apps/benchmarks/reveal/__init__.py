"""The REVEAL-CXR protocol (RSNA 2025): a model against the readers' majority on 12 labels, beside the readers.

The studies are read by :mod:`~apps.benchmarks.reveal.reader_study`; each study's agreement level is its
stratum. The model answers each label with a score and its own call; its metrics and label kappa sit beside
the readers' label kappa (:mod:`~apps.benchmarks.reveal.agreement`) and rating kappa
(:mod:`~apps.benchmarks.reveal.ratings`), which are not comparable with each other. Demographics and acquisition
balance by subset are reported when the data allows. docs/benchmarks.md, "REVEAL-CXR", states the protocol, the
label mapping and the figures.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from apps.benchmarks.framework.encoders import Encoder, Target
from apps.benchmarks.framework.markdown import frame_markdown
from apps.benchmarks.framework.protocol import (
    BOOTSTRAPS,
    Draw,
    Extras,
    Features,
    Outcome,
    Prediction,
    Protocol,
    Subset,
    Targets,
)
from apps.benchmarks.reveal.acquisition import balance_report
from apps.benchmarks.reveal.agreement import agreement_plot, cohen_kappa, reader_agreement, verdicts
from apps.benchmarks.reveal.demographics import demographics, demographics_markdown
from apps.benchmarks.reveal.ratings import SCALES, WEIGHTS, constant_majority, rating_agreement
from apps.benchmarks.reveal.reader_study import (
    MISSING,
    ReaderStudy,
    ReaderTableLayout,
    ReleaseLayout,
    read_reader_table,
    read_release,
)
from evaluation.metric_registry import average_precision, roc_auc
from training.data.label_names import REVEAL_LABELS, REVEAL_OUTPUTS

METRICS: dict[str, str] = {
    "auroc": "AUROC", "ap": "AP", "sensitivity": "Sensitivity", "specificity": "Specificity", "f1": "F1",
    "label_kappa": "Label kappa",
}  # fmt: skip
"""Per-label metric key -> column title, in table order. AUROC and AP rank the scores; the rest judge the call.
The model's kappa is a *label* kappa (its 0/1 calls against the reference labels), named so beside the readers'
rating kappa, which it is not comparable with."""

POOLS = {"macro": "Macro (mean over labels)", "micro": "Micro (all pairs pooled)"}
ALL = "all"

PAPER_RATING_KAPPA = "0.622 [0.590, 0.651]"
"""REVEAL-CXR's readers' agreement (section 4.2), on its binary scale: "Agree mostly" merged with "Disagree"."""
PAPER_LABEL_KAPPAS = ("from airspace opacity 0.484 [0.440, 0.524] to hiatal hernia 0.809 [0.688, 0.902], most labels "
                      "0.744 to 0.809")  # fmt: skip
"""REVEAL-CXR's per-finding kappas: each reader's 0/1 labels against the majority labels (label kappas)."""

RATING_SCALES = {
    "binary": "binary (the paper's scale: Agree all vs Agree mostly or Disagree)",
    "three-level": "three-level (the platform's: Agree all / Agree mostly / Disagree as rated)",
}
"""Rating scale (:data:`~apps.benchmarks.reveal.ratings.SCALES`) -> its row title in the report."""


def slug(text: str) -> str:
    """A label or stratum as an MLflow key part: ``"pleural effusion" -> "pleural_effusion"``."""
    return text.replace(" ", "_")


def label_metrics(labels: np.ndarray, scores: np.ndarray, calls: np.ndarray) -> dict[str, float]:
    """The six metrics of one label on the items that have a reference (NaN scores: no ranking metrics)."""
    keep = labels != MISSING
    truth, score, call = labels[keep].astype(bool), scores[keep], calls[keep].astype(bool)
    if truth.size == 0:
        return dict.fromkeys(METRICS, float("nan"))
    ranked = np.isfinite(score).all()
    tp, fp, fn = int((truth & call).sum()), int((~truth & call).sum()), int((truth & ~call).sum())
    return {
        "auroc": roc_auc(truth, score) if ranked else float("nan"),
        "ap": average_precision(truth, score) if ranked else float("nan"),
        "sensitivity": tp / truth.sum() if truth.any() else float("nan"),
        "specificity": float((~call[~truth]).mean()) if (~truth).any() else float("nan"),
        "f1": 2 * tp / (2 * tp + fp + fn) if tp + fp + fn else float("nan"),
        "label_kappa": cohen_kappa(truth, call),
    }


def nanmean(values: list[float]) -> float:
    finite = [v for v in values if np.isfinite(v)]
    return float(np.mean(finite)) if finite else float("nan")


class RevealProtocol(Protocol):
    """REVEAL-CXR on a data root holding the release or a multi-reader table (see ``configs/benchmark/reveal.yaml``).

    Args:
        labels: benchmark label -> ``definition`` (the paper's, shown beside results) and ``prompt``; all 12
            labels, in benchmark order.
        reference: ``majority`` (the paper's) or ``adjudicated`` (a reader table's adjudicated labels).
        merge_agree_mostly: count "Agree mostly" as disagreement in a study's agreement level (the rating kappa is
            reported on both scales whatever this says).
        rating_weights: the three-level rating kappa's weighting: ``None`` (Cohen's unweighted), ``linear`` or
            ``quadratic``.
    """

    methods = {"model": "Model"}

    def __init__(self, name: str, description: str, seed: int, versions: Mapping[str, Any],
                 labels: Mapping[str, Mapping[str, str]], negative_prompt: str, release: Mapping[str, Any],
                 readers: Mapping[str, Any], reference: str = "majority", merge_agree_mostly: bool = True,
                 bootstrap: str = "plain", rating_weights: str | None = None,
                 demographics: Mapping[str, Any] | None = None):  # fmt: skip
        super().__init__(name, description, seed, versions, bootstrap)
        if tuple(labels) != REVEAL_LABELS:
            raise ValueError(f"benchmark {name}: labels must be the 12 benchmark labels in order: {REVEAL_LABELS}")
        if reference not in ("majority", "adjudicated"):
            raise ValueError(f"benchmark {name}: reference must be majority or adjudicated, got {reference!r}")
        self.definitions = {label: str(spec["definition"]) for label, spec in labels.items()}
        self._targets = tuple(
            Target(label, str(spec["prompt"]), negative_prompt, outputs=REVEAL_OUTPUTS[label][0])
            for label, spec in labels.items()
        )
        self.release = ReleaseLayout(**release)
        self.readers = ReaderTableLayout(**readers)
        for column, targets in self.readers.findings.items():
            unknown = [t for t in ([targets] if isinstance(targets, str) else targets) if t not in REVEAL_LABELS]
            if unknown:
                raise ValueError(f"benchmark {name}: readers.findings: {column} -> {unknown}, not benchmark labels")
        self.reference, self.merge_agree_mostly = reference, bool(merge_agree_mostly)
        if rating_weights not in WEIGHTS:
            raise ValueError(f"benchmark {name}: rating_weights must be one of {list(WEIGHTS)}, got {rating_weights!r}")
        self.rating_weights = rating_weights
        spec = dict(demographics or {})
        self.demographic_columns = dict(spec.get("columns") or {})
        self.demographic_numeric = tuple(spec.get("numeric") or ())
        unknown = [c for c in self.demographic_numeric if c not in self.demographic_columns]
        if unknown or set(spec) - {"columns", "numeric"}:
            raise ValueError(f"benchmark {name}: demographics takes columns and numeric (a subset of the columns); "
                             f"got keys {sorted(spec)}, numeric not among columns: {unknown}")  # fmt: skip
        # what a draw and its predictions leave for the extras (the hook receives the draw and outcome only)
        self.strata: tuple[str, ...] = ()
        self.study: ReaderStudy | None = None
        self.root = Path(".")
        self.encoder: Encoder | None = None

    @property
    def targets(self) -> tuple[Target, ...]:
        return self._targets

    @property
    def metrics(self) -> dict[str, str]:
        """``<stratum>/<label>/<metric>`` for every stratum of the last draw (``all`` first), label and pool."""
        out = {}
        for stratum in (ALL, *self.strata):
            for label in (*REVEAL_LABELS, *POOLS):
                for metric, title in METRICS.items():
                    out[f"{slug(stratum)}/{slug(label)}/{metric}"] = f"{stratum}: {label}: {title}"
        return out

    def read(self, root: Path) -> ReaderStudy:
        """The layout whose table the root holds: a reader table first (it has the most), then the release."""
        if (root / self.readers.table).is_file():
            return read_reader_table(root, self.readers, REVEAL_LABELS, self.reference)
        if (root / self.release.table).is_file():
            return read_release(root, self.release, REVEAL_LABELS, self.merge_agree_mostly)
        raise ValueError(f"neither a reader table ({self.readers.table}) nor a release label table "
                         f"({self.release.table}) is there (file names: configs/benchmark/reveal.yaml)")  # fmt: skip

    def draw(self, root: Path, version: str) -> Draw:
        study = self.read(root)
        self.study, self.root = study, root
        self.strata = tuple(sorted(set(study.table["stratum"]), reverse=True))
        targets = Targets(
            "multilabel", study.names, study.reference, readers=study.readers, reader_labels=study.reads,
            groups=study.table["stratum"].to_numpy(dtype=str),
        )  # fmt: skip
        test = Subset(study.table, targets, id_column="study_id", pool=len(study.table))
        counts = study.table["stratum"].value_counts().sort_index(ascending=False)
        description = [
            f"test: {len(test)} studies ({', '.join(f'{n} with {s} agreeing' for s, n in counts.items())}), "
            f"fingerprint {test.fingerprint}",
            f"labels with a reference here: {', '.join(study.names)}; "
            f"{len(study.absent)} of 12 without one (n/a below)",
            *study.notes,
        ]
        params = {"layout": "readers" if study.reads is not None else "release", "reference": self.reference,
                  "n_readers": len(study.readers), "labels_with_reference": len(study.names)}  # fmt: skip
        return Draw(version, {"test": test}, params, description)

    def mapping(self, encoder: Encoder) -> pd.DataFrame:
        """Per benchmark label: its definition, the model outputs behind its score (or why none) and the rule."""
        rows = []
        for target in self.targets:
            used = encoder.mapped.get(target.label, ())
            if encoder.has_zero_shot(target.label):
                source = ", ".join(used) if used else "prompt margin"
            elif target.outputs:  # the encoder's note lists the model's labels: too long for every row
                source = f"n/a: the model has none of {', '.join(target.outputs)}"
            else:
                source = "n/a: " + encoder.zero_shot_notes.get(target.label, "no score")
            rows.append({"label": target.label, "definition": self.definitions[target.label], "model output": source,
                         "mapping rule": REVEAL_OUTPUTS[target.label][1] if used else ""})  # fmt: skip
        return pd.DataFrame(rows)

    def predict(self, draw: Draw, encoder: Encoder, features: Features) -> Outcome:
        names = draw.test.targets.names
        self.encoder = encoder
        notes = []
        if not encoder.any_zero_shot:
            notes.append(f"model: no score for any benchmark label ({'; '.join(encoder.zero_shot_notes.values())})")
            return Outcome({"model": None}, draw.test.table[["study_id", "stratum"]].copy(), notes)
        scores = np.stack([features.zero_shot(label, "test") for label in names], axis=1)  # (N, K)
        calls = np.stack([features.decisions(label, "test") for label in names], axis=1)  # (N, K)
        missing = [label for label in names if not encoder.has_zero_shot(label)]
        if missing:
            notes.append(f"model: no score for {', '.join(missing)} (n/a in every table)")
        table = draw.test.table[["study_id", "stratum"]].copy()
        for k, label in enumerate(names):
            table[f"reference_{slug(label)}"] = draw.test.targets.labels[:, k]
            table[f"score_{slug(label)}"] = scores[:, k]
            table[f"call_{slug(label)}"] = calls[:, k].astype(int)
        return Outcome({"model": Prediction(scores, calls)}, table, notes)

    def score(self, truth: Targets, prediction: Prediction) -> dict[str, float]:
        labels, scores, calls = truth.labels, np.asarray(prediction.scores), np.asarray(prediction.decisions)
        groups = truth.groups if truth.groups is not None else np.full(len(truth), ALL)
        out = dict.fromkeys(self.metrics, float("nan"))
        for stratum in (ALL, *self.strata):
            rows = np.ones(len(truth), bool) if stratum == ALL else groups == stratum
            per_label = {name: label_metrics(labels[rows, k], scores[rows, k], calls[rows, k])
                         for k, name in enumerate(truth.names)}  # fmt: skip
            pooled = label_metrics(labels[rows].ravel(), scores[rows].ravel(), calls[rows].ravel())
            for metric in METRICS:
                for name, values in per_label.items():
                    out[f"{slug(stratum)}/{slug(name)}/{metric}"] = values[metric]
                out[f"{slug(stratum)}/macro/{metric}"] = nanmean([values[metric] for values in per_label.values()])
                out[f"{slug(stratum)}/micro/{metric}"] = pooled[metric]
        return out

    def report_table(self, result) -> str:
        """One table per stratum: labels as rows, metrics as columns, ``value [low, high]``, n/a with its reason."""
        table = result.table.set_index(["protocol", "metric"])
        absent = self.study.absent if self.study is not None else {}
        blocks = []
        for stratum in (ALL, *self.strata):
            items = (
                len(result.draw.test.table)
                if stratum == ALL
                else int((result.draw.test.table["stratum"] == stratum).sum())
            )
            title = "all studies" if stratum == ALL else f"studies with {stratum} readers agreeing"
            lines = [f"**Model vs the reference, {title}** ({items} studies; 95% CI)", "",
                     "| label | positives | " + " | ".join(METRICS.values()) + " |",
                     "|---" * (len(METRICS) + 2) + "|"]  # fmt: skip
            truth = result.draw.test.targets
            rows = np.ones(len(truth), bool) if stratum == ALL else truth.groups == stratum
            for label in (*REVEAL_LABELS, *POOLS):
                if label in absent and stratum != ALL:
                    continue  # said once, in the table of all studies
                if label in absent:
                    lines.append(f"| {label} | - | n/a: {absent[label]} |" + " |" * (len(METRICS) - 1))
                    continue
                if label in truth.names:
                    column = truth.labels[rows, truth.names.index(label)]
                    positives = f"{int((column == 1).sum())}/{int((column != MISSING).sum())}"
                else:
                    positives = ""
                cells = []
                for metric in METRICS:
                    key = ("model", f"{slug(stratum)}/{slug(label)}/{metric}")
                    row = table.loc[key] if key in table.index else None
                    cells.append(format_cell(row))
                lines.append(f"| {POOLS.get(label, label)} | {positives} | " + " | ".join(cells) + " |")
            blocks.append("\n".join(lines))
        return "\n\n".join(blocks)

    def extras(self, draw: Draw, outcome: Outcome, table: pd.DataFrame, n_boot: int) -> Extras:
        study = self.study
        extras = Extras()
        truth = draw.test.targets
        if self.encoder is not None:
            mapping = self.mapping(self.encoder)
            extras.tables["label_mapping"] = mapping
            outputs = getattr(self.encoder, "labels", None)  # a platform classifier's own output names
            listed = f"\n\nThe model's outputs: {', '.join(outputs)}." if outputs else ""
            extras.sections.append(
                "**Labels, definitions and the model's outputs**\n\n" + frame_markdown(mapping) + listed
            )
        resamples = BOOTSTRAPS[self.bootstrap][1](truth, n_boot, self.seed) if n_boot > 0 else (
            np.empty((0, len(truth)), int))  # fmt: skip
        if study is not None and study.reads is not None and len(study.readers) >= 2:
            self.label_agreement(study, truth, table, resamples, extras)
        if study is not None:
            extras.sections.append(self.rating_section(study, truth, resamples, extras))
            extras.sections.append(self.demographics_section(study, extras))
        extras.sections.append(acquisition_section(draw, self.root, extras))
        return extras

    def label_agreement(self, study: ReaderStudy, truth: Targets, table: pd.DataFrame, resamples: np.ndarray,
                        extras: Extras) -> None:  # fmt: skip
        """The readers' label kappa (0/1 reads vs the majority label), the model's beside it, and the verdicts."""
        readers = reader_agreement(study.reads, study.readers, truth.names, resamples)
        model = model_kappas(table, truth.names)
        extras.tables["readers_label_kappa"] = readers.rename(columns={"kappa": "label_kappa"})
        extras.tables["reader_blanks"] = study.blanks
        verdict = None
        if not model.empty:
            verdict = verdicts(model.set_index("finding")["kappa"], readers, reference="leave-one-out")
            extras.tables["label_kappa_verdicts"] = verdict
        extras.sections.append(readers_section(readers, verdict))
        extras.figures["readers_label_kappa"] = agreement_plot(
            readers, model, "leave-one-out", model_label="model (vs the full majority)"
        )
        log_pooled(readers, "label_kappa", extras)

    def rating_section(self, study: ReaderStudy, truth: Targets, resamples: np.ndarray, extras: Extras) -> str:
        """The readers' rating kappa on both scales (each rating vs the majority rating), or why there is none.

        The binary scale leads and carries the paper's figure beside it because that is the scale the paper reports
        on; the three-level and per-finding rows are the platform's and titled so, since the paper's per-finding
        kappas are label kappas.
        """
        title = "**Readers' rating kappa** (each reader's Agree all / Agree mostly / Disagree vs the majority rating)"
        if study.ratings is None:
            return f"{title}: n/a ({study.no_ratings}); the label kappa above is a different quantity"
        carries = truth.labels == 1
        tables = {scale: rating_agreement(study.ratings, study.raters, carries, truth.names, resamples, scale,
                                          self.rating_weights) for scale in SCALES}  # fmt: skip
        extras.tables["readers_rating_kappa"] = pd.concat(
            [table.assign(scale=scale) for scale, table in tables.items()], ignore_index=True
        ).rename(columns={"kappa": "rating_kappa"})
        for scale, table in tables.items():
            log_pooled(table, f"rating_kappa_{slug(scale).replace('-', '_')}", extras)
        pooled = {scale: table[table["reader"] == "all readers"].set_index(["reference", "finding"])
                  for scale, table in tables.items()}  # fmt: skip

        def cells(scale: str, finding: str) -> list[str]:
            return [format_cell({"value": row["kappa"], "ci_low": row["ci_low"], "ci_high": row["ci_high"]})
                    for row in (pooled[scale].loc[(reference, finding)] for reference in ("majority", "leave-one-out"))]  # fmt: skip

        weighting = "unweighted" if self.rating_weights is None else f"{self.rating_weights}-weighted"
        paper = {"binary": PAPER_RATING_KAPPA, "three-level": "not reported"}
        lines = [f"{title}: Cohen's kappa (the three-level one {weighting}; on two levels every weighting is the "
                 "unweighted kappa), all readers pooled, 95% CI over resampled studies. Not comparable with the "
                 "label kappa.", "",
                 "| rating kappa, overall | studies | vs full majority | vs the others' majority | REVEAL-CXR |",
                 "|---|---|---|---|---|"]  # fmt: skip
        for scale in SCALES:
            lines.append(f"| {RATING_SCALES[scale]} | {len(truth)} | " + " | ".join(cells(scale, "overall"))
                         + f" | {paper[scale]} |")  # fmt: skip
        lines += ["", "**Rating kappa per finding** (the platform's: a rating judges all of a study's labels at once, "
                  "so a finding's figure is the kappa on the studies that carry it; REVEAL-CXR's per-finding "
                  f"figures, {PAPER_LABEL_KAPPAS}, are label kappas against the majority labels, not these)", "",
                  "| finding | studies | binary vs full majority | binary vs the others' majority | three-level vs "
                  "full majority | three-level vs the others' majority |",
                  "|---|---|---|---|---|---|"]  # fmt: skip
        for k, finding in enumerate(truth.names):
            row = [*cells("binary", finding), *cells("three-level", finding)]
            lines.append(f"| {finding} | {int(carries[:, k].sum())} | " + " | ".join(row) + " |")
        constant = constant_majority(study.ratings)
        if constant is not None:
            lines += ["", f"The binary majority rating is {constant!r} on every study that has one, so kappa against "
                      "it is 0 (or undefined) by construction: the chance agreement equals the observed. REVEAL-CXR "
                      "kept only studies with at least two 'Agree all', so its 0.622 cannot come from the kept "
                      "studies alone: it needs the ratings of the studies reviewed before that selection."]  # fmt: skip
        ties = {scale: int(pooled[scale].loc[("majority", "overall"), "n_tie"]) for scale in SCALES}
        if any(ties.values()):
            lines += ["", "Ratings of studies without a majority rating, left out: "
                      + ", ".join(f"{n} on the {scale} scale" for scale, n in ties.items()) + "."]  # fmt: skip
        return "\n".join(lines)

    def demographics_section(self, study: ReaderStudy, extras: Extras) -> str:
        """Age, sex, race and patient class by subset (all studies when the layout names none)."""
        if not self.demographic_columns:
            return "**Demographics**: n/a (demographics.columns in configs/benchmark/reveal.yaml names none)"
        by = "subset" if "subset" in study.table.columns else None
        source = study.source or "the study table"
        frame = demographics(study.table, self.demographic_columns, self.demographic_numeric, by, source)
        extras.tables["demographics"] = frame
        scope = "by subset" if by else "of all studies (the layout names no subset column)"
        return f"**Demographics** {scope}, from {source}\n\n" + demographics_markdown(frame)


def log_pooled(agreement: pd.DataFrame, metric: str, extras: Extras) -> None:
    """MLflow metrics ``readers/<reference>/<finding>/<metric>`` (+ ``_ci_low``/``_ci_high``), all readers pooled."""
    pooled = agreement[agreement["reader"] == "all readers"]
    for row in pooled.itertuples():
        key = f"readers/{slug(row.reference)}/{slug(row.finding)}/{metric}"
        extras.metrics.update({key: row.kappa, f"{key}_ci_low": row.ci_low, f"{key}_ci_high": row.ci_high})


def format_cell(row) -> str:
    if row is None or not np.isfinite(row["value"]):
        return "n/a"
    if not (np.isfinite(row["ci_low"]) and np.isfinite(row["ci_high"])):
        return f"{row['value']:.3f}"
    return f"{row['value']:.3f} [{row['ci_low']:.3f}, {row['ci_high']:.3f}]"


def model_kappas(table: pd.DataFrame, names: tuple[str, ...]) -> pd.DataFrame:
    """The model's label kappa vs the reference per label and pooled ("overall"), in the readers' table's columns."""
    rows = []
    for label, key in [*((name, slug(name)) for name in names), ("overall", "micro")]:
        hit = table[(table["protocol"] == "model") & (table["metric"] == f"{ALL}/{key}/label_kappa")]
        if len(hit) and np.isfinite(hit["value"].iloc[0]):
            rows.append({"finding": label, "kappa": float(hit["value"].iloc[0]),
                         "ci_low": float(hit["ci_low"].iloc[0]), "ci_high": float(hit["ci_high"].iloc[0])})  # fmt: skip
    return pd.DataFrame(rows, columns=["finding", "kappa", "ci_low", "ci_high"])


def readers_section(readers: pd.DataFrame, verdict: pd.DataFrame | None) -> str:
    """Markdown: the pooled readers' label kappa per label against both references, then the verdicts."""
    lines = ["**Readers' label kappa** (Cohen's kappa of each reader's 0/1 reads with the majority label, 95% CI over "
             "resampled studies; against the majority of the other readers, and against the full majority)", "",
             "| label | all readers vs others' majority | all readers vs full majority | readers (range, vs others) |",
             "|---|---|---|---|"]  # fmt: skip
    pooled = readers[readers["reader"] == "all readers"].set_index(["reference", "finding"])
    individual = readers[(readers["reader"] != "all readers") & (readers["reference"] == "leave-one-out")]
    for finding in dict.fromkeys(readers["finding"]):
        cells = []
        for reference in ("leave-one-out", "majority"):
            row = pooled.loc[(reference, finding)] if (reference, finding) in pooled.index else None
            cells.append("n/a" if row is None else format_cell(
                {"value": row["kappa"], "ci_low": row["ci_low"], "ci_high": row["ci_high"]}))  # fmt: skip
        values = individual[individual["finding"] == finding]["kappa"].dropna()
        span = f"{values.min():.3f} to {values.max():.3f} ({len(values)} readers)" if len(values) else "n/a"
        lines.append(f"| {finding} | {cells[0]} | {cells[1]} | {span} |")
    lines += ["", f"REVEAL-CXR's per-finding kappas are label kappas of this kind against the majority labels: "
              f"{PAPER_LABEL_KAPPAS}. Its 0.622 is a rating kappa (binary scale), a different quantity."]  # fmt: skip
    if verdict is not None:
        lines += ["", "**Model vs readers** (the model's label kappa against the full majority, readers' against the "
                  "others' majority)", "", frame_markdown(verdict)]  # fmt: skip
    return "\n".join(lines)


def acquisition_section(draw: Draw, root: Path, extras: Extras) -> str:
    """Markdown: DICOM acquisition characteristics by subset, with Pearson's chi-square, or why there is none."""
    table = draw.test.table
    if not table["path"].str.lower().str.endswith((".dcm", ".dicom")).all():
        return "**Acquisition balance**: n/a (the studies are not DICOM files, so there are no acquisition tags)"
    groups = table["subset"] if "subset" in table.columns else ["all"] * len(table)
    frame, summary, markdown = balance_report([root / p for p in table["path"]], groups, "subset")
    extras.tables["acquisition"] = pd.concat([table[["study_id"]].reset_index(drop=True), frame], axis=1)
    if "subset" not in table.columns or table["subset"].nunique() < 2:
        return ("**Acquisition balance**: characteristics logged as acquisition.csv; no chi-square test (the layout "
                "names no subset column with two or more subsets)")  # fmt: skip
    extras.tables["acquisition_balance"] = summary
    return markdown
