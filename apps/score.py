"""Score a predictions file against its ground truth: ``make score PREDICTIONS=... MANIFEST=... [SPLIT=test]``.

For predictions made outside the platform: the same metrics, rules and bootstrap as every tracked run. What is
scored depends on the task's ``submission_format`` (:data:`SCORERS`): a probability CSV against a manifest split
(either spelling, :mod:`evaluation.prediction_columns`, so ``make submit``'s own file is scored as written), or
an ImageCLEF concept run file by the organisers' mean per-image F1
(:mod:`apps.benchmarks.imageclef_concepts.scoring`). docs/evaluation.md, "Scoring a file (make score)".
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

import numpy as np
from omegaconf import OmegaConf

from apps.benchmarks.imageclef_concepts.scoring import (
    ConceptFileError,
    manual_vocabulary,
    per_image_f1,
    read_concepts,
    read_run,
    secondary_vocabulary,
)
from apps.benchmarks.imageclef_concepts.tables import per_concept_table
from apps.score_truth import read_truth
from apps.submission import SubmissionError, submission_format
from evaluation.bootstrap import resample_indices
from evaluation.conventions import Conventions, terminal_lines
from evaluation.intervals import CI_RULE, left_out_note
from evaluation.prediction_columns import id_column
from evaluation.predictions import PredictionsError, align_predictions, read_predictions
from evaluation.report import chain_rule, headline_rows, ranking_chain
from evaluation.scopes import unseen_scopes
from evaluation.suite import compute_suite
from training.config_files import CONFIGS
from training.data.adapters.rocov2 import find_table, read_concept_names
from training.errors import UserError, user_errors

SHOWN_CONCEPTS = 20  # rows of the per-concept table printed (all of them go to --out)
#: The secondary score's vocabulary: the 2024 task's 14 modality and X-ray body-region CUIs, the 2025/2026
#: evaluators' 15, or every concept of the manual table (which adds ROCOv2's projections, PA and AP). The
#: imageclef-concepts benchmark makes the same choice (configs/benchmark/imageclef-concepts.yaml).
SECONDARY: dict[str, Callable[[dict], frozenset[str]]] = {
    "2024": lambda _: secondary_vocabulary("2024"),
    "2025": lambda _: secondary_vocabulary("2025"),
    "manual": manual_vocabulary,
}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("predictions", type=Path)
    parser.add_argument(
        "manifest",
        type=Path,
        help="a manifest or a label table in the organisers' layout; for concept tasks the ID,CUIs ground-truth table",
    )
    parser.add_argument("--split", default="test")
    parser.add_argument("--task", default="task1")
    parser.add_argument("--n-boot", type=int, default=1000)
    parser.add_argument("--data", default=None, help="the data config whose internal_source to use")
    parser.add_argument("--manual", type=Path, default=None, help="concept tasks: the manual table (secondary F1)")
    parser.add_argument("--secondary", default="2024", choices=sorted(SECONDARY), help="concept tasks: its vocabulary")
    parser.add_argument("--names", type=Path, default=None, help="concept tasks: CUI,name table for the report")
    parser.add_argument("--out", type=Path, default=None, help="concept tasks: write the per-concept table here")
    parser.add_argument("--debug", action="store_true", help="show the traceback of an input error")
    args = parser.parse_args(argv)
    with user_errors(PredictionsError, ConceptFileError, SubmissionError, debug=args.debug):
        SCORERS[submission_format(args.task)](args)


def task_labels(task: str) -> list[str]:
    """The classes a submission of ``configs/task/<task>.yaml`` holds, which are the ones scored: a zero-shot
    task's ``unseen`` classes (CXR-LT Task 2 submits and is ranked on those alone, docs/rules.md §1), else its
    ``labels``."""
    path = CONFIGS / "task" / f"{task}.yaml"
    if not path.is_file():
        names = sorted(p.stem for p in path.parent.glob("*.yaml"))
        raise UserError(f"--task {task}: no {path}; tasks: {names}")
    config = OmegaConf.load(path)
    return list(config.get("unseen") or config.labels)


def score(args: argparse.Namespace) -> dict[str, dict[str, float]]:
    """Score a probability CSV; with several sources, the pooled test (resampled within source) and the internal
    and external tests each (docs/rules.md §1, §3). Returns ``{scope: metrics}``."""
    labels = task_labels(args.task)
    predictions = read_predictions(args.predictions)
    ids = predictions[column] if (column := id_column(predictions.columns)) else None
    truth = read_truth(args.manifest, labels, args.split, getattr(args, "data", None), ids=ids)
    targets, probs = align_predictions(predictions, truth.frame, labels, source=str(args.predictions))
    sources = truth.sources if truth.sources is not None and len(set(truth.sources)) > 1 else None
    results = {"all": compute_suite(targets, probs, labels, n_boot=args.n_boot, strata=sources).metrics}
    for scope, rows in unseen_scopes(sources, truth.internal).items():
        if scope in ("internal", "external") or (truth.internal is None and scope.startswith("source/")):
            results[scope] = compute_suite(targets[rows], probs[rows], labels, n_boot=args.n_boot,
                                           strata=sources[rows]).metrics  # fmt: skip
    within = " (pooled, resampled within source)" if sources is not None else ""
    print(f"{args.predictions} on {truth.described}, {len(truth.frame)} images{within}, 95% bootstrap CIs")
    print("\n".join(score_lines(results["all"])))
    for scope, metrics in list(results.items())[1:]:
        rows = unseen_scopes(sources, truth.internal)[scope]
        name = truth.internal if scope == "internal" else ", ".join(sorted(set(sources[rows])))
        print(f"\n{scope} test ({name}), {len(rows)} images, resampled within source")
        print("\n".join(score_lines(metrics)[1:]))
    if sources is not None and truth.internal is None:
        print(f"\n  no internal/external split: no data config's internal_source is among the sources "
              f"{sorted(set(sources))} (--data names one)")  # fmt: skip
    # The rule behind the intervals, and what it leaves out (docs/evaluation.md, "Reading an interval").
    left_out = left_out_note({f"{args.split}/{k}": v for k, v in results["all"].items()}, args.split, args.n_boot)
    print("\n".join(f"  {line}" for line in (CI_RULE, left_out) if line))
    print(f"  {terminal_lines(Conventions(), {})[0]}")  # what the figures above mean where the paper is silent
    return results


def score_lines(metrics: dict[str, float]) -> list[str]:
    """The score table: the challenge's ranking chain in chain order, numbered, then the unranked headline metrics
    (docs/rules.md §2), so two files scored apart can be ranked by reading down."""
    chain = ranking_chain()
    lines = [f"  {chain_rule()}"]
    for name in headline_rows():
        rank = f"{chain.index(name) + 1}." if name in chain else "-"
        value = metrics.get(name)
        shown = "-" if value is None or not np.isfinite(value) else f"{value:.4f}"
        if shown != "-" and f"{name}_ci_low" in metrics:
            shown += f"  [{metrics[f'{name}_ci_low']:.4f}, {metrics[f'{name}_ci_high']:.4f}]"
        lines.append(f"  {rank:<3} {name:<11} {shown}")
    return lines


def mean_with_interval(values: np.ndarray, n_boot: int, seed: int = 0) -> tuple[float, float, float]:
    """Mean of the defined (non-NaN) per-image values with a 95% percentile interval over image resamples
    (docs/rules.md §3: whole images drawn with replacement; images left out stay out of each resample's mean)."""
    defined = values[np.isfinite(values)]
    if defined.size == 0:
        return float("nan"), float("nan"), float("nan")
    means = defined[resample_indices(defined.size, n_boot, seed)].mean(axis=1) if n_boot else defined[None].mean(1)
    low, high = np.percentile(means, [2.5, 97.5])
    return float(defined.mean()), float(low), float(high)


def score_concepts(args: argparse.Namespace) -> dict[str, float]:
    """Primary (and secondary) mean per-image F1 of a run file, printed with intervals and the per-concept table."""
    truth = read_concepts(args.manifest)
    run = read_run(args.predictions, list(truth))
    _, primary = per_image_f1(truth, run)
    scores = {"F1 (primary)": mean_with_interval(primary, args.n_boot)}
    notes = [f"{int(np.isfinite(primary).sum())} of {len(truth)} images have true concepts"]
    if args.manual is not None:
        manual = read_concepts(args.manual)
        unknown = [image_id for image_id in manual if image_id not in truth]
        if unknown:
            raise ConceptFileError(f"{args.manual}: {len(unknown)} id(s) not in {args.manifest}, e.g. {unknown[:5]}")
        allowed = SECONDARY[args.secondary](manual)
        _, secondary = per_image_f1({i: manual.get(i, frozenset()) for i in truth}, run, allowed=allowed)
        scores["F1 (secondary)"] = mean_with_interval(secondary, args.n_boot)
        notes.append(f"secondary: {len(allowed)} manually validated concepts ({args.secondary}), "
                     f"{int(np.isfinite(secondary).sum())} images with one")  # fmt: skip
    if args.names is not None and not args.names.is_file():
        raise ConceptFileError(f"concept names not found: {args.names}")
    names_path = args.names or find_table(args.manifest.parent, "cui_mapping.csv")
    names = read_concept_names(names_path) if names_path.is_file() else {}
    table = per_concept_table(truth, run, names)
    print(f"{args.predictions} on {args.manifest}, {len(truth)} images; mean per-image F1, 95% bootstrap CIs")
    for name, (value, low, high) in scores.items():
        print(f"  {name:<15} {value:.4f}  [{low:.4f}, {high:.4f}]")
    print("  " + "; ".join(notes))
    shown = table.head(SHOWN_CONCEPTS).copy()
    if not names:
        shown = shown.drop(columns="name")
    print(f"\nper concept ({min(len(table), SHOWN_CONCEPTS)} of {len(table)}, by support):")
    print(shown.to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    if args.out is not None:
        table.to_csv(args.out, index=False)
        print(f"per-concept table: {args.out}")
    return {name: value for name, (value, _, _) in scores.items()}


#: The task's ``submission_format`` -> how ``make score`` reads and scores a predictions file.
SCORERS: dict[str, Callable[[argparse.Namespace], object]] = {"probabilities": score, "concepts": score_concepts}


if __name__ == "__main__":
    main()
