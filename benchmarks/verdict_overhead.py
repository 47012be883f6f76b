"""Benchmark: what the loader's own measurement costs (target: at most 2% of images/s).

1. images/s of the demo's data set, warm local tier, with ``metrics=`` (a JSON
   line per batch) and ``verdict=True`` against without, interleaved runs;
2. the CPU of the per-batch bookkeeping that is always on (timestamps, the
   wait split, the windows), timed in isolation, against the time of a batch.

    python benchmarks/verdict_overhead.py [--repeats 5]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

import numpy as np

from clairvoyant import Loader
from clairvoyant.load.records import EpochWindow
from clairvoyant.nodeio.paths import cache_home
from clairvoyant.testing import make_dataset
from clairvoyant.tune.stats import Stats
from clairvoyant.tune.verdict import split_wait


def rate(root: str, local: str, metrics: str | None, epochs: int) -> float:
    with Loader(root, batch_size=32, local_dir=local, num_workers=2, output="numpy", metrics=metrics,
                verdict=metrics is not None) as ld:
        ld.set_epoch(0)
        list(ld)   # warm
        t0, n = time.perf_counter(), 0
        for e in range(1, epochs + 1):
            ld.set_epoch(e)
            n += sum(len(y) for _, y in ld)
        return n / (time.perf_counter() - t0)


def bookkeeping_us(n: int = 20000) -> float:
    stats, window = Stats(), EpochWindow()
    t0 = time.perf_counter()
    for i in range(n):
        c = split_wait(1.0, 1.01, 0.995, 1.002, (0.001, 0.008, 0.0005))
        stats.timings.record(0.01, 0.02, 32)
        stats.add_causes(c)
        stats.add_worker((0.001, 0.008, 0.0005), 32)
        window.add(0.01, 0.02, 32, c)
    return (time.perf_counter() - t0) / n * 1e6


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--images", type=int, default=3200)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args(argv)
    root = make_dataset(os.path.join(cache_home(), "demo", f"synthetic-imagenet-{args.images}"), args.images)
    on, off = [], []
    with tempfile.TemporaryDirectory(prefix="clairvoyant-overhead-") as work:
        for r in range(args.repeats):
            off.append(rate(root, os.path.join(work, "l"), None, args.epochs))
            on.append(rate(root, os.path.join(work, "l"), os.path.join(work, f"m{r}.jsonl"), args.epochs))
    per_batch = bookkeeping_us()
    batch_ms = 32 / np.median(off) * 1e3
    print(f"images/s without metrics: {' / '.join(f'{x:.0f}' for x in off)} (median {np.median(off):.0f})")
    print(f"images/s with metrics=, verdict=True: {' / '.join(f'{x:.0f}' for x in on)} (median {np.median(on):.0f})")
    print(f"ratio with/without: {np.median(on) / np.median(off):.3f} (target >= 0.98)")
    print(f"always-on bookkeeping: {per_batch:.1f} us per batch = {per_batch / 1e3 / batch_ms:.2%} of a batch "
          f"({batch_ms:.1f} ms at the measured rate)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
