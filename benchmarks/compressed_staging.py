"""Benchmark: compressed staging against staging as it is (issue 24), the local tier at a share of
the raw data set, on the FUSE-emulated store.

The data: ``benchmarks/hdf5_epochs.py``'s CosmoFlow-like volumes (int16, ``--side``^3 x 4
channels, smooth fields that compress about 2x, four float32 targets each) in HDF5 files. The
same loop (``Loader(HDF5Source(mount, dataset="x", fields=["y"]), local_capacity=--capacity)``,
batches touched with a sum) runs ``--epochs`` epochs twice, each in a process of its own with
``import torch`` done before the clock: ``compress=None`` and ``compress="auto"`` (zstd where
installed); the kernel's pages of the store's files are dropped after each epoch (a data set
larger than memory). Reported per epoch: the store's bytes read over the data set's, and samples/s; then
the later epochs' store reads and samples/s of compressed over uncompressed staging (targets:
store reads <= 0.6x the data set per later epoch, samples/s >= 1.2x). Writes
benchmarks/results/compressed_staging.json.

    python benchmarks/compressed_staging.py
    python benchmarks/compressed_staging.py --samples 64 --side 32 --epochs 2   # a smoke size
"""

from __future__ import annotations

import torch  # noqa: F401  (imported before any clock: its import is not timed)

import argparse
import json
import os
import sys

HERE = os.path.abspath(__file__)
sys.path.insert(0, os.path.dirname(HERE))


def child(compress: str, data: str, work: str, args: argparse.Namespace, store: dict) -> dict:
    from clairvoyant import Loader
    from clairvoyant.source import HDF5Source
    from clairvoyant.testing import FuseStore, drop_pages
    from hdf5_epochs import timed_epoch

    out: dict = {"compress": compress, "epochs": []}
    with FuseStore(data, **store) as fs:
        fs.reset()
        with Loader(HDF5Source(fs.path, dataset="x", fields=["y"]), batch_size=args.batch, seed=0,
                    local_dir=os.path.join(work, "local"), local_capacity=args.capacity, num_workers=args.workers,
                    compress=None if compress == "none" else compress, cluster=False) as ld:
            out["ratio"] = ld.compress_ratio
            for e in range(args.epochs):
                ld.set_epoch(e)
                out["epochs"].append(timed_epoch(ld, fs))
                # as a data set larger than memory: the next epoch's reads of the store reach it
                drop_pages(os.path.join(fs.path, f) for f in os.listdir(fs.path))
            used, _ = ld.tiers.local.ledger.read()
            out["tier_bytes"], out["capacity"] = used, ld.tiers.local_capacity
    return out


def main(argv: list[str] | None = None) -> int:
    from hdf5_epochs import STORE_OPTIONS, arguments, run_children

    p = arguments(__doc__)
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--capacity", default="30%", help="the local tier, a share of the raw data set")
    args = p.parse_args(argv)
    store = dict(open_latency=args.open_latency, read_latency=args.read_latency, bandwidth=args.bandwidth)
    if args.child:
        kind, data, work = args.child
        print(json.dumps(child(kind, data, work, args, store)))
        return 0
    done = run_children(HERE, ("none", "auto"), args, STORE_OPTIONS + ("epochs", "capacity"),
                        "clairvoyant-compress-bench-")
    if done is None:
        return 1
    nbytes, runs = done
    later = slice(1, None)
    per = {k: [e["store_bytes"] / nbytes for e in v["epochs"]] for k, v in runs.items()}
    rate = {k: [e["samples"] / e["seconds"] for e in v["epochs"]] for k, v in runs.items()}

    def mean(xs):
        return sum(xs) / max(1, len(xs))

    summary = {"samples": args.samples, "side": args.side, "bytes": nbytes, "capacity": args.capacity,
               "store": store, "runs": runs, "store_per_epoch": per, "samples_per_s": rate,
               "later_store": {k: mean(v[later]) for k, v in per.items()},
               "later_speedup": mean(rate["auto"][later]) / mean(rate["none"][later])}
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "compressed_staging.json"), "w") as f:
        json.dump(summary, f, indent=1)
    print(f"{args.samples} volumes of {nbytes / args.samples / 2**20:.1f} MiB, local tier {args.capacity} of the raw "
          f"data set, {args.epochs} epochs; FUSE store {args.open_latency * 1e3:g} ms per open, "
          f"{args.bandwidth / 1e6:g} MB/s")
    for k in runs:
        print(f"  compress={k:5s} (ratio {runs[k]['ratio']:.2f}): store read per epoch "
              + ", ".join(f"{x:.2f}x" for x in per[k]) + "; samples/s " + ", ".join(f"{x:.1f}" for x in rate[k])
              + f"; tier {runs[k]['tier_bytes'] / 2**20:.0f} of {runs[k]['capacity'] / 2**20:.0f} MiB")
    print(f"later epochs: store read {summary['later_store']['auto']:.2f}x compressed against "
          f"{summary['later_store']['none']:.2f}x (target <= 0.6x); samples/s {summary['later_speedup']:.2f}x "
          "uncompressed staging's (target >= 1.2x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
