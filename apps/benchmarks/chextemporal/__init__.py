"""The CheXTemporal protocol: how did a finding change between the prior and the current film?

- Items: (prior film, current film, finding) with a progression label. Three sources, recognised by what the data
  root holds (file names in ``configs/benchmark/chextemporal.yaml``):

  - the CheXTemporal release (a pair manifest: five classes new / worse / stable / improved / resolved);
  - an NIH ChestX-ray14 folder (``labels.csv``): consecutive follow-ups of a patient, NIH's report-mined labels
    moved to CheXpert names (:data:`training.data.label_names.CHEXPERT_OUTPUTS`), coarse classes new / persisting
    / resolved (:func:`apps.benchmarks.chextemporal.pairs.nih_followup_pairs`);
  - covid-temporal: consecutive films, worse / stable / improved from the change of the raters' mean severity
    score (:func:`apps.benchmarks.chextemporal.pairs.covid_pairs`; only pairs with both scores are labelled).

- Splits: patient-disjoint train / validation / test (:func:`apps.benchmarks.chextemporal.pairs.patient_split`, seeded).
- Methods (:mod:`apps.benchmarks.chextemporal.progression`): zero-shot for image-text models (the difference of the two
  films' embeddings against a prompt bank per class); a rule on the model's per-finding scores of the two films
  with thresholds fitted on the validation pairs; a progression head trained on the training pairs' frozen
  embeddings; and the majority class of the training pairs as the floor.
- Metrics: accuracy, macro-F1, accuracy per class and per finding, with 1,000 resamples of test pairs; confusion
  matrices as artifacts.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from apps.benchmarks.chextemporal.pairs import (
    COARSE,
    PROGRESSION,
    covid_pairs,
    nih_followup_pairs,
    patient_split,
    read_pair_manifest,
)
from apps.benchmarks.chextemporal.progression import (
    apply_rule,
    class_prompts,
    class_text_embeddings,
    confusion,
    fit_progression_head,
    fit_rule,
    load_prompt_bank,
    majority_floor,
    predict_head,
    progression_metrics,
    zero_shot_progression,
)
from apps.benchmarks.framework.boxes import PAIR_IMAGES, read_pair_boxes
from apps.benchmarks.framework.encoders import Encoder, Target
from apps.benchmarks.framework.grounding import grounding_table, overlay_figure, score_heatmaps
from apps.benchmarks.framework.markdown import frame_markdown
from apps.benchmarks.framework.protocol import (
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
from training.data.label_names import CHEXPERT_OUTPUTS, CHEXTEMPORAL_FINDINGS

COVID_CLASSES = ("worse", "stable", "improved")
PAIR_TABLE = ["pair_id", "patient_id", "prior_path", "path", "finding", "progression", "source", "split"]


class ChexTemporalProtocol(Protocol):
    """Progression on pairs (see the module docstring).

    Args:
        name, description, seed, versions, bootstrap: see :class:`~apps.benchmarks.framework.protocol.Protocol`.
        prompts: finding -> the prompt an image-text model scores one film with (the rule's input).
        negative_prompt: its contrast.
        splits: split -> share of patients (train, val, test).
        release: file names of the CheXTemporal release (``manifest``: the pair table).
        nih_labels: the NIH release table (``Data_Entry_2017_v2020.csv``).
        covid: covid-temporal settings: ``score`` (opacity | geographic_extent) and ``threshold``.
        prompt_bank: the progression prompt bank (``configs/text/progression.yaml``).
    """

    methods = {"zero_shot": "Zero-shot (prompt bank)", "rule": "Rule (fit on validation)", "head": "Trained head",
               "majority": "Majority class"}  # fmt: skip

    def __init__(self, name: str, description: str, seed: int, versions: Mapping[str, Any],
                 prompts: Mapping[str, str], negative_prompt: str, splits: Mapping[str, float],
                 release: Mapping[str, str], nih_labels: str, covid: Mapping[str, Any], prompt_bank: str,
                 bootstrap: str = "plain"):  # fmt: skip
        super().__init__(name, description, seed, versions, bootstrap)
        if tuple(prompts) != CHEXTEMPORAL_FINDINGS:
            raise ValueError(f"benchmark {name}: prompts must list the 11 findings in order: {CHEXTEMPORAL_FINDINGS}")
        self._targets = tuple(Target(f, p, negative_prompt, outputs=CHEXPERT_OUTPUTS[f][0]) for f, p in prompts.items())
        self.splits, self.release, self.nih_labels = dict(splits), dict(release), nih_labels
        self.covid, self.prompt_bank = dict(covid), prompt_bank
        self.classes: tuple[str, ...] = PROGRESSION
        self.findings: tuple[str, ...] = ()
        self.source = ""
        # what a draw and its predictions leave for the extras (the hook receives the draw and outcome only)
        self.root, self.boxes, self.encoder = Path("."), None, None

    @property
    def targets(self) -> tuple[Target, ...]:
        return self._targets

    @property
    def metrics(self) -> dict[str, str]:
        out = {"accuracy": "Accuracy", "macro_f1": "Macro-F1"}
        out.update({f"accuracy/{c}": f"Accuracy, {c}" for c in self.classes})
        out.update({f"accuracy/{f}": f"Accuracy, {f}" for f in self.findings})
        return out

    def pairs(self, root: Path) -> tuple[pd.DataFrame, tuple[str, ...], str]:
        """The labelled pairs of the source the root holds, their class set and the source's name."""
        self.boxes = None
        if (root / self.release["manifest"]).is_file():
            table = read_pair_manifest(root / self.release["manifest"], root, CHEXTEMPORAL_FINDINGS, PROGRESSION)
            if self.release.get("boxes") and (root / self.release["boxes"]).is_file():
                self.boxes = read_pair_boxes(root / self.release["boxes"], table, CHEXTEMPORAL_FINDINGS)
            return table, PROGRESSION, "chextemporal"
        if (root / "pairs.csv").is_file() and (root / "metadata.csv").is_file():
            table = covid_pairs(root, threshold=float(self.covid["threshold"]), score=str(self.covid["score"]))
            return table, COVID_CLASSES, "covid-temporal"
        if (root / self.nih_labels).is_file():  # the release's table: its Follow-up # is in time order
            labels = pd.read_csv(root / self.nih_labels, dtype={"Patient ID": str, "Image Index": str})
            columns = {finding: outputs for finding, (outputs, _) in CHEXPERT_OUTPUTS.items()}
            pairs = nih_followup_pairs(labels, CHEXTEMPORAL_FINDINGS, source_file=self.nih_labels, columns=columns)
            return pairs, COARSE, "nih"
        raise ValueError(f"no CheXTemporal manifest ({self.release['manifest']}), covid-temporal pairs.csv or NIH "
                         f"{self.nih_labels} there")  # fmt: skip

    def draw(self, root: Path, version: str) -> Draw:
        table, classes, source = self.pairs(root)
        table = table[table["progression"].fillna("").astype(str) != ""].reset_index(drop=True)
        if table.empty:
            raise ValueError(f"no labelled pairs from the {source} source")
        table = patient_split(table, self.splits, self.seed)
        self.classes, self.source, self.root = classes, source, root
        self.findings = tuple(f for f in CHEXTEMPORAL_FINDINGS if f in set(table["finding"]))
        size = self.versions[version]
        subsets, lines = {}, []
        for split in ("train", "val", "test"):
            part = table[table["split"] == split].sort_values("pair_id", ignore_index=True)
            if split == "test" and size is not None:
                part = part.head(int(size))
            labels = part["progression"].map({c: i for i, c in enumerate(classes)}).to_numpy().reshape(-1, 1)
            targets = Targets("multiclass", ("progression",), labels.astype(int), classes=classes,
                              groups=part["finding"].to_numpy(dtype=str), boxes=self.pair_boxes(part))  # fmt: skip
            subsets[split] = Subset(part[PAIR_TABLE].reset_index(drop=True), targets, images=("prior_path", "path"),
                                    id_column="pair_id", pool=len(table))  # fmt: skip
            counts = part["progression"].value_counts()
            lines.append(f"{split}: {len(part)} pairs of {part['patient_id'].nunique()} patients "
                         f"({', '.join(f'{c} {int(counts.get(c, 0))}' for c in classes)})")  # fmt: skip
        if min(len(s) for s in subsets.values()) == 0:
            raise ValueError(f"a split is empty ({'; '.join(lines)}): too few patients for {self.splits}")
        params = {"source": source, "classes": ",".join(classes), "findings": ",".join(self.findings)}
        return Draw(version, {"test": subsets["test"], "train": subsets["train"], "val": subsets["val"]}, params,
                    [f"source: {source}; patient-disjoint splits (seed {self.seed})", *lines])  # fmt: skip

    def pair_boxes(self, part: pd.DataFrame) -> tuple[tuple[Box, ...], ...] | None:
        """Per pair, its finding's boxes on either film (``Box.image`` names the film's column), when the release
        has boxes."""
        if self.boxes is None:
            return None
        grouped = {key: rows for key, rows in self.boxes.groupby(["pair_id", "finding"])}
        out = []
        for pair, finding in zip(part["pair_id"], part["finding"], strict=True):
            rows = grouped.get((pair, finding), self.boxes.iloc[:0])
            out.append(tuple(Box(r.finding, r.x, r.y, r.w, r.h, int(r.frame_width), int(r.frame_height),
                                 image=PAIR_IMAGES[r.image]) for r in rows.itertuples()))  # fmt: skip
        return tuple(out)

    def item_scores(self, subset: Subset, name: str, column: str, features: Features) -> np.ndarray:
        """Each pair's score for its own finding on one film (NaN where the model has none for it)."""
        out = np.full(len(subset), np.nan)
        findings = subset.table["finding"].to_numpy()
        for finding in self.findings:
            rows = findings == finding
            out[rows] = features.zero_shot(finding, name, column)[rows]
        return out

    def finding_codes(self, subset: Subset) -> np.ndarray:
        """One-hot finding of each pair, so one head serves every finding."""
        findings = subset.table["finding"].to_numpy()
        return np.stack([(findings == f).astype(np.float32) for f in self.findings], axis=1)

    def predict(self, draw: Draw, encoder: Encoder, features: Features) -> Outcome:
        test, train, val = draw.test, draw.subsets["train"], draw.subsets["val"]
        self.encoder = encoder
        classes = list(self.classes)
        names = lambda subset: np.asarray(classes)[subset.targets.labels[:, 0]]  # noqa: E731
        notes, methods = [], {}
        as_prediction = lambda predicted: Prediction(  # noqa: E731
            decisions=np.array([classes.index(c) for c in predicted]).reshape(-1, 1)
        )
        # the rule: the model's own per-finding scores of the two films
        p_prior_val, p_cur_val = (self.item_scores(val, "val", c, features) for c in ("prior_path", "path"))
        p_prior, p_cur = (self.item_scores(test, "test", c, features) for c in ("prior_path", "path"))
        usable = np.isfinite(p_prior_val) & np.isfinite(p_cur_val)
        if usable.any() and np.isfinite(p_prior).any():
            rule = fit_rule(p_prior_val[usable], p_cur_val[usable], names(val)[usable], classes)
            predicted = np.array(apply_rule(np.nan_to_num(p_prior), np.nan_to_num(p_cur), rule, classes), dtype=object)
            floor = majority_floor(names(train), len(test), classes)
            missing = ~(np.isfinite(p_prior) & np.isfinite(p_cur))
            predicted[missing] = floor[missing]
            methods["rule"] = as_prediction(predicted)
            notes.append(f"rule: present at score >= {rule.present:.3g}, change beyond {rule.delta:.3g}, fitted on "
                         f"{int(usable.sum())} validation pairs"
                         + (f"; {int(missing.sum())} test pairs without a score take the majority class" if missing.any() else ""))  # fmt: skip
        else:
            methods["rule"] = None
            notes.append("rule: n/a (the model has no score for these findings)")
        # zero-shot: image-text models only
        if encoder.embed_texts is not None:
            bank = load_prompt_bank(self.prompt_bank)
            prior_emb, cur_emb = features.get("test", "prior_path").embeddings, features.get("test", "path").embeddings
            scores = np.full((len(test), len(classes)), np.nan)
            findings = test.table["finding"].to_numpy()
            for finding in self.findings:
                rows = findings == finding
                text = class_text_embeddings(class_prompts(bank, finding, classes), encoder.embed_texts)
                scores[rows] = zero_shot_progression(prior_emb[rows], cur_emb[rows], text)
            methods["zero_shot"] = as_prediction(np.asarray(classes)[scores.argmax(axis=1)])
            notes.append(f"zero-shot: current minus prior image embedding against each class's prompts "
                         f"({self.prompt_bank})")  # fmt: skip
        else:
            methods["zero_shot"] = None
            notes.append("zero-shot: n/a (the model has no text tower to read progression prompts)")

        # the trained head on frozen embeddings, finding as a one-hot input
        def pair_features(subset: Subset, name: str) -> tuple[np.ndarray, np.ndarray]:
            codes = self.finding_codes(subset)
            return tuple(np.hstack([features.get(name, c).embeddings, codes]) for c in ("prior_path", "path"))

        train_prior, train_cur = pair_features(train, "train")
        head = fit_progression_head(train_prior, train_cur, names(train), self.seed, classes=classes)
        test_prior, test_cur = pair_features(test, "test")
        probabilities = predict_head(head, test_prior, test_cur)  # columns in head.classes order
        methods["head"] = as_prediction(np.asarray(head.classes)[probabilities.argmax(axis=1)])
        notes.append(f"head: logistic regression on [prior, current, current - prior] embeddings + finding, "
                     f"{len(train)} training pairs")  # fmt: skip
        methods["majority"] = as_prediction(majority_floor(names(train), len(test), classes))
        scores_table = test.table[["pair_id", "patient_id", "finding", "progression"]].copy()
        for method, prediction in methods.items():
            if prediction is not None:
                scores_table[f"{method}_predicted"] = np.asarray(classes)[prediction.decisions[:, 0]]
        return Outcome({key: methods[key] for key in self.methods}, scores_table, notes)

    def score(self, truth: Targets, prediction: Prediction) -> dict[str, float]:
        classes = np.asarray(self.classes)
        out = progression_metrics(classes[truth.labels[:, 0]], classes[np.asarray(prediction.decisions)[:, 0]],
                                  list(self.classes), truth.groups)  # fmt: skip
        return {key: float(out.get(key, np.nan)) for key in self.metrics}

    def extras(self, draw: Draw, outcome: Outcome, table: pd.DataFrame, n_boot: int) -> Extras:
        extras = Extras()
        truth = np.asarray(self.classes)[draw.test.targets.labels[:, 0]]
        sections = []
        for method, prediction in outcome.methods.items():
            if prediction is None:
                continue
            predicted = np.asarray(self.classes)[prediction.decisions[:, 0]]
            matrix = confusion(truth, predicted, list(self.classes)).rename_axis("truth").reset_index()
            extras.tables[f"confusion_{method}"] = matrix
            sections.append(f"**Confusion, {self.methods[method]}** (rows: truth, columns: predicted)\n\n"
                            + frame_markdown(matrix))  # fmt: skip
        extras.sections.extend(sections)
        if draw.test.targets.boxes is not None and self.encoder is not None:
            self.ground(draw, n_boot, extras)
        return extras

    def ground(self, draw: Draw, n_boot: int, extras: Extras) -> None:
        """Grounding on the test pairs' boxes: every film of a pair that has boxes of the pair's finding is one
        instance; pointing game and CNR of the model and the floors, overall, per finding and per source, with
        resamples of instances."""
        test = draw.test
        paths, boxes, findings, sources = [], [], [], []
        for i, its_boxes in enumerate(test.targets.boxes):
            for column in ("prior_path", "path"):
                on_film = tuple(b for b in its_boxes if b.image == column)
                if on_film:
                    paths.append(test.table[column].iloc[i])
                    boxes.append(on_film)
                    findings.append(test.table["finding"].iloc[i])
                    sources.append(str(test.table["source"].iloc[i]))
        if not paths:
            return
        grounded = score_heatmaps(self.encoder, self.root, paths, boxes, self.findings, self.seed)
        groups = {"overall": np.ones(len(paths), bool)}
        groups.update({f: np.asarray(findings) == f for f in dict.fromkeys(findings)})
        groups.update({f"source {s}": np.asarray(sources) == s for s in dict.fromkeys(sources)})
        table = grounding_table(grounded.methods, groups, n_boot, self.seed)
        extras.tables["grounding"] = table
        extras.metrics.update({f"grounding/{r.method}/{r.metric}/{r.group}": r.value for r in table.itertuples()})
        extras.sections.append(f"**Grounding** ({len(paths)} films with boxes of their pair's finding; 95% CI over "
                               f"resampled films)\n\n" + frame_markdown(table) + "\n\n"
                               + "\n".join(f"- {note}" for note in grounded.notes))  # fmt: skip
        for finding, shown in grounded.examples.items():
            if shown:
                images, maps, its_boxes, titles = zip(*shown, strict=True)
                extras.figures[f"overlays_{finding.lower().replace(' ', '_')}"] = overlay_figure(
                    images, maps, its_boxes, [f"{finding}: {t}" for t in titles])  # fmt: skip
