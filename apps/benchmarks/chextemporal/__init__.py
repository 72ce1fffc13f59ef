"""The CheXTemporal protocol: how did a finding change between the prior and the current film?

Items are (prior film, current film, finding) with a progression label, from whichever source the data root
holds (the release, NIH follow-ups, covid-temporal: :mod:`apps.benchmarks.chextemporal.pairs`). Every labelled
pair is scored, as the paper scores its zero-shot models, so the figures sit beside its own; the fitted methods
(:mod:`apps.benchmarks.chextemporal.progression`) are therefore scored out-of-fold over patient-disjoint folds.
Grounding prompts an image-text model with the disease name, the paper's rule for single-image models. See
docs/benchmarks.md, "CheXTemporal progression".
"""

from __future__ import annotations

import copy
import dataclasses
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import sklearn

from apps.benchmarks.chextemporal.pairs import (
    COARSE,
    PROGRESSION,
    covid_pairs,
    nih_followup_pairs,
    patient_folds,
    patient_keys,
    read_pair_manifest,
)
from apps.benchmarks.chextemporal.progression import (
    PLACEHOLDER,
    apply_rule,
    class_prompts,
    confusion,
    fit_progression_head,
    fit_rule,
    load_prompt_bank,
    majority_floor,
    out_of_fold,
    predict_head,
    progression_metrics,
    prompt_embeddings,
    prompt_scorer,
    zero_shot_scores,
)
from apps.benchmarks.framework.boxes import PAIR_IMAGES, read_pair_boxes
from apps.benchmarks.framework.encoders import Encoder, Target
from apps.benchmarks.framework.grounding import (
    FLAT_MAPS,
    POINTING_TOLERANCE,
    GroundedScores,
    grounding_table,
    overlay_figure,
    score_heatmaps,
)
from apps.benchmarks.framework.markdown import frame_markdown
from apps.benchmarks.framework.memo import memo_arrays
from apps.benchmarks.framework.probe import MAX_ITER, C
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
PAIR_TABLE = ["pair_id", "patient_id", "prior_path", "path", "finding", "progression", "source", "fold"]


