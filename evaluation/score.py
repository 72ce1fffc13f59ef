"""Score a predictions CSV against a manifest split: ``make score PREDICTIONS=... MANIFEST=... [SPLIT=test]``.

For predictions made outside the platform (an ensemble, another team's export): the same metrics, rules and
bootstrap as every tracked run.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd
from omegaconf import OmegaConf

from evaluation.evaluate import MACROS
from evaluation.predictions import align_predictions
from evaluation.suite import compute_suite
from training.data.findings import KNOWN_FINDINGS
from training.data.manifest import load_manifest

CONFIGS = Path(__file__).resolve().parents[1] / "configs"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("predictions", type=Path)
    parser.add_argument("manifest", type=Path)
    parser.add_argument("--split", default="test")
    parser.add_argument("--task", default="task1")
    parser.add_argument("--n-boot", type=int, default=1000)
    args = parser.parse_args()
    labels = list(OmegaConf.load(CONFIGS / "task" / f"{args.task}.yaml").labels)
    manifest = load_manifest(args.manifest, labels, KNOWN_FINDINGS, check_files=False)
    truth = manifest.split(args.split)
    targets, probs = align_predictions(pd.read_csv(args.predictions), truth, labels, source=str(args.predictions))
    result = compute_suite(targets, probs, labels, n_boot=args.n_boot)
    print(f"{args.predictions} on {args.manifest} [{args.split}], {len(truth)} images, 95% bootstrap CIs")
    for macro in MACROS:
        m = result.metrics
        if macro in m:
            print(f"  {macro:<11} {m[macro]:.4f}  [{m[f'{macro}_ci_low']:.4f}, {m[f'{macro}_ci_high']:.4f}]")


if __name__ == "__main__":
    main()
