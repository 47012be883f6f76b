"""Two ranks of one node, one drawing samples twice as large: how evenly do they wait?

A flat data set whose odd-numbered files are twice the size of the even ones,
read without shuffling by two ranks (DistributedSampler split: rank 1 gets the
large ones). The ranks train in lockstep, as data-parallel ranks do (a barrier
after each batch stands for the gradient all-reduce, then a fixed step time),
on one emulated store whose bandwidth both share. Decoding is trivial, so the
only difference between the ranks is the bytes they load. Reported: each rank's
p99 wait in ``next()``, with deadline scheduling across the ranks on and off.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import shutil
import tempfile
import time

import numpy as np

from clairvoyant.experiments.processes import run_forked


def make_sized_dataset(root: str, n: int, small: int, seed: int = 0) -> str:
    """``n`` files of random bytes; odd-numbered ones twice as large. Made once."""
    marker = os.path.join(root, ".complete")
    if os.path.exists(marker):
        return root
    os.makedirs(root, exist_ok=True)
    rng = np.random.default_rng(seed)
    for i in range(n):
        with open(os.path.join(root, f"s{i:06d}.bin"), "wb") as f:
            f.write(rng.integers(0, 256, small * (2 if i % 2 else 1), dtype=np.uint8).tobytes())
    open(marker, "w").close()
    return root


def _tiny(b: bytes) -> np.ndarray:
    return np.frombuffer(b[:8], np.uint8).copy()


def _rank(rank: int, root: str, work: str, barrier, balance: bool, batch: int, step: float, store_kw: dict,
          out: str) -> None:
    os.environ["CLAIRVOYANT_RAM_DIR"] = os.path.join(work, "ram")
    from clairvoyant.load.loader import Loader
    from clairvoyant.testing import EmulatedStore
    store = EmulatedStore(root, state_dir=os.path.join(work, "emu"), **store_kw)
    waits = []
    with Loader(store, batch_size=batch, local_dir=os.path.join(work, "local"), rank=rank, world_size=2,
                local_world_size=2, shuffle=False, decode=_tiny, num_workers=1, output="numpy",
                balance=balance) as ld:
        barrier.wait()
        it = iter(ld)
        while True:
            t0 = time.perf_counter()
            try:
                next(it)
            except StopIteration:
                break
            waits.append(time.perf_counter() - t0)
            barrier.wait()       # the all-reduce: nobody runs ahead of the slowest rank
            time.sleep(step)     # the GPU's step
    with open(out, "w") as f:
        json.dump(waits, f)


def run(*, n: int = 2000, small: int = 64 << 10, batch: int = 16, step: float = 0.020, bandwidth: float = 200e6,
        repeats: int = 2, data_dir: str | None = None) -> dict:
    root = make_sized_dataset(data_dir or os.path.join(tempfile.gettempdir(), f"clairvoyant-sized-{n}-{small}"),
                              n, small)
    store_kw = dict(open_latency=0.010, read_latency=0.002, bandwidth=bandwidth)
    result: dict = {"n": n, "small": small, "batch": batch, "step": step, "bandwidth": bandwidth, "runs": {}}
    ctx = mp.get_context("fork")
    for rep in range(repeats):
        for balance in (True, False):
            work = tempfile.mkdtemp(prefix="clairvoyant-balance-")
            try:
                barrier = ctx.Barrier(2)
                args = [(r, root, work, barrier, balance, batch, step, store_kw) for r in (0, 1)]
                outs = run_forked(_rank, args, [os.path.join(work, f"w{r}.json") for r in (0, 1)], "rank")
                waits = [o[1:] for o in outs]   # the first batch of each waits for the start
            finally:
                shutil.rmtree(work, ignore_errors=True)
            p99 = [float(np.percentile(w, 99)) for w in waits]
            result["runs"].setdefault("on" if balance else "off", []).append(
                {"p99_small": p99[0], "p99_large": p99[1], "ratio": p99[1] / max(p99[0], 1e-6),
                 "mean_small": float(np.mean(waits[0])), "mean_large": float(np.mean(waits[1]))})
    return result


def format_table(res: dict) -> str:
    lines = [f"two ranks in lockstep, {res['n']} samples of {res['small'] >> 10} and {2 * res['small'] >> 10} KiB, "
             f"batch {res['batch']}, step {res['step'] * 1e3:.0f} ms, store {res['bandwidth'] / 1e6:.0f} MB/s",
             "| deadline scheduling | p99 wait, rank with small samples | p99 wait, rank with large samples | ratio |",
             "| --- | --- | --- | --- |"]
    for mode in ("on", "off"):
        for r in res["runs"].get(mode, []):
            lines.append(f"| {mode} | {r['p99_small'] * 1e3:.1f} ms | {r['p99_large'] * 1e3:.1f} ms | {r['ratio']:.2f} |")
    return "\n".join(lines)
