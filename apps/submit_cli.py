"""``make submit``'s command line: the arguments are checked before the model stack loads (:mod:`apps.submit`).

A missing ``TEMPLATE``, ``MANIFEST`` or ``ROOT``, or a malformed template, is one line before torch, MLflow and the
model are loaded and the test images predicted, rather than a traceback after minutes of prediction.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from evaluation.concept_thresholds import MODES
from training.errors import UserError, user_errors

#: ``--id-column``: the organisers' tables and the 2026 winners write ``ImageID``; the challenge page still names
#: the column ``dicom_id``, a leftover of earlier editions, so that spelling is one switch away.
ID_COLUMNS = ("ImageID", "dicom_id")


def check_inputs(args: argparse.Namespace) -> None:
    """Refuse a named input that is not there, or a malformed template, in one line naming it.

    Raises:
        UserError: ``--template`` or ``--manifest`` is not a file, ``--root`` is not a folder, or the template is
            malformed (:func:`apps.submission.check_template`: a duplicated id, a mix of named and empty headers...).
    """
    if args.template is not None and not args.template.is_file():
        raise UserError(f"--template {args.template}: no such file (the organisers' template comes with their test "
                        "images; without TEMPLATE the test split of the model's data is submitted)")  # fmt: skip
    if args.template is not None:
        from apps.submission import SubmissionError, check_template  # pandas: only once there is a template

        try:
            check_template(args.template)
        except SubmissionError as error:
            raise UserError(str(error)) from None
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
    parser.add_argument(
        "--template",
        type=Path,
        default=None,
        help="the organisers' test list as released (CXRLT_2026_TEST_ALL_TASK<n>.csv) or sample submission",
    )
    parser.add_argument("--manifest", type=Path, default=None, help="manifest to predict (default: the run's)")
    parser.add_argument("--root", type=Path, default=None, help="image root of --manifest (default: its folder)")
    parser.add_argument("--split", default="test")
    parser.add_argument("--tta", default=None, help="a configs/tta/<name>.yaml, e.g. default or multicrop")
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="<name>.zip: the upload (the CSV and code/); <name>.csv: the CSV alone "
        "(default mlruns/submissions/<task>-<time>.zip)",
    )
    parser.add_argument(
        "--id-column",
        default=None,
        choices=ID_COLUMNS,
        help="the id column's name (default: the template's, else ImageID)",
    )
    parser.add_argument(
        "--thresholds",
        default=None,
        choices=sorted(MODES),
        help="concept tasks: how thresholds are chosen on validation (default: the task's)",
    )
    parser.add_argument("--debug", action="store_true", help="show the traceback of an input error")
    args = parser.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)  # for the zip's code/COMMAND.txt
    with user_errors(debug=args.debug):
        check_inputs(args)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    from apps.submit import run  # torch, MLflow and the model stack: only for arguments that passed

    run(args)


if __name__ == "__main__":
    main()
