"""Benchmark: two ranks of one node, one drawing samples twice as large; p99 wait of each.

The ranks run in lockstep (a barrier per batch stands for the all-reduce) on one
emulated store that both share, with deadline scheduling across the node's
ranks on and off. Target: the slower rank's p99 wait within 1.2x of the faster's.

    python benchmarks/balance.py [--samples 8000] [--bandwidth-mbs 180]
    python benchmarks/balance.py --tiny
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import balance_experiment as balance


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--samples", type=int, default=8000)
    p.add_argument("--bandwidth-mbs", type=float, default=180.0)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--tiny", action="store_true")
    p.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results"))
    args = p.parse_args(argv)
    kw = dict(n=args.samples, bandwidth=args.bandwidth_mbs * 1e6, repeats=args.repeats)
    if args.tiny:
        kw = dict(n=128, small=4096, repeats=1, step=0.002, data_dir=os.path.join(args.out, "sized-tiny"))
    res = balance.run(**kw)
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "balance.json")
    with open(path, "w") as f:
        json.dump(res, f, indent=1)
    print(balance.format_table(res))
    print(json.dumps({"json": path}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
