"""``make compare``: is run B really better than run A? A paired bootstrap of runs (or a grid's seeds) on one test set.

``make compare RUNS="<ref> <ref> ..."`` compares finished runs, registered versions or grid tags
(``apps.compare_runs``); ``make compare LOSSES=... SEEDS=...`` trains the grid first, prints its mean ± std table
(``apps.compare_grid``) and then compares its configurations the same way. The statistics are
``evaluation.paired`` / ``evaluation.comparison``; how to read them: docs/compare.md.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

from apps.compare_grid import grid_table
from apps.compare_runs import CompareError
from evaluation.comparison import CORRECTION, Settings
from evaluation.paired_data import DifferentTestSets
from training.errors import user_errors
from training.run_refs import ModelNotFound, existing_store_client
from training.tracking.uri import resolve_tracking_uri


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("references", nargs="*", help="run ids, models:/<name>/<version> or @<alias>, grid tags")
    parser.add_argument("--experiment", default=None, help="look grid tags up in this experiment only")
    parser.add_argument("--grid", default=None, help="a cxrlt.grid tag: its mean ± std table, then the comparison")
    parser.add_argument("--by", default="loss.name", help="param that splits a grid into entries (loss.name)")
    parser.add_argument("--split", default=None, help="the stored predictions compared, predictions/<split>.csv "
                        "(default: the task's headline set, test; test_unseen for Task 2)")  # fmt: skip
    parser.add_argument("--n-boot", type=int, default=Settings.n_boot, help="shared resamples (default %(default)s)")
    parser.add_argument("--seed", type=int, default=Settings.seed, help="resampling seed (default %(default)s)")
    parser.add_argument("--alpha", type=float, default=Settings.alpha, help="family-wise level (default %(default)s)")
    parser.add_argument("--out", type=Path, default=None, help="also keep the tables, figure and report here")
    parser.add_argument("--no-log", action="store_true", help="do not log the comparison as an MLflow run")
    parser.add_argument("--debug", action="store_true", help="show the traceback of an input error")
    args = parser.parse_args(argv)
    if args.grid and not args.experiment:
        parser.error("--grid needs --experiment (the task's experiment the grid was trained in)")
    from apps.compare_work import run_comparison  # matplotlib and the suite: after the arguments are checked

    uri = resolve_tracking_uri()
    references = list(args.references) + ([f"grid:{args.grid}"] if args.grid else [])
    with user_errors(CompareError, DifferentTestSets, ModelNotFound, debug=args.debug):
        client = existing_store_client(uri)
        if args.grid:
            table = grid_table(client, args.experiment, args.grid, args.by)
            print(f"\ngrid {args.grid} in experiment {args.experiment}: mean ± std over seeds\n")
            print(table.to_string(index=False))
        settings = Settings(n_boot=args.n_boot, seed=args.seed, alpha=args.alpha)
        comparison, task, run_id = run_comparison(client, uri, references, args.by, args.experiment, settings,
                                            log=not args.no_log, out=args.out, split=args.split)  # fmt: skip
    print(f"\npaired bootstrap, {settings.n_boot} shared resamples, {comparison.strata}; p {CORRECTION}-adjusted, "
          f"significant below {settings.alpha}\n")  # fmt: skip
    print(comparison.verdict_table().to_string(index=False))
    print("\nverdict:")
    for line in comparison.verdict():
        print(f"  {line}")
    for note in comparison.notes:
        print(f"note: {note}")
    if run_id:
        print(f"\nlogged as run {run_id} in experiment compare-{task} (report: compare/report.html); each compared "
              "run is tagged cxrlt.compared_in with it")  # fmt: skip


if __name__ == "__main__":
    main()
