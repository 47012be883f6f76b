"""Benchmark: stage_threads="auto" against a grid of fixed thread counts, and a latency step.

    python benchmarks/autotune.py            # three profiles and the step (about 6 minutes)
    python benchmarks/autotune.py --readers  # instead: reader processes 1-4, threads on auto
    python benchmarks/autotune.py --tiny     # CI smoke size
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import autotune_experiment as autotune


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tiny", action="store_true")
    p.add_argument("--readers", action="store_true", help="vary the reader processes instead")
    p.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results"))
    args = p.parse_args(argv)
    if args.readers:
        res = autotune.readers_grid()
        print("| profile | " + " | ".join(f"{w} readers" for w in next(iter(res.values()))) + " |")
        print("| --- " * (len(next(iter(res.values()))) + 1) + "|")
        for name, r in res.items():
            print(f"| {name} | " + " | ".join(f"{v:,.0f}" for v in r.values()) + " |")
        return 0
    if args.tiny:
        res = {"grid": autotune.grid(images=96, grid_threads=(2, 8), epochs=2, auto_epochs=3,
                                     profiles=["latency-bound"], data_dir=os.path.join(args.out, "tiny-data"))}
    else:
        res = {"grid": autotune.grid(progress=print), "step": autotune.step_change()}
    print("| profile | " + " | ".join(f"{t} threads" for t in next(iter(res["grid"].values()))["fixed"])
          + " | auto | auto / best fixed |")
    print("| --- " * (len(next(iter(res["grid"].values()))["fixed"]) + 3) + "|")
    for name, r in res["grid"].items():
        cells = " | ".join(f"{v:,.0f}" for v in r["fixed"].values())
        print(f"| {name} | {cells} | {r['auto']:,.0f} ({r['auto_threads']} threads, {r['auto_readers']} readers) "
              f"| {r['ratio']:.2f} |")
    if "step" in res:
        s = res["step"]
        print(f"step: latency x4 at {s['switch_at_s']:.1f} s; images/s per second: "
              + " ".join(f"{x:.0f}" for x in s["images_per_s"]))
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "autotune.json")
    with open(path, "w") as f:
        json.dump(res, f, indent=1, default=str)
    print(json.dumps({"json": path}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
