"""Benchmark: the CPU one staged sample costs, staging threads alone (no decoding).

Stages the demo's data set from the emulated store with the Stager, every
sample a miss, and prints files/s and the user and system CPU time per file of
this process. ``--mode keep``: each miss is written to a fresh local tier (what
the first epoch does, and a kept miss of the bounded cache); ``--mode ram``:
each miss is held in the RAM window (a miss the bounded cache does not keep).

    python benchmarks/staging_cpu.py --threads 32 [--images 3200] [--mode keep|ram]
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import sys
import tempfile
import threading
import time

from clairvoyant import manifest as manifest_mod
from clairvoyant.cache.local import LocalStore
from clairvoyant.cache.tiers import Placement, Tiers
from clairvoyant.nodeio.paths import cache_home
from clairvoyant.stage.engine import Stager
from clairvoyant.testing import EmulatedStore, make_dataset


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--threads", type=int, default=32)
    p.add_argument("--images", type=int, default=3200)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--mode", choices=("keep", "ram"), default="keep")
    p.add_argument("--open-latency-ms", type=float, default=10.0)
    args = p.parse_args(argv)
    root = make_dataset(os.path.join(cache_home(), "demo", f"synthetic-imagenet-{args.images}"), args.images)
    store = EmulatedStore(root, open_latency=args.open_latency_ms / 1e3)
    man = manifest_mod.build(store)
    work = tempfile.mkdtemp(prefix="clairvoyant-stagecpu-")
    try:
        for rep in range(args.repeats):
            local = LocalStore(os.path.join(work, str(rep)), store.uri)
            ram_dir = os.path.join(work, f"ram{rep}")
            tiers = Tiers(local, lambda: LocalStore(ram_dir, store.uri, entries=False), 1 << 40, 1 << 34, store)
            done, count, lock = threading.Event(), [0], threading.Lock()

            def on_done(batch: int, idx: int, outcome, *seconds: float) -> None:
                if not isinstance(outcome, Placement):
                    print(f"staging failed: {outcome!r}", file=sys.stderr)
                with lock:   # staging threads call this concurrently
                    count[0] += 1
                    if count[0] == len(man):
                        done.set()

            stager = Stager(store, tiers, man, threads=args.threads, on_done=on_done)
            r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
            stager.start()
            for b in range(0, len(man), 32):
                n = min(b + 32, len(man)) - b
                stager.submit(b // 32, range(b, b + n), [False] * n, [args.mode == "keep"] * n)   # all misses
            done.wait()
            dt, r1 = time.perf_counter() - t0, resource.getrusage(resource.RUSAGE_SELF)
            stager.close()
            tiers.close()
            local.close()
            tiers.ram.close()
            n = len(man)
            print(f"{args.mode}, threads {args.threads}: {n / dt:.0f} files/s, per file: user "
                  f"{(r1.ru_utime - r0.ru_utime) / n * 1e6:.0f} us, system {(r1.ru_stime - r0.ru_stime) / n * 1e6:.0f} us")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
