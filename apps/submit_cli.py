"""``make submit``'s command line: the arguments are checked before the model stack loads (:mod:`apps.submit`).

A missing ``TEMPLATE``, ``MANIFEST`` or ``ROOT`` is one line in the time Python takes to start, not after torch,
MLflow and the model were loaded and the test images predicted (a missing template once surfaced as pandas'
``FileNotFoundError`` 38 lines into a traceback, after the prediction).
"""

from __future__ import annotations

import argparse
import logging
import os
from collections.abc import Sequence
from pathlib import Path

from evaluation.concept_thresholds import MODES
from training.errors import UserError, user_errors


def check_inputs(args: argparse.Namespace) -> None:
    """Refuse a named input file or folder that is not there, in one line naming it.

    Raises:
        UserError: ``--template`` or ``--manifest`` is not a file, or ``--root`` is not a folder.
    """
    if args.template is not None and not args.template.is_file():
        raise UserError(f"--template {args.template}: no such file (the organisers' template comes with their test "
                        "images; without TEMPLATE the test split of the model's data is submitted)")  # fmt: skip
    if args.manifest is not None and not args.manifest.is_file():
        raise UserError(f"--manifest {args.manifest}: no such file")
    if args.root is not None and not args.root.is_dir():
        raise UserError(f"--root {args.root}: no such folder")


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--task", default="task1")
    parser.add_argument(
        "--model",
        action="append",
        help="repeatable; default models:/cxrlt-<task>@champion; or ensemble:<make ensemble run id>",
    )
    parser.add_argument("--template", type=Path, default=None, help="the organisers' template CSV")
    parser.add_argument("--manifest", type=Path, default=None, help="manifest to predict (default: the run's)")
    parser.add_argument("--root", type=Path, default=None, help="image root of --manifest (default: its folder)")
    parser.add_argument("--split", default="test")
    parser.add_argument("--tta", default=None, help="a configs/tta/<name>.yaml, e.g. default or multicrop")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument(
        "--thresholds",
        default=None,
        choices=sorted(MODES),
        help="concept tasks: how thresholds are chosen on validation (default: the task's)",
    )
    parser.add_argument("--debug", action="store_true", help="show the traceback of an input error")
    args = parser.parse_args(argv)
    with user_errors(debug=args.debug):
        check_inputs(args)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    from apps.submit import run  # torch, MLflow and the model stack: only for arguments that passed

    run(args)


if __name__ == "__main__":
    main()
