"""The autotuner against a grid of fixed staging thread counts, on three profiles, and after a step
change of the source's latency.

Profiles (local tier at 10% of the data set, so nine samples in ten are read
from the source every epoch; 2 readers): a latency-bound source (40 ms per
open), a decode-bound workload (a heavy transform, 2 ms of CPU per sample), a
bandwidth-bound source (30 MB/s shared). For each, images/s over epochs 2-3
with stage_threads fixed at each value of the grid (2 readers), and with both
on auto over the last two of six epochs (the reader count moves once per epoch). The step run starts at 10 ms per
open and goes to 40 ms after a few seconds; images/s per second of wall time
shows how long auto takes to get back to 90% of the best fixed count's rate at
40 ms.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
import time

import numpy as np

from clairvoyant.load.decode import decode_image
from clairvoyant.testing import EmulatedStore, make_dataset

PROFILES = {
    "latency-bound": dict(store=dict(open_latency=0.040, read_latency=0.002, bandwidth=400e6), heavy=0.0),
    "decode-bound": dict(store=dict(open_latency=0.002, read_latency=0.0, bandwidth=400e6), heavy=0.002),
    "bandwidth-bound": dict(store=dict(open_latency=0.010, read_latency=0.002, bandwidth=30e6), heavy=0.0),
}


class HeavyDecode:
    """Decode, then burn ``seconds`` of CPU (a stand-in for a heavy transform)."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def __call__(self, data: bytes):
        img = decode_image(data)
        end = time.thread_time() + self.seconds
        x = img.astype(np.float32)
        while time.thread_time() < end:
            x = x * 0.999 + 0.001
        return img


def _run(root: str, store_kw: dict, heavy: float, threads, epochs: int, images_only_after: int = 1,
         on_start=None, readers: int | None = 2) -> tuple[float, list[tuple[float, int]], tuple[int, int]]:
    from clairvoyant.load.loader import Loader
    work = tempfile.mkdtemp(prefix="clairvoyant-autotune-")
    try:
        store = EmulatedStore(root, state_dir=os.path.join(work, "emu"), **store_kw)
        decode = HeavyDecode(heavy) if heavy else None
        trace: list[tuple[float, int]] = []
        with Loader(store, batch_size=32, local_dir=os.path.join(work, "l"), num_workers=readers, output="numpy",
                    local_capacity="10%", stage_threads=threads, decode=decode) as ld:
            if on_start is not None:
                on_start(store)
            n = 0
            t_measure = None
            for e in range(epochs):
                ld.set_epoch(e)
                if e == images_only_after:
                    t_measure, n = time.perf_counter(), 0
                for _, y in ld:
                    n += len(y)
                    trace.append((time.perf_counter(), len(y)))
            rate = n / (time.perf_counter() - t_measure) if t_measure is not None else 0.0
            st = ld.stats()
            return rate, trace, (st["stage_threads"], st["readers"])
    finally:
        shutil.rmtree(work, ignore_errors=True)


def grid(*, images: int = 3200, grid_threads=(4, 8, 16, 32, 64), epochs: int = 3, auto_epochs: int = 6,
         profiles=None, data_dir: str | None = None, progress=None) -> dict:
    """Fixed thread counts (2 readers) measured over epochs 2-3; auto (threads and readers) over
    its last two of ``auto_epochs`` epochs, once the per-epoch reader tuning has had its steps."""
    from clairvoyant.nodeio.paths import cache_home
    root = make_dataset(data_dir or os.path.join(cache_home(), "demo", f"synthetic-imagenet-{images}"), images)
    out = {}
    for name in profiles or PROFILES:
        p = PROFILES[name]
        fixed = {t: _run(root, p["store"], p["heavy"], t, epochs)[0] for t in grid_threads}
        auto, _, (threads, readers) = _run(root, p["store"], p["heavy"], "auto", auto_epochs,
                                           images_only_after=auto_epochs - 2, readers=None)
        best = max(fixed, key=fixed.get)
        out[name] = {"fixed": fixed, "auto": auto, "auto_threads": threads, "auto_readers": readers,
                     "best_threads": best, "ratio": auto / fixed[best]}
        if progress:
            progress(f"{name}: auto {auto:.0f} images/s ({threads} threads, {readers} readers), best fixed "
                     f"{fixed[best]:.0f} ({best} threads)")
    return out


def step_change(*, images: int = 3200, before: float = 0.010, after: float = 0.040, switch_s: float = 4.0,
                epochs: int = 6, data_dir: str | None = None) -> dict:
    """images/s per second of wall time, auto, with the open latency going from ``before`` to
    ``after`` ``switch_s`` seconds into the run."""
    from clairvoyant.nodeio.paths import cache_home
    root = make_dataset(data_dir or os.path.join(cache_home(), "demo", f"synthetic-imagenet-{images}"), images)
    switched: list[float] = []

    def start(store) -> None:
        def flip() -> None:
            store.open_latency = after
            switched.append(time.perf_counter())
        timer = threading.Timer(switch_s, flip)
        timer.daemon = True
        timer.start()

    _, trace, (threads, _) = _run(root, dict(open_latency=before, read_latency=0.002, bandwidth=400e6), 0.0,
                                  "auto", epochs, images_only_after=0, on_start=start)
    t0 = trace[0][0]
    seconds = int(trace[-1][0] - t0) + 1
    per_s = np.zeros(seconds)
    for t, n in trace:
        per_s[int(t - t0)] += n
    return {"switch_at_s": (switched[0] - t0) if switched else None, "images_per_s": per_s.tolist(),
            "final_threads": threads}


def readers_grid(*, images: int = 3200, readers=(1, 2, 3, 4), epochs: int = 3, data_dir: str | None = None) -> dict:
    """images/s with stage_threads="auto" and each number of reader processes, per profile."""
    from clairvoyant.load.loader import Loader
    from clairvoyant.nodeio.paths import cache_home
    root = make_dataset(data_dir or os.path.join(cache_home(), "demo", f"synthetic-imagenet-{images}"), images)
    out: dict = {}
    for name, p in PROFILES.items():
        for w in readers:
            work = tempfile.mkdtemp(prefix="clairvoyant-readers-")
            try:
                store = EmulatedStore(root, state_dir=os.path.join(work, "emu"), **p["store"])
                with Loader(store, batch_size=32, local_dir=os.path.join(work, "l"), num_workers=w, output="numpy",
                            local_capacity="10%", decode=HeavyDecode(p["heavy"]) if p["heavy"] else None) as ld:
                    n, t0 = 0, time.perf_counter()
                    for e in range(epochs):
                        ld.set_epoch(e)
                        if e == 1:
                            n, t0 = 0, time.perf_counter()
                        n += sum(len(y) for _, y in ld)
                    out.setdefault(name, {})[w] = n / (time.perf_counter() - t0)
            finally:
                shutil.rmtree(work, ignore_errors=True)
    return out
