"""What the benchmarks on a FuseStore mount share: skip where FUSE is unavailable, run, write the
summary as JSON under ``out``, print the table."""

from __future__ import annotations

import json
import os
from typing import Any, Callable

from clairvoyant.testing import fuse_available


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
