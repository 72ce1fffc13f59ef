"""Score a predictions CSV against a manifest split: ``make score PREDICTIONS=... MANIFEST=... [SPLIT=test]``.

For predictions made outside the platform (an ensemble, another team's export): the same metrics, rules and
bootstrap as every tracked run.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from omegaconf import OmegaConf

from evaluation.evaluate import MACROS
from evaluation.predictions import PredictionsError, align_predictions, read_predictions
from evaluation.suite import compute_suite
from training.data.findings import KNOWN_FINDINGS
from training.data.manifest import load_manifest
from training.errors import UserError, user_errors

CONFIGS = Path(__file__).resolve().parents[1] / "configs"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("predictions", type=Path)
    parser.add_argument("manifest", type=Path)
    parser.add_argument("--split", default="test")
    parser.add_argument("--task", default="task1")
    parser.add_argument("--n-boot", type=int, default=1000)
    parser.add_argument("--debug", action="store_true", help="show the traceback of an input error")
    args = parser.parse_args(argv)
    with user_errors(PredictionsError, debug=args.debug):
        score(args)


def task_labels(task: str) -> list[str]:
    """The label columns of ``configs/task/<task>.yaml``."""
    path = CONFIGS / "task" / f"{task}.yaml"
    if not path.is_file():
        names = sorted(p.stem for p in path.parent.glob("*.yaml"))
        raise UserError(f"--task {task}: no {path}; tasks: {names}")
    return list(OmegaConf.load(path).labels)


def score(args: argparse.Namespace) -> None:
    labels = task_labels(args.task)
    # Only the scored split must have images: an organisers' test-only manifest scores as well as a full one.
    manifest = load_manifest(args.manifest, labels, KNOWN_FINDINGS, check_files=False, splits=(args.split,),
                             refused="nothing was scored")  # fmt: skip
    truth = manifest.split(args.split)
    targets, probs = align_predictions(read_predictions(args.predictions), truth, labels, source=str(args.predictions))
    result = compute_suite(targets, probs, labels, n_boot=args.n_boot)
    print(f"{args.predictions} on {args.manifest} [{args.split}], {len(truth)} images, 95% bootstrap CIs")
    for macro in MACROS:
        m = result.metrics
        if macro in m:
            print(f"  {macro:<11} {m[macro]:.4f}  [{m[f'{macro}_ci_low']:.4f}, {m[f'{macro}_ci_high']:.4f}]")


if __name__ == "__main__":
    main()
