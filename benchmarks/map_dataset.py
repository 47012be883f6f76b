"""Benchmark: a map-style dataset with no files (pytorch/examples' ``--dummy``: torchvision's
FakeData), through clairvoyant's Loader against PyTorch's DataLoader, same reader count, same
batches, interleaved runs. Nothing is staged either way: this measures what the Loader's plan,
readers and shared-memory batches cost or save when its dataset makes its samples itself
(target: at least 0.9x the DataLoader).

    python benchmarks/map_dataset.py [--samples 2048] [--size 64] [--workers 2] [--repeats 3]

``import torch`` and torchvision are done before any clock starts; each run builds its loader,
then times two epochs (the first batch included: as a user's epoch).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import sys
import tempfile
import time

import torch
from torchvision import datasets, transforms

from clairvoyant import Loader


def samples_per_s(kind: str, ds, batch: int, workers: int, epochs: int, local: str) -> float:
    if kind == "dataloader":
        loader = torch.utils.data.DataLoader(ds, batch_size=batch, shuffle=True, num_workers=workers,
                                             persistent_workers=True)
    else:
        loader = Loader(ds, batch_size=batch, num_workers=workers, local_dir=local, seed=0)
    try:
        t0, n = time.perf_counter(), 0
        for e in range(epochs):
            if kind != "dataloader":
                loader.set_epoch(e)
            for x, _ in loader:
                n += len(x)
        return n / (time.perf_counter() - t0)
    finally:
        if kind != "dataloader":
            loader.close()
        else:
            del loader


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--samples", type=int, default=2048)
    p.add_argument("--size", type=int, default=64, help="FakeData's images are 3 x SIZE x SIZE")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results"))
    args = p.parse_args(argv)
    logging.getLogger("clairvoyant").setLevel(logging.ERROR)   # (the "nothing is staged" line, once per run)
    ds = datasets.FakeData(args.samples, (3, args.size, args.size), 1000, transforms.ToTensor())
    rates: dict[str, list[float]] = {"dataloader": [], "clairvoyant": []}
    with tempfile.TemporaryDirectory(prefix="clairvoyant-mapds-") as local:
        for _ in range(args.repeats):
            for kind in rates:   # interleaved
                rates[kind].append(samples_per_s(kind, ds, args.batch, args.workers, args.epochs, local))
    med = {k: statistics.median(v) for k, v in rates.items()}
    ratio = med["clairvoyant"] / med["dataloader"]
    print(f"FakeData {args.samples} x 3x{args.size}x{args.size}, batch {args.batch}, {args.workers} readers, "
          f"{args.epochs} epochs, median of {args.repeats} interleaved runs")
    print("| loader | samples/s (median) | runs |")
    print("| --- | --- | --- |")
    for k, v in rates.items():
        print(f"| {k} | {med[k]:,.0f} | {', '.join(f'{x:,.0f}' for x in v)} |")
    print(f"clairvoyant / DataLoader: {ratio:.2f}x (target >= 0.9)")
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "map_dataset.json")
    with open(path, "w") as f:
        json.dump({"args": vars(args), "rates": rates, "median": med, "ratio": ratio}, f, indent=1)
    print(json.dumps({"json": path}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
