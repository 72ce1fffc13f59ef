"""Entry point of ``make dicom-balance NAME=reveal DATA_ROOT=<folder> [BY=subset]``: are two subsets of a reader
study acquired alike?

It reads the studies the way the benchmark does (``configs/benchmark/<name>.yaml``), takes their DICOM headers
and tests each acquisition characteristic between the groups of the column ``BY`` with Pearson's chi-square
(:mod:`apps.benchmarks.reveal.acquisition`). Prints the tables and writes ``acquisition.csv`` (one row per study)
and ``acquisition_balance.csv`` to ``OUT`` (default ``data/checks/<name>``), without training or logging anything:
a check to run on a release before trusting a split. Bad input is one line on stderr and exit status 2.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from apps.benchmarks.framework.catalog import CONFIG_DIR, load_protocol
from apps.benchmarks.framework.protocol import BadInput
from apps.benchmarks.reveal.acquisition import balance_report


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="make dicom-balance", description=__doc__.split("\n\n")[0])
    parser.add_argument("--name", default="reveal", help="a reader-study benchmark (default: reveal)")
    parser.add_argument("--data-root", default="", help="the release or reader folder")
    parser.add_argument("--by", default="subset", help="study-table column whose groups are compared")
    parser.add_argument("--out", default=None, help="folder for the CSV files (default: data/checks/<name>)")
    parser.add_argument("--config-dir", default=str(CONFIG_DIR), help="folder of the protocol YAML files")
    return parser.parse_args(argv)


def run(args: argparse.Namespace) -> Path:
    protocol = load_protocol(args.name, args.config_dir)
    if not hasattr(protocol, "read"):
        raise BadInput(f"benchmark {args.name} is not a reader study (it has no study table to compare)")
    if not args.data_root:
        raise BadInput("needs DATA_ROOT, the release or reader folder: make dicom-balance DATA_ROOT=<dir> [BY=subset]")
    root = Path(args.data_root)
    if not root.is_dir():
        raise BadInput(f"data root {root} is not a folder")
    try:
        table = protocol.read(root).table
    except ValueError as error:
        raise BadInput(f"benchmark {args.name} cannot use data root {root}: {error}") from error
    if args.by not in table.columns:
        raise BadInput(f"no column {args.by!r} in the study table; choose BY from {', '.join(table.columns)}")
    not_dicom = table.loc[~table["path"].str.lower().str.endswith((".dcm", ".dicom")), "path"]
    if len(not_dicom):
        raise BadInput(f"{len(not_dicom)} studies are not DICOM files (e.g. {not_dicom.iloc[0]}): no acquisition tags")
    frame, summary, markdown = balance_report([root / p for p in table["path"]], table[args.by], args.by)
    out = Path(args.out or f"data/checks/{args.name}")
    out.mkdir(parents=True, exist_ok=True)
    frame.insert(0, "study_id", table["study_id"].to_numpy())
    frame.to_csv(out / "acquisition.csv", index=False)
    summary.to_csv(out / "acquisition_balance.csv", index=False)
    print(markdown)
    print(f"{len(table)} studies by {args.by}; tables written to {out}/acquisition.csv and acquisition_balance.csv")
    return out


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        run(args)
    except BadInput as error:
        print(f"make dicom-balance: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
