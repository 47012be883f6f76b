"""Benchmark: clairvoyant's staging loader against PyTorch's DataLoader on the emulated store.

Runs the demo's measurement (Serizawa & Tatebe's: time to draw N mini-batches with
no compute) and writes benchmarks/results/staging.json and .png. Every figure is a
ratio against a reference measured in the same run.

    python benchmarks/staging_vs_dataloader.py                # default size (100 batches)
    python benchmarks/staging_vs_dataloader.py --batches 1000 # the paper's count
    python benchmarks/staging_vs_dataloader.py --tiny         # CI smoke size
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from clairvoyant.experiments import staging


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batches", type=int, default=100)
    p.add_argument("--workers", default="2,4,8,16")
    p.add_argument("--tiny", action="store_true", help="a few batches of small images, for CI")
    p.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results"))
    args = p.parse_args(argv)
    kw = dict(batches=args.batches, workers_grid=tuple(int(w) for w in args.workers.split(",")))
    if args.tiny:
        kw.update(batches=3, batch_size=8, workers_grid=(1, 2), stage_threads=4, open_latency=0.001,
                  read_latency=0.0)
    summary = staging.run(progress=sys.stderr.isatty(), **kw)
    jpath, ppath = staging.write(summary, args.out)
    print(staging.format_table(summary))
    print(json.dumps({"json": jpath, "plot": ppath}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
