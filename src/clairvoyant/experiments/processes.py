"""Running a few forked processes that each write their result as JSON (the experiments' ranks)."""

from __future__ import annotations

import json
import multiprocessing as mp
from typing import Callable


def run_forked(target: Callable, arg_lists: list[tuple], outs: list[str], what: str = "process") -> list:
    """Run ``target(*args, out)`` in one forked process per ``args``; each writes JSON to its ``out``.
    Return the parsed results in order; RuntimeError if any process failed."""
    ctx = mp.get_context("fork")
    procs = [ctx.Process(target=target, args=(*args, out)) for args, out in zip(arg_lists, outs)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    if any(p.exitcode != 0 for p in procs):
        raise RuntimeError(f"a {what} failed: exit codes {[p.exitcode for p in procs]}")
    results = []
    for out in outs:
        with open(out) as f:
            results.append(json.load(f))
    return results
