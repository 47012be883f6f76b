"""What the benchmarks on a FuseStore mount share: skip where FUSE is unavailable, run, write the
summary as JSON under ``out``, print the table."""

from __future__ import annotations

import json
import os
from typing import Any, Callable

from clairvoyant.testing import fuse_available


def add_store_args(p: Any, open_latency: float = 0.040, bandwidth: float = 400e6) -> None:
    """The emulated store's options (``--open-latency``, ``--read-latency``, ``--bandwidth``,
    ``--max-inflight``) on the parser ``p``."""
    p.add_argument("--open-latency", type=float, default=open_latency)
    p.add_argument("--read-latency", type=float, default=0.002)
    p.add_argument("--bandwidth", type=float, default=bandwidth)
    p.add_argument("--max-inflight", type=int, default=64)


def store_of(args: Any) -> dict:
    """The FuseStore's keyword arguments from the options of ``add_store_args``."""
    return dict(open_latency=args.open_latency, read_latency=args.read_latency, bandwidth=args.bandwidth,
                max_inflight=args.max_inflight)


def run_and_report(name: str, args: Any, run: Callable[[Any], dict], format_table: Callable[[dict], str]) -> int:
    ok, why = fuse_available()
    if not ok:
        print(f"{name}: skipped, the FUSE store is unavailable here: {why}")
        return 0
    summary = run(args)
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, f"{name}.json")
    with open(path, "w") as f:
        json.dump(summary, f, indent=1)
    print(format_table(summary))
    print(json.dumps({"json": path}))
    return 0
