"""Benchmark: bounded local tier, hit rate per epoch against the offline optimum and LRU.

Runs the real loader (1 and 4 ranks sharing the node's tiers) at local
capacities of 10, 25, 50 and 75% of the data set for 4 epochs, and the same
access sequence through the reference simulators; with --throughput also
images/s at 50% capacity against unbounded capacity (same store, interleaved),
and on a store too slow for the miss stream against min(decode rate, source
rate / (1 - f)).
Writes benchmarks/results/caching.json and caching.png.

    python benchmarks/caching.py [--images 2000] [--throughput]
    python benchmarks/caching.py --tiny     # CI smoke size
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from clairvoyant.experiments import caching


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--images", type=int, default=2000)
    p.add_argument("--throughput", action="store_true", help="also time 50%% capacity against unbounded")
    p.add_argument("--tiny", action="store_true")
    p.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results"))
    args = p.parse_args(argv)
    kw = dict(images=args.images)
    if args.tiny:
        kw = dict(images=120, fractions=(0.5,), ranks_grid=(1, 2), epochs=2)
    summary = caching.hit_rates(progress=True, **kw)
    if args.throughput:
        summary["throughput"] = caching.throughput()
        summary["source_limited"] = caching.source_limited()
    jpath, ppath = caching.write(summary, args.out)
    print(caching.format_table(summary))
    if "throughput" in summary:
        t = summary["throughput"]
        print(f"images/s after the first epoch at {t['fraction']:.0%} capacity: {t['median']['bounded']:.0f}, "
              f"unbounded: {t['median']['unbounded']:.0f} -> ratio {t['ratio']:.2f} (target >= 0.9)")
        s = summary["source_limited"]
        m = s["median"]
        print(f"source-limited ({s['bandwidth'] / 1e6:.0f} MB/s): {m['bounded']:.0f} images/s at {s['fraction']:.0%}; "
              f"decode {m['decode']:.0f}/s, source {m['source']:.0f}/s -> limit {s['limit']:.0f} -> ratio "
              f"{s['ratio']:.2f} (target >= 0.9)")
    print(json.dumps({"json": jpath, "plot": ppath}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