class ChexTemporalProtocol(Protocol):
    """Progression on pairs (see the module docstring).

    Args:
        prompts: finding -> the prompt an image-text model scores one film with (the rule's input).
        folds: patient-disjoint cross-validation folds of the fitted methods (fewer when there are fewer patients).
        covid: covid-temporal settings: ``score`` (opacity | geographic_extent) and ``threshold``.
        prompt_rule: ``max`` (a class's best prompt) or ``mean`` (its averaged prompt embedding).
        grounding_prompt: the template of a film's heatmap prompt, ``{finding}`` the finding in lower case.
        tolerance: the pointing game's margin in pixels of the boxes' 1024-px frame (0: the peak must lie in a box).
        flat_maps: the pointing game's rule for a flat map (``miss``: no credit).
    """

    methods = {"zero_shot": "Zero-shot (prompt bank)", "rule": "Rule (out-of-fold)",
               "head": "Trained head (out-of-fold)", "majority": "Majority class (out-of-fold)"}  # fmt: skip
    fitted = ("rule", "head", "majority")

    def __init__(self, name: str, description: str, seed: int, versions: Mapping[str, Any],
                 prompts: Mapping[str, str], negative_prompt: str, folds: int, release: Mapping[str, str],
                 nih_labels: str, covid: Mapping[str, Any], prompt_bank: str, prompt_rule: str = "max",
                 grounding_prompt: str = PLACEHOLDER, tolerance: float = POINTING_TOLERANCE, flat_maps: str = "miss",
                 bootstrap: str = "plain"):  # fmt: skip
        super().__init__(name, description, seed, versions, bootstrap)
        if tuple(prompts) != CHEXTEMPORAL_FINDINGS:
            raise ValueError(f"benchmark {name}: prompts must list the 11 findings in order: {CHEXTEMPORAL_FINDINGS}")
        if isinstance(folds, bool) or not isinstance(folds, int) or folds < 2:
            raise ValueError(f"benchmark {name}: folds must be a whole number >= 2, got {folds!r}")
        if str(grounding_prompt).count(PLACEHOLDER) != 1:
            raise ValueError(
                f"benchmark {name}: grounding_prompt {grounding_prompt!r} needs {PLACEHOLDER} exactly once"
            )
        if isinstance(tolerance, bool) or not isinstance(tolerance, int | float) or not 0 <= tolerance < math.inf:
            raise ValueError(f"benchmark {name}: tolerance is a distance in pixels of the boxes' frame, 0 or more; "
                             f"got {tolerance!r}")  # fmt: skip
        if flat_maps not in FLAT_MAPS:
            raise ValueError(f"benchmark {name}: flat_maps must be one of {', '.join(FLAT_MAPS)}, got {flat_maps!r}")
        prompt_scorer(prompt_rule)  # refuse an unknown rule now, not after the images are encoded
        self._targets = tuple(Target(f, p, negative_prompt, outputs=CHEXPERT_OUTPUTS[f][0]) for f, p in prompts.items())
        self.folds, self.release, self.nih_labels = int(folds), dict(release), nih_labels
        self.covid, self.prompt_bank, self.prompt_rule = dict(covid), prompt_bank, prompt_rule
        self.grounding_prompt, self.tolerance, self.flat_maps = str(grounding_prompt), float(tolerance), flat_maps
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
        """One subset, ``test``: every labelled pair (the first ``versions[version]`` by pair id when capped), each
        with its cross-validation ``fold``; its ``pool`` is every pair of the source, labelled or not."""
        table, classes, source = self.pairs(root)
        pool, size = len(table), self.versions[version]
        table = table[table["progression"].fillna("").astype(str) != ""].sort_values("pair_id", ignore_index=True)
        if table.empty:
            raise ValueError(f"no labelled pairs among the {pool} pairs of the {source} source")
        labelled = len(table)
        if size is not None:
            table = table.head(int(size))
        table["fold"] = patient_folds(table, self.folds, self.seed)
        self.classes, self.source, self.root = classes, source, root
        self.findings = tuple(f for f in CHEXTEMPORAL_FINDINGS if f in set(table["finding"]))
        labels = table["progression"].map({c: i for i, c in enumerate(classes)}).to_numpy().reshape(-1, 1)
        targets = Targets("multiclass", ("progression",), labels.astype(int), classes=classes,
                          groups=table["finding"].to_numpy(dtype=str), boxes=self.pair_boxes(table))  # fmt: skip
        test = Subset(table[PAIR_TABLE], targets, images=("prior_path", "path"), id_column="pair_id", pool=pool)
        patients = np.asarray(patient_keys(table))
        k = int(table["fold"].max()) + 1
        lines = [f"source: {source}; {labelled} of its {pool} pairs are labelled; scored: "
                 f"{self.counts(table, patients)}",
                 f"fitted methods ({', '.join(self.fitted)}) out-of-fold over {k} patient-disjoint folds "
                 f"(stratified by class, seed {self.seed})"]  # fmt: skip
        for fold in range(k):
            rows = table["fold"].to_numpy() == fold
            lines.append(f"fold {fold}: {self.counts(table[rows], patients[rows])}")
        params = {"source": source, "classes": ",".join(classes), "findings": ",".join(self.findings), "folds": k}
        return Draw(version, {"test": test}, params, lines)

    def counts(self, table: pd.DataFrame, patients: np.ndarray) -> str:
        """``N pairs of P patients (class counts)`` for a report line."""
        counts = table["progression"].value_counts()
        return (f"{len(table)} pairs of {len(set(patients.tolist()))} patients "
                f"({', '.join(f'{c} {int(counts.get(c, 0))}' for c in self.classes)})")  # fmt: skip

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
        test, classes = draw.test, list(self.classes)
        self.encoder = encoder
        truth = np.asarray(classes)[test.targets.labels[:, 0]]
        folds = test.table["fold"].to_numpy(dtype=int)
        notes, named = [], {}
        named["zero_shot"] = self.zero_shot(test, encoder, features, notes)
        named["rule"] = self.rule(test, truth, folds, features, notes)
        named["head"] = self.head(test, truth, folds, features, notes)
        named["majority"] = out_of_fold(folds, lambda train, rows: majority_floor(truth[train], len(rows), classes))
        scores_table = test.table[["pair_id", "patient_id", "finding", "progression", "fold"]].copy()
        methods, scored = {}, {}
        for method in self.methods:
            predicted = named[method]
            methods[method] = None if predicted is None else Prediction(
                decisions=np.array([classes.index(c) for c in predicted]).reshape(-1, 1))  # fmt: skip
            scored[method] = 0 if predicted is None else len(predicted)
            if predicted is not None:
                scores_table[f"{method}_predicted"] = predicted
        notes.append(f"pairs scored per method, of {len(test)}: "
                     + ", ".join(f"{m} {n if n else 'n/a'}" for m, n in scored.items()))  # fmt: skip
        params = {"prompt_rule": self.prompt_rule, **{f"scored_{m}": n for m, n in scored.items()},
                  "grounding_prompt": self.grounding_prompt, "pointing_tolerance": self.tolerance,
                  "flat_maps": self.flat_maps}  # fmt: skip
        return Outcome(methods, scores_table, notes, params)

    def zero_shot(self, test: Subset, encoder: Encoder, features: Features, notes: list[str]) -> np.ndarray | None:
        """Every pair's zero-shot class (image-text models only): the change of its two films' embeddings against
        the prompts of each class about its finding."""
        if encoder.embed_texts is None:
            notes.append("zero-shot: n/a (the model has no text tower to read progression prompts)")
            return None
        bank = load_prompt_bank(self.prompt_bank)
        prior, current = (features.get("test", c).embeddings for c in ("prior_path", "path"))
        scores = np.full((len(test), len(self.classes)), np.nan)
        findings = test.table["finding"].to_numpy()
        for finding in self.findings:
            rows = findings == finding
            per_class = prompt_embeddings(class_prompts(bank, finding, self.classes), encoder.embed_texts)
            scores[rows] = zero_shot_scores(prior[rows], current[rows], per_class, self.prompt_rule)
        notes.append(f"zero-shot: current minus prior image embedding against each class's prompts "
                     f"({self.prompt_bank}; prompt_rule {self.prompt_rule}: {prompt_scorer(self.prompt_rule).__name__})")  # fmt: skip
        return np.asarray(self.classes, dtype=object)[scores.argmax(axis=1)]

    def rule(self, test: Subset, truth: np.ndarray, folds: np.ndarray, features: Features,
             notes: list[str]) -> np.ndarray | None:  # fmt: skip
        """Every pair's class from the model's own scores of its finding on both films, the two thresholds fitted
        on the other folds' pairs; a pair without a score takes its training folds' majority class."""
        classes = list(self.classes)
        p_prior, p_cur = (self.item_scores(test, "test", c, features) for c in ("prior_path", "path"))
        usable = np.isfinite(p_prior) & np.isfinite(p_cur)
        if not usable.any():
            notes.append("rule: n/a (the model has no score for these findings)")
            return None
        fits = []

        def fit_predict(train: np.ndarray, rows: np.ndarray) -> np.ndarray:
            predicted = majority_floor(truth[train], len(rows), classes).astype(object)
            fit_rows, scored = train[usable[train]], usable[rows]
            if len(fit_rows) and scored.any():
                fits.append(fit_rule(p_prior[fit_rows], p_cur[fit_rows], truth[fit_rows], classes))
                predicted[scored] = apply_rule(p_prior[rows[scored]], p_cur[rows[scored]], fits[-1], classes)
            return predicted

        predicted = out_of_fold(folds, fit_predict)
        present, delta = [f.present for f in fits], [f.delta for f in fits]
        notes.append(f"rule: fitted on the other folds in {len(fits)} folds: present at score >= "
                     f"{min(present):.3g}..{max(present):.3g}, change beyond {min(delta):.3g}..{max(delta):.3g}"
                     + (f"; {int((~usable).sum())} pairs without a score take their training folds' majority class"
                        if (~usable).any() else ""))  # fmt: skip
        return predicted

    def head(self, test: Subset, truth: np.ndarray, folds: np.ndarray, features: Features,
             notes: list[str]) -> np.ndarray:  # fmt: skip
        """Every pair's class from a logistic head on both films' embeddings plus the finding, fitted on the other
        folds; a fold whose training pairs hold one class predicts that class (no boundary can be fitted)."""
        codes = self.finding_codes(test)
        prior, current = (np.hstack([features.get("test", c).embeddings, codes]) for c in ("prior_path", "path"))

        def fit_all() -> dict[str, np.ndarray]:
            single, unconverged = [], []

            def fit_predict(train: np.ndarray, rows: np.ndarray) -> np.ndarray:
                if np.unique(truth[train]).size < 2:
                    single.append(len(rows))
                    return np.full(len(rows), truth[train][0], dtype=object)
                head = fit_progression_head(prior[train], current[train], truth[train], self.seed,
                                            classes=self.classes)  # fmt: skip
                unconverged.extend([] if head.converged else [1])
                return np.asarray(head.classes, dtype=object)[predict_head(head, prior[rows], current[rows]).argmax(1)]

            predicted = out_of_fold(folds, fit_predict).astype(str)
            return {"predicted": predicted, "single": np.array(single, dtype=int), "unconverged": len(unconverged)}

        # the fits are a deterministic function of these inputs: a rerun on the same outputs reads them back
        fitted = memo_arrays(features.cache_dir, "chextemporal-head", [prior, current, truth.astype(str), folds,
                             self.seed, list(self.classes), C, MAX_ITER, sklearn.__version__], fit_all)  # fmt: skip
        predicted = fitted["predicted"].astype(object)
        single, unconverged = fitted["single"].tolist(), [1] * int(fitted["unconverged"])
        notes.append("head: logistic regression on [prior, current, current - prior] embeddings + finding, fitted "
                     "on the other folds' pairs"
                     + (f"; {len(single)} fold(s) had training pairs of one class and predict it ({sum(single)} "
                        f"pairs)" if single else "")
                     + (f"; {len(unconverged)} fit(s) did not converge" if unconverged else ""))  # fmt: skip
        return predicted

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
        """Grounding on the pairs' boxes: every film of a pair that has boxes of the pair's finding is one
        instance, its heatmap made for the finding's name (:meth:`grounded`); pointing game and CNR of the model
        and the floors, overall, per finding and per source, with resamples of instances."""
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
        grounded = self.grounded(paths, boxes)
        groups = {"overall": np.ones(len(paths), bool)}
        groups.update({f: np.asarray(findings) == f for f in dict.fromkeys(findings)})
        groups.update({f"source {s}": np.asarray(sources) == s for s in dict.fromkeys(sources)})
        table = grounding_table(grounded.methods, groups, n_boot, self.seed)
        extras.tables["grounding"] = table
        extras.metrics.update({f"grounding/{r.method}/{r.metric}/{r.group}": r.value for r in table.itertuples()})
        source = (
            "TorchRay's default"
            if self.tolerance == POINTING_TOLERANCE
            else f"TorchRay's default is {POINTING_TOLERANCE:g}"
        )
        rules = (f"pointing game: a hit within {self.tolerance:g} px of a box in the boxes' frame ({source}), "
                 f"{FLAT_MAPS[self.flat_maps]} (the platform's rule); {self.prompt_rule_text()}")  # fmt: skip
        extras.sections.append(f"**Grounding** ({len(paths)} films with boxes of their pair's finding; {rules}; 95% "
                               f"CI over resampled films)\n\n" + frame_markdown(table) + "\n\n"
                               + "\n".join(f"- {note}" for note in grounded.notes))  # fmt: skip
        for finding, shown in grounded.examples.items():
            if shown:
                images, maps, its_boxes, titles = zip(*shown, strict=True)
                extras.figures[f"overlays_{finding.lower().replace(' ', '_')}"] = overlay_figure(
                    images, maps, its_boxes, [f"{finding}: {t}" for t in titles])  # fmt: skip

    def prompt_rule_text(self) -> str:
        """How the report states the grounding prompt, and whether it is the paper's rule."""
        if self.grounding_prompt == PLACEHOLDER:
            return "prompts: the disease name (the paper's rule for single-image models)"
        return f"prompts: '{self.grounding_prompt}' (the paper prompts single-image models with the disease name)"

    def disease_name_prompt(self, finding: str) -> str:
        """The text a single-image heatmap of ``finding`` is made for: :attr:`grounding_prompt` with the finding in
        lower case (``"{finding}"`` -> ``"pleural effusion"``)."""
        return self.grounding_prompt.replace(PLACEHOLDER, finding.lower())

    def grounded(self, paths: list[str], boxes: list[tuple[Box, ...]]) -> GroundedScores:
        """:func:`score_heatmaps` on the films, an image-text model's findings prompted with their names.

        A patch-text map is made from one film, so the model grounding it is a single-image model, which the paper
        prompts with the disease name. The view of the encoder shares the model itself; only its prompts differ,
        and a classifier's Grad-CAM reads none.
        """
        view = copy.copy(self.encoder)
        view.targets = tuple(dataclasses.replace(t, positive_prompt=self.disease_name_prompt(t.label))
                             for t in self.encoder.targets)  # fmt: skip
        grounded = score_heatmaps(view, self.root, paths, boxes, self.findings, self.seed, tolerance=self.tolerance,
                                  flat_maps=self.flat_maps)  # fmt: skip
        shown = f"'{self.disease_name_prompt(self.findings[0])}'" if self.findings else "none"
        notes = [*grounded.notes, f"grounding {self.prompt_rule_text()} (`grounding_prompt: {self.grounding_prompt}`, "
                 f"e.g. {shown}); every heatmap here is of one film; a classifier's Grad-CAM reads no text"]  # fmt: skip
        return dataclasses.replace(grounded, notes=notes)
