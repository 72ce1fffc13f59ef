"""``make ensemble``: fit ensemble weights on the members' validation predictions and log them as an MLflow run.

Reads each member's stored ``predictions/val.csv`` and ``predictions/test.csv`` (no image is predicted again),
fits the weighting on validation (:mod:`apps.ensemble`) and logs a finished run tagged ``cxrlt.kind=ensemble``,
which ``make submit MODEL=ensemble:<run id>`` then predicts with. This module is the command line alone: a
weighting that does not exist, fewer than two members or a missing store are answered before MLflow, torch and
the suite load.
"""

from __future__ import annotations

import argparse
import logging
import os
from collections.abc import Sequence

from training.config_files import option_names
from training.errors import UserError, user_errors
from training.run_lookup import split_checkpoint  # no MLflow or torch behind it

log = logging.getLogger(__name__)


def check_arguments(args: argparse.Namespace) -> None:
    """Refuse what no store lookup can fix, in one line naming the argument.

    Raises:
        UserError: an unknown ``--weighting``, a malformed checkpoint reference, or fewer than two members.
    """
    if args.weighting not in option_names("ensemble"):
        raise UserError(
            f"no weighting {args.weighting!r}; choose one of {option_names('ensemble')} (configs/ensemble/)"
        )
    members = sum(split_checkpoint(reference)[2] or 1 for reference in args.model)  # <run id>:top<k> is k members
    if members < 2:
        raise UserError(f"an ensemble needs at least two members (--model, or one <run id>:top<k>), got {members}")


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--task", default="task1")
    parser.add_argument(
        "--model",
        action="append",
        default=[],
        help="repeatable: run id, models:/ reference, <run id>:rank<n> (a kept checkpoint) or <run id>:top<k>",
    )
    parser.add_argument(
        "--weighting", default="per_model", help=f"one of {option_names('ensemble')} (configs/ensemble)"
    )
    parser.add_argument("--experiment", default=None, help="MLflow experiment (default: the task name)")
    parser.add_argument("--debug", action="store_true", help="show the traceback of an input error")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    from training.run_lookup import existing_store_client
    from training.tracking.uri import resolve_tracking_uri

    with user_errors(debug=args.debug):
        check_arguments(args)
        uri = resolve_tracking_uri()
        client = existing_store_client(uri)
    from apps.ensemble import WEIGHTS_ARTIFACT, fit_ensemble, table

    # Members that cannot be combined or loaded (user errors): the message names the run; anything else is a bug.
    with user_errors(debug=args.debug):
        run_id, metrics, stored = fit_ensemble(client, uri, args.task, args.model, args.weighting, args.experiment)
    log.info("%s", table(metrics, stored))
    log.info("ensemble run %s (%s weights in %s); submit with: make submit TASK=%s MODEL=ensemble:%s", run_id,
             stored.weighting, WEIGHTS_ARTIFACT, args.task, run_id)  # fmt: skip


if __name__ == "__main__":
    main()
