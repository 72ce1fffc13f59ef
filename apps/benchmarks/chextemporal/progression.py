"""Progression between two films: is a finding new, worse, stable, improved or resolved on the current film
compared with the prior one (a CheXTemporal-style benchmark).

Every model a benchmark can load was built to read one image, so none of them has a pair encoder. A pair is
therefore judged from what each model already gives per image, in three ways that need progressively more:

* **zero-shot** (image-text models, nothing fitted): the change between the two films' embeddings is compared
  with text describing each kind of change (``configs/text/progression.yaml``); a class scores its best-matching
  prompt (:data:`PROMPT_RULES`);
* **rule** (classifiers, two numbers fitted): the finding's probability on each film, turned into a class by a
  presence threshold and a change margin chosen on validation pairs;
* **head** (any model with embeddings): a multinomial logistic regression on both films' embeddings, the pair
  counterpart of the single-image linear probe (:mod:`apps.benchmarks.framework.probe`).

The fitted methods are scored out-of-fold (:func:`out_of_fold`): every pair is predicted once, by a fit that
never saw its patient, so they are scored on the same whole set of pairs as zero-shot.

Sources label at different granularity: the full five classes, NIH follow-ups only ``new / persisting /
resolved``, a COVID severity set only ``worse / stable / improved``. Every function takes the source's class set,
and a method never predicts a class outside it, so each source is scored on its own terms.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import yaml
from sklearn.exceptions import ConvergenceWarning
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import confusion_matrix, f1_score
from sklearn.pipeline import Pipeline, make_pipeline
from sklearn.preprocessing import StandardScaler

from apps.benchmarks.framework.probe import MAX_ITER, C
from training.config_files import config_file, project_file

DEFAULT_PROMPTS = config_file("text", "progression.yaml")
PLACEHOLDER = "{finding}"

PROGRESSION_CLASSES = ("new", "worse", "stable", "improved", "resolved")
"""The full label set, in the order tables and score columns use."""
PRESENCE_CLASSES = ("new", "persisting", "resolved")
"""Sources that only say whether a finding came, stayed or went (NIH follow-up pairs)."""
SEVERITY_CLASSES = ("worse", "stable", "improved")
"""Sources where the finding is present on both films and only its extent is graded (a COVID severity set)."""
RULE_CLASSES = (*PROGRESSION_CLASSES, "persisting")
"""Every class the rule knows how to reach; a class set for :func:`apply_rule` must be drawn from these."""
CLASS_ORDER = ("new", "worse", "stable", "persisting", "improved", "resolved")
"""The order classes take when a caller gives none: from appearing to gone, so each source's own set
(:data:`PROGRESSION_CLASSES`, :data:`PRESENCE_CLASSES`, :data:`SEVERITY_CLASSES`) comes out in its usual order."""

N_QUANTILES = 21
"""Presence thresholds tried by :func:`fit_rule`: the observed probabilities at every 5th percentile."""
DELTA_GRID = (0.0, 0.025, 0.05, 0.1, 0.15, 0.2, 0.3)
"""Change margins tried by :func:`fit_rule`, on the probability scale."""

#: What the rule reads on a pair -> the classes that can carry it, best first. The rule's raw outcome is one of
#: the five classes or ``absent`` (below the presence threshold on both films); a class set that lacks the first
#: choice gets the next one, and one that lacks them all gets the rule's fallback (:class:`RuleThresholds`).
#: ``new`` falls to ``worse`` (the finding went from none to some: more of it) and ``resolved`` to ``improved``;
#: everything seen on both films falls to ``persisting`` in a presence-only set.
RULE_FALLBACKS: dict[str, tuple[str, ...]] = {
    "new": ("new", "worse", "persisting"),
    "worse": ("worse", "persisting"),
    "stable": ("stable", "persisting"),
    "improved": ("improved", "persisting"),
    "resolved": ("resolved", "improved", "persisting"),
    "absent": ("stable",),
}


# ------------------------------------------------------------------------------------------------ prompts


def load_prompt_bank(path: str | Path | None = None) -> dict[str, tuple[str, ...]]:
    """Class -> its prompt templates, from ``configs/text/progression.yaml`` (or ``path``).

    The templates are checked here, when the file is read, rather than when a finding is inserted: a template
    without the placeholder would silently ask every finding the same question.
    """
    path = project_file(path) if path else DEFAULT_PROMPTS
    raw = yaml.safe_load(path.read_text()) or {}
    prompts = raw.get("prompts")
    if not isinstance(prompts, Mapping) or not prompts:
        raise ValueError(f"{path}: expected a `prompts:` mapping of class -> list of templates")
    bank = {}
    for name, templates in prompts.items():
        templates = tuple(str(t) for t in (templates or ()))
        bad = [t for t in templates if t.count(PLACEHOLDER) != 1]
        if not templates or bad:
            raise ValueError(
                f"{path}: every {name!r} prompt needs {PLACEHOLDER} exactly once; bad: {bad or 'none given'}"
            )
        bank[str(name)] = templates
    return bank


def class_prompts(bank: Mapping[str, Sequence[str]], finding: str, classes: Sequence[str]) -> dict[str, list[str]]:
    """The prompts of each of ``classes`` about ``finding`` (in lower case, as a report writes it), in class order.

    A class the bank lacks is an error, not an empty list: a class without text could never be predicted, and
    the benchmark would look as if the model never chose it.
    """
    missing = [c for c in classes if c not in bank]
    if missing:
        raise KeyError(f"the progression prompt bank has no prompts for {missing}; add them under `prompts:`")
    word = finding.lower()
    return {c: [t.replace(PLACEHOLDER, word) for t in bank[c]] for c in classes}


# ------------------------------------------------------------------------------------------------ zero-shot


def _unit(x: np.ndarray) -> np.ndarray:
    """Rows scaled to unit length; an all-zero row stays zero (its cosine with anything is taken as 0)."""
    x = np.asarray(x, dtype=np.float64)
    norms = np.linalg.norm(x, axis=-1, keepdims=True)
    return np.divide(x, norms, out=np.zeros_like(x), where=norms > 0)


def pair_change(prior_emb: np.ndarray, current_emb: np.ndarray) -> np.ndarray:
    """``(N, D)`` unit direction of each pair's change ``unit(current) - unit(prior)`` (0 for identical films).

    A single-image model has no pair encoder, so the pair is represented by the difference of its two image
    embeddings. With unit image vectors, ``(c - p) . t = c . t - p . t``: how much more the current film matches
    a text than the prior film did, so the shared direction of the two films (the patient, the projection, the
    finding's presence on both) cancels and what is left is the change. Scaling to unit length makes its dot
    product with a unit text a cosine, comparable across pairs that changed a lot or a little.
    """
    prior, current = np.asarray(prior_emb), np.asarray(current_emb)
    if prior.shape != current.shape or prior.ndim != 2:
        raise ValueError(f"prior {prior.shape} and current {current.shape} embeddings must both be (N, D)")
    return _unit(_unit(current) - _unit(prior))


def prompt_embeddings(
    prompts: Mapping[str, Sequence[str]], embed_texts: Callable[[list[str]], np.ndarray]
) -> list[np.ndarray]:
    """Per class (in the mapping's order) the ``(M_c, D)`` unit embeddings of its prompts, from one batched
    ``embed_texts`` call."""
    texts = [t for group in prompts.values() for t in group]
    encoded = _unit(np.asarray(embed_texts(texts), dtype=np.float64))  # (M, D)
    if encoded.ndim != 2 or len(encoded) != len(texts):
        raise ValueError(f"embed_texts returned {encoded.shape} for {len(texts)} texts; expected (M, D)")
    bounds = np.cumsum([0, *(len(group) for group in prompts.values())])
    return [encoded[a:b] for a, b in zip(bounds[:-1], bounds[1:], strict=True)]


def best_prompt_scores(change: np.ndarray, per_class: Sequence[np.ndarray]) -> np.ndarray:
    """``(N, C)``: each class's highest cosine over its own prompts, so the argmax is the class of the single
    prompt the change matches best (CheXTemporal's prompt selection)."""
    return np.stack([(change @ prompts.T).max(axis=1) for prompts in per_class], axis=1)


def mean_prompt_scores(change: np.ndarray, per_class: Sequence[np.ndarray]) -> np.ndarray:
    """``(N, C)``: cosine with each class's averaged, re-normalised prompt embedding (a prompt ensemble, as the
    description bank does), which smooths over one odd phrasing but lets the other prompts outvote the best one."""
    return change @ np.stack([_unit(prompts.mean(axis=0)) for prompts in per_class]).T


PROMPT_RULES: dict[str, Callable[[np.ndarray, Sequence[np.ndarray]], np.ndarray]] = {
    "max": best_prompt_scores,
    "mean": mean_prompt_scores,
}
"""How a class's several prompts become one score (``prompt_rule`` of ``configs/benchmark/chextemporal.yaml``):
``max``, the paper's choice and the default, or ``mean`` of the prompt embeddings."""


def prompt_scorer(name: str) -> Callable[[np.ndarray, Sequence[np.ndarray]], np.ndarray]:
    """The :data:`PROMPT_RULES` entry ``name``; an unknown name is refused with the known ones."""
    if name not in PROMPT_RULES:
        raise ValueError(f"prompt_rule must be one of {', '.join(PROMPT_RULES)}, got {name!r}")
    return PROMPT_RULES[name]


def zero_shot_scores(
    prior_emb: np.ndarray, current_emb: np.ndarray, per_class: Sequence[np.ndarray], rule: str = "max"
) -> np.ndarray:
    """``(N, C)`` zero-shot scores of each pair against each class's prompt embeddings
    (:func:`prompt_embeddings`), combined by the :data:`PROMPT_RULES` entry ``rule``."""
    return prompt_scorer(rule)(pair_change(prior_emb, current_emb), per_class)


# ------------------------------------------------------------------------------------------------ rule


@dataclass(frozen=True)
class RuleThresholds:
    """The two numbers that turn a classifier's probability on each film into a progression class.

    Attributes:
        present: the finding counts as present on a film whose probability is at or above this.
        delta: on a pair present on both films, a rise of more than ``delta`` is ``worse``, a fall of more than
            ``delta`` is ``improved``, anything in between ``stable``.
        fallback: the class given to an outcome the class set cannot express (see :data:`RULE_FALLBACKS`), e.g.
            a pair absent on both films in a set without ``stable``; :func:`fit_rule` sets it to the most
            frequent validation class, the best guess without evidence. ``None``: such a pair is an error.
        balanced_accuracy: what these thresholds scored on the pairs they were fitted on (NaN when set by hand).
    """

    present: float
    delta: float
    fallback: str | None = None
    balanced_accuracy: float = float("nan")


def _check_rule_classes(classes: Sequence[str]) -> tuple[str, ...]:
    classes = tuple(classes)
    unknown = [c for c in classes if c not in RULE_CLASSES]
    if unknown or not classes:
        raise ValueError(f"the rule can only predict {list(RULE_CLASSES)}; got {list(classes)}")
    return classes


def _check_probabilities(p_prior: np.ndarray, p_current: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    p_prior, p_current = np.asarray(p_prior, dtype=np.float64), np.asarray(p_current, dtype=np.float64)
    if p_prior.shape != p_current.shape or p_prior.ndim != 1:
        raise ValueError(f"prior {p_prior.shape} and current {p_current.shape} probabilities must both be (N,)")
    if np.isnan(p_prior).any() or np.isnan(p_current).any():
        raise ValueError("the rule needs a probability for every film; the model has no score for some (NaN)")
    return p_prior, p_current


def apply_rule(
    p_prior: np.ndarray, p_current: np.ndarray, thresholds: RuleThresholds, classes: Sequence[str]
) -> np.ndarray:
    """``(N,)`` class names from the finding's probability on the prior and the current film.

    Present means ``p >= thresholds.present``. Absent then present: ``new``; present then absent: ``resolved``;
    present on both: ``worse`` when ``current - prior > delta``, ``improved`` when it is ``< -delta``, else
    ``stable``; absent on both: ``stable`` (nothing to see, nothing changed). The outcome is then carried to the
    first class of :data:`RULE_FALLBACKS` that ``classes`` has (so in ``new / persisting / resolved`` every pair
    present on both films is ``persisting``, and in ``worse / stable / improved`` a new finding is ``worse``),
    and to ``thresholds.fallback`` when it has none of them: a class outside ``classes`` is never predicted.
    """
    classes = _check_rule_classes(classes)
    p_prior, p_current = _check_probabilities(p_prior, p_current)
    before, after = p_prior >= thresholds.present, p_current >= thresholds.present
    change = p_current - p_prior
    both = before & after
    worse, improved = both & (change > thresholds.delta), both & (change < -thresholds.delta)
    outcomes = {
        "new": ~before & after,
        "resolved": before & ~after,
        "worse": worse,
        "improved": improved,
        "stable": both & ~worse & ~improved,
        "absent": ~before & ~after,
    }
    index = np.full(len(p_prior), -1)
    for outcome, where in outcomes.items():
        if not where.any():
            continue
        target = next((c for c in RULE_FALLBACKS[outcome] if c in classes), thresholds.fallback)
        if target is None:
            raise ValueError(f"{int(where.sum())} pairs read as {outcome!r}, which {list(classes)} cannot express; "
                             "give the thresholds a fallback class (fit_rule sets the most frequent one)")  # fmt: skip
        if target not in classes:
            raise ValueError(f"fallback class {target!r} is not one of {list(classes)}")
        index[where] = classes.index(target)
    return np.asarray(classes)[index]


def present_grid(p_prior: np.ndarray, p_current: np.ndarray) -> np.ndarray:
    """The presence thresholds :func:`fit_rule` tries: distinct observed probabilities (both films pooled) at
    :data:`N_QUANTILES` evenly spaced quantiles.

    Observed values rather than a fixed grid, because a classifier's probabilities crowd wherever its training
    prevalence and calibration put them (0.02 to 0.1 for a rare finding); a fixed 0.1-step grid could hold a
    single useful value. The lowest is the smallest probability, which makes every film present: the rule can
    then decide by the change margin alone, as a severity-only source needs.
    """
    p_prior, p_current = _check_probabilities(p_prior, p_current)
    pooled = np.concatenate([p_prior, p_current])
    if not len(pooled):
        raise ValueError("no pairs to choose thresholds on")
    return np.unique(np.quantile(pooled, np.linspace(0.0, 1.0, N_QUANTILES), method="lower"))


def _balanced_accuracy(truth: np.ndarray, predicted: np.ndarray) -> float:
    """Mean recall over the classes that occur in ``truth`` (sklearn's ``balanced_accuracy_score``, without its
    warning about predicted classes the truth lacks, which the grid search would raise at most points)."""
    return float(np.mean([np.mean(predicted[truth == c] == c) for c in np.unique(truth)]))


def fit_rule(
    p_prior: np.ndarray, p_current: np.ndarray, labels: Sequence[str], classes: Sequence[str]
) -> RuleThresholds:
    """Choose ``present`` (from :func:`present_grid`) and ``delta`` (from :data:`DELTA_GRID`) on validation pairs
    by exhaustive search, maximising balanced accuracy; ties go to the first point in grid order (lowest
    ``present``, then lowest ``delta``).

    Balanced accuracy, not accuracy, because progression labels are heavily skewed (most follow-ups are
    ``stable`` or ``persisting``): plain accuracy is maximised by a margin so wide that everything is stable,
    which collapses the rule onto the majority floor. Macro F1 would do too but rewards rarely predicting rare
    classes, while mean recall asks each class to be found. The fallback class is the most frequent label.
    A class set without ``worse`` and ``improved`` makes ``delta`` irrelevant; it is then the grid's first value.
    """
    classes = _check_rule_classes(classes)
    p_prior, p_current = _check_probabilities(p_prior, p_current)
    labels = _check_labels(labels, classes, "labels")
    if len(labels) != len(p_prior):
        raise ValueError(f"{len(labels)} labels for {len(p_prior)} pairs")
    fallback = str(majority_floor(labels, 1, classes)[0])
    best = None
    for present in present_grid(p_prior, p_current):
        for delta in DELTA_GRID:
            trial = RuleThresholds(float(present), float(delta), fallback)
            score = _balanced_accuracy(labels, apply_rule(p_prior, p_current, trial, classes))
            if best is None or score > best.balanced_accuracy:
                best = RuleThresholds(trial.present, trial.delta, fallback, score)
    return best


# ------------------------------------------------------------------------------------------------ trained head


@dataclass(frozen=True)
class ProgressionHead:
    """A fitted pair classifier.

    Attributes:
        pipeline: standardiser + logistic regression on :func:`pair_features`, fitted on class indices.
        classes: the column order of :func:`predict_head`.
        converged: whether lbfgs converged within the probe's ``MAX_ITER``.
    """

    pipeline: Pipeline
    classes: tuple[str, ...]
    converged: bool


def pair_features(prior_emb: np.ndarray, current_emb: np.ndarray) -> np.ndarray:
    """``(N, 3F)``: ``[prior, current, current - prior]``.

    The difference is a linear function of the other two, so it adds nothing a linear model could not build;
    it is there for the regularisation: under an L2 penalty "what changed" would otherwise cost two weights of
    opposite sign per dimension and be shrunk twice as hard as "what is there now". The two films themselves
    stay in because the classes also need presence (new vs worse is whether the prior showed the finding).
    """
    prior, current = np.asarray(prior_emb, dtype=np.float64), np.asarray(current_emb, dtype=np.float64)
    if prior.shape != current.shape or prior.ndim != 2:
        raise ValueError(f"prior {prior.shape} and current {current.shape} embeddings must both be (N, F)")
    return np.hstack([prior, current, current - prior])


def fit_progression_head(
    prior_emb: np.ndarray,
    current_emb: np.ndarray,
    labels: Sequence[str],
    seed: int = 0,
    classes: Sequence[str] | None = None,
) -> ProgressionHead:
    """Multinomial logistic regression on standardised :func:`pair_features`, with the probe's fixed settings
    (``C``, ``max_iter``, lbfgs; see :mod:`apps.benchmarks.framework.probe` for why nothing is tuned).

    ``classes`` fixes the probability columns (default: the labels' classes in :data:`CLASS_ORDER`), so a class the training
    pairs lack still has its column (always 0) and scores line up with the other methods'. ``seed`` is passed to
    the solver; lbfgs is deterministic and ignores it, but a change of solver would not.
    """
    classes = _default_order(labels) if classes is None else tuple(classes)
    labels = _check_labels(labels, classes, "labels")
    if np.unique(labels).size < 2:
        raise ValueError("the progression head needs training pairs of at least two classes")
    features = pair_features(prior_emb, current_emb)
    if len(features) != len(labels):
        raise ValueError(f"{len(labels)} labels for {len(features)} pairs")
    targets = np.array([classes.index(label) for label in labels])
    pipeline = make_pipeline(StandardScaler(), LogisticRegression(C=C, max_iter=MAX_ITER, random_state=seed))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ConvergenceWarning)
        pipeline.fit(features, targets)
    converged = not any(issubclass(w.category, ConvergenceWarning) for w in caught)
    return ProgressionHead(pipeline, classes, converged)


def predict_head(model: ProgressionHead, prior_emb: np.ndarray, current_emb: np.ndarray) -> np.ndarray:
    """``(N, C)`` class probabilities, columns in ``model.classes`` order (0 for classes unseen in training)."""
    fitted = model.pipeline.predict_proba(pair_features(prior_emb, current_emb))  # columns: seen class indices
    probs = np.zeros((len(fitted), len(model.classes)))
    probs[:, model.pipeline.classes_] = fitted
    return probs


# ------------------------------------------------------------------------------------------------ metrics


def _default_order(labels: Sequence[str]) -> tuple[str, ...]:
    """The classes occurring in ``labels``: known ones in :data:`CLASS_ORDER`, any others after them, sorted."""
    seen = set(np.asarray(labels).astype(str).tolist())
    return (*(c for c in CLASS_ORDER if c in seen), *sorted(seen - set(CLASS_ORDER)))


def _check_labels(values: Sequence[str], classes: Sequence[str], name: str) -> np.ndarray:
    """``values`` as a string array, refusing any name outside ``classes`` (sklearn would silently drop it)."""
    values = np.asarray(values).astype(str)
    if values.ndim != 1:
        raise ValueError(f"{name} must be (N,), got {values.shape}")
    unknown = sorted(set(values.tolist()) - set(classes))
    if unknown:
        raise ValueError(f"{name} has classes outside {list(classes)}: {unknown}")
    return values


def progression_metrics(
    truth: Sequence[str], predicted: Sequence[str], classes: Sequence[str], findings: Sequence[str] | None = None
) -> dict[str, float]:
    """``accuracy``, ``macro_f1``, ``accuracy/<class>`` (that class's recall) and, with ``findings``,
    ``accuracy/<finding>``; NaN where nothing defines them (no pairs, a class absent from the truth).

    Macro F1 averages over the classes of ``classes`` that occur in the truth or the prediction (sklearn's own
    default label set, in class order); F1 is 0 for a class that is predicted but absent from the truth or vice
    versa. A class in neither is left out rather than counted as 0: it says nothing about the model, and counting
    it would lower every model's score on a source that never labels that class (NIH pairs scored against the
    five classes), by an amount that depends on the source, not on the model.
    """
    classes = tuple(classes)
    truth, predicted = _check_labels(truth, classes, "truth"), _check_labels(predicted, classes, "predicted")
    if len(truth) != len(predicted):
        raise ValueError(f"{len(truth)} true labels but {len(predicted)} predictions")
    right = truth == predicted
    seen = set(truth.tolist()) | set(predicted.tolist())
    labels = [c for c in classes if c in seen]
    out = {
        "accuracy": float(right.mean()) if len(right) else float("nan"),
        "macro_f1": float(f1_score(truth, predicted, labels=labels, average="macro", zero_division=0.0))
        if labels
        else float("nan"),
    }
    for c in classes:
        mask = truth == c
        out[f"accuracy/{c}"] = float(right[mask].mean()) if mask.any() else float("nan")
    if findings is not None:
        findings = np.asarray(findings).astype(str)
        if len(findings) != len(truth):
            raise ValueError(f"{len(findings)} findings for {len(truth)} pairs")
        clash = sorted(set(findings.tolist()) & set(classes))
        if clash:
            raise ValueError(f"findings named like classes would share a metric key: {clash}")
        for finding in sorted(set(findings.tolist())):
            out[f"accuracy/{finding}"] = float(right[findings == finding].mean())
    return out


def confusion(truth: Sequence[str], predicted: Sequence[str], classes: Sequence[str]) -> pd.DataFrame:
    """Counts with true classes as rows and predicted classes as columns, both in ``classes`` order (every class
    present, even with no pairs, so tables of different models and sources line up)."""
    classes = list(classes)
    truth, predicted = _check_labels(truth, classes, "truth"), _check_labels(predicted, classes, "predicted")
    if len(truth) != len(predicted):
        raise ValueError(f"{len(truth)} true labels but {len(predicted)} predictions")
    counts = confusion_matrix(truth, predicted, labels=classes) if len(truth) else np.zeros((len(classes),) * 2, int)
    return pd.DataFrame(counts, index=pd.Index(classes, name="truth"), columns=pd.Index(classes, name="predicted"))


def majority_floor(train_labels: Sequence[str], n: int, classes: Sequence[str] | None = None) -> np.ndarray:
    """``(n,)`` copies of the most frequent training class: the score any method must beat to have read the films
    at all. Ties go to the class that comes first in ``classes`` (default: the labels' classes in
    :data:`CLASS_ORDER`), so the floor does not depend on the order of the training pairs."""
    train_labels = np.asarray(train_labels).astype(str)
    if not len(train_labels):
        raise ValueError("the majority floor needs training labels")
    classes = _default_order(train_labels) if classes is None else tuple(classes)
    train_labels = _check_labels(train_labels, classes, "train_labels")
    counts = [(train_labels == c).sum() for c in classes]
    return np.full(n, classes[int(np.argmax(counts))])


# ------------------------------------------------------------------------------------------------ out-of-fold


def out_of_fold(folds: np.ndarray, fit_predict: Callable[[np.ndarray, np.ndarray], np.ndarray]) -> np.ndarray:
    """``(N,)`` one prediction per row, each made by ``fit_predict(train_rows, test_rows)`` for the fold that holds
    the row, fitted on the rows of every other fold.

    Why cross-validation rather than one train/test split: a method that must be fitted is then scored on the
    same whole set of pairs as a zero-shot method, each pair exactly once and never by a fit that saw its patient
    (when the folds are patient-disjoint, :func:`apps.benchmarks.chextemporal.pairs.patient_folds`).
    """
    folds = np.asarray(folds)
    if folds.ndim != 1 or not len(folds):
        raise ValueError(f"folds must be a non-empty (N,) array, got shape {folds.shape}")
    out = np.empty(len(folds), dtype=object)
    for fold in np.unique(folds):
        test, train = np.flatnonzero(folds == fold), np.flatnonzero(folds != fold)
        if not len(train):
            raise ValueError("a single fold leaves no rows to fit on")
        predicted = np.asarray(fit_predict(train, test), dtype=object)
        if predicted.shape != (len(test),):
            raise ValueError(f"fold {fold}: {predicted.shape} predictions for {len(test)} rows")
        out[test] = predicted
    return out
