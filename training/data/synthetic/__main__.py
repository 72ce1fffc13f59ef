"""CLI: ``python -m training.data.synthetic --out DIR`` generates a SYNTHETIC set and prints its per-class table."""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence

from training.data.synthetic.generate import format_table, generate


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Generate the SYNTHETIC chest X-ray set.")
    parser.add_argument("--out", required=True)
    parser.add_argument("--n-train", type=int, default=6000)
    parser.add_argument("--n-val", type=int, default=1500)
    parser.add_argument("--n-test", type=int, default=1500)
    parser.add_argument("--image-size", type=int, default=128)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--force", action="store_true")
    args = parser.parse_args(argv)
    manifest = generate(args.out, n_train=args.n_train, n_val=args.n_val, n_test=args.n_test,
                        image_size=args.image_size, seed=args.seed, workers=args.workers, force=args.force)  # fmt: skip
    record = json.loads((manifest.parent / "params.json").read_text())
    print(format_table(record["per_class"]))
    print(f"label noise (train only): {record['label_noise']}")


if __name__ == "__main__":
    main()
