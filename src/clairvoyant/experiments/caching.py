"""The bounded-cache experiment: hit rate per epoch of the real loader against the optimum and LRU.

For each local capacity (a fraction f of the data set's bytes) and each number
of ranks on the node, fresh tiers are filled by running the loader for a few
epochs in R processes on an emulated store; hits are counted from what the
loader read from the source (a hit is an access that read nothing). The same
node access sequence is then run through the separate reference simulators
(testing/reference.py): Belady's MIN (the offline optimum) and LRU. Optionally
it also times images/s at one capacity against the same run with unbounded
capacity, on a store fast enough for the miss stream.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from typing import Any

import numpy as np

from ..cache.entry import entry_size
from ..plan.sequence import node_sequence
from ..testing import EmulatedStore, make_dataset
from ..testing.reference import belady_hits, lru_hits
from .processes import run_forked


def _rank(rank: int, world: int, root: str, state_dir: str, local: str, ram: str, capacity: str | None,
          epochs: int, batch_size: int, seed: int, workers: int, fast: dict, out: str) -> None:
    os.environ["CLAIRVOYANT_RAM_DIR"] = ram
    from ..load.loader import Loader
    store = EmulatedStore(root, state_dir=state_dir, **fast)
    with Loader(store, batch_size=batch_size, local_dir=local, rank=rank, world_size=world, local_world_size=world,
                num_workers=workers, local_capacity=capacity, seed=seed, output="numpy") as ld:
        times = []
        for e in range(epochs):
            ld.set_epoch(e)
            t0 = time.perf_counter()
            n = sum(len(y) for _, y in ld)
            times.append((n, time.perf_counter() - t0))
        s = ld.stats()
    with open(out, "w") as f:
        json.dump({"epochs": s["epochs"], "usage": s["usage"], "tiers": s["tiers"], "times": times}, f)


def run_loaders(root: str, ranks: int, capacity: str | None, *, epochs: int, batch_size: int, seed: int,
                workers: int = 1, store_kw: dict | None = None) -> list[dict]:
    """Run ``ranks`` loader processes sharing fresh tiers; return each one's stats."""
    work = tempfile.mkdtemp(prefix="clairvoyant-caching-")
    try:
        kw = dict(store_kw or dict(open_latency=0.0, read_latency=0.0, bandwidth=1e12))
        args = [(r, ranks, root, os.path.join(work, "emu"), os.path.join(work, "local"), os.path.join(work, "ram"),
                 capacity, epochs, batch_size, seed, workers, kw) for r in range(ranks)]
        return run_forked(_rank, args, [os.path.join(work, f"r{r}.json") for r in range(ranks)], "loader process")
    finally:
        shutil.rmtree(work, ignore_errors=True)


def hit_rates(*, images: int = 2000, fractions=(0.10, 0.25, 0.50, 0.75), ranks_grid=(1, 4), epochs: int = 4,
              batch_size: int = 16, seed: int = 0, data_dir: str | None = None, progress: bool = False) -> dict:
    from ..manifest import obtain
    from ..nodeio.paths import cache_home
    from ..source import as_source

    root = make_dataset(data_dir or os.path.join(cache_home(), "bench", f"caching-{images}"), images,
                        num_classes=10, size=32)
    man, _ = obtain(as_source(root))
    sizes = np.asarray(man.sizes, dtype=np.int64) + entry_size(0)
    total = int(sizes.sum())
    rows = []
    for R in ranks_grid:
        seqs = [node_sequence(len(man), seed=seed, epoch=e, world_size=R, ranks=range(R),
                              batch_size=batch_size) for e in range(epochs)]
        full = np.concatenate(seqs)
        bounds = np.cumsum([0] + [len(s) for s in seqs])
        for f in fractions:
            cap = int(total * f)
            t0 = time.perf_counter()
            res = run_loaders(root, R, f"{f * 100:g}%", epochs=epochs, batch_size=batch_size, seed=seed)
            opt, lru = belady_hits(full, sizes, cap), lru_hits(full, sizes, cap)
            for e in range(epochs):
                n = int(bounds[e + 1] - bounds[e])
                fetched = sum(r["epochs"].get(str(e), {}).get("source_files", 0) for r in res)
                src_bytes = sum(r["epochs"].get(str(e), {}).get("source_bytes", 0) for r in res)
                rows.append({"ranks": R, "fraction": f, "epoch": e, "accesses": n,
                             "hit_rate": 1 - fetched / n,
                             "optimum": sum(opt[bounds[e]:bounds[e + 1]]) / n,
                             "lru": sum(lru[bounds[e]:bounds[e + 1]]) / n,
                             "source_fraction": src_bytes / man.total_bytes,
                             "peak": max(r["usage"]["local"]["peak"] for r in res), "capacity": cap})
            if progress:
                print(f"ranks {R}, capacity {f:.0%}: done in {time.perf_counter() - t0:.1f} s", flush=True)
    return {"images": images, "batch_size": batch_size, "epochs": epochs, "dataset_bytes": total, "rows": rows}


def throughput(*, images: int = 3200, fraction: float = 0.5, epochs: int = 3, batch_size: int = 32,
               repeats: int = 3, data_dir: str | None = None) -> dict:
    """images/s after the first epoch at capacity ``fraction`` against unbounded capacity, same store."""
    from ..nodeio.paths import cache_home
    root = make_dataset(data_dir or os.path.join(cache_home(), "demo", f"synthetic-imagenet-{images}"), images)
    store_kw = dict(open_latency=0.010, read_latency=0.002, bandwidth=400e6)
    rates: dict[str, list[float]] = {"bounded": [], "unbounded": []}
    for _ in range(repeats):   # interleaved, so both see the same machine
        for name, cap in (("bounded", f"{fraction * 100:g}%"), ("unbounded", None)):
            [r] = run_loaders(root, 1, cap, epochs=epochs, batch_size=batch_size, seed=0, workers=2,
                              store_kw=store_kw)
            n = sum(t[0] for t in r["times"][1:])
            dt = sum(t[1] for t in r["times"][1:])
            rates[name].append(n / dt)
    med = {k: float(np.median(v)) for k, v in rates.items()}
    return {"fraction": fraction, "images": images, "rates": rates, "median": med,
            "ratio": med["bounded"] / med["unbounded"]}


def source_limited(*, images: int = 3200, fraction: float = 0.5, epochs: int = 3, batch_size: int = 32,
                   bandwidth: float = 20e6, repeats: int = 2, data_dir: str | None = None) -> dict:
    """images/s at capacity ``fraction`` on a store too slow for the miss stream, against the limit
    the data allows: min(decode rate, source rate / (1 - f)). The decode rate is the unbounded run's
    images/s once everything is cached; the source rate is that run's cold first epoch, where every
    sample is read from the source once and the source is the bottleneck."""
    from ..nodeio.paths import cache_home
    root = make_dataset(data_dir or os.path.join(cache_home(), "demo", f"synthetic-imagenet-{images}"), images)
    store_kw = dict(open_latency=0.010, read_latency=0.002, bandwidth=bandwidth)
    got, decode, source = [], [], []
    for _ in range(repeats):
        [b] = run_loaders(root, 1, f"{fraction * 100:g}%", epochs=epochs, batch_size=batch_size, seed=0,
                          workers=2, store_kw=store_kw)
        [u] = run_loaders(root, 1, None, epochs=epochs, batch_size=batch_size, seed=0, workers=2,
                          store_kw=store_kw)
        got.append(sum(t[0] for t in b["times"][1:]) / sum(t[1] for t in b["times"][1:]))
        decode.append(sum(t[0] for t in u["times"][1:]) / sum(t[1] for t in u["times"][1:]))
        source.append(u["times"][0][0] / u["times"][0][1])
    med = {k: float(np.median(v)) for k, v in (("bounded", got), ("decode", decode), ("source", source))}
    limit = min(med["decode"], med["source"] / (1 - fraction))
    return {"fraction": fraction, "bandwidth": bandwidth, "runs": {"bounded": got, "decode": decode, "source": source},
            "median": med, "limit": limit, "ratio": med["bounded"] / limit}


def format_table(summary: dict) -> str:
    lines = [f"{summary['images']} images, batch {summary['batch_size']}, {summary['epochs']} epochs; hit rate per "
             "epoch after the first (clairvoyant / offline optimum / LRU) and bytes read from the source",
             "| ranks | capacity | epoch | clairvoyant | optimum | LRU | source bytes | target <= | peak <= cap |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in summary["rows"]:
        if r["epoch"] == 0:
            continue
        lines.append(f"| {r['ranks']} | {r['fraction']:.0%} | {r['epoch']} | {r['hit_rate']:.1%} | {r['optimum']:.1%} | "
                     f"{r['lru']:.1%} | {r['source_fraction']:.1%} | {1 - r['fraction'] + 0.02:.0%} | "
                     f"{'yes' if r['peak'] <= r['capacity'] else 'NO'} |")
    return "\n".join(lines)


def plot(summary: dict, path: str) -> str | None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    rows = [r for r in summary["rows"] if r["epoch"] > 0]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for R in sorted({r["ranks"] for r in rows}):
        fr = sorted({r["fraction"] for r in rows if r["ranks"] == R})

        def mean(key: str, f: float) -> float:
            vals = [r[key] for r in rows if r["ranks"] == R and r["fraction"] == f]
            return sum(vals) / len(vals)
        x = [f * 100 for f in fr]
        axes[0].plot(x, [mean("hit_rate", f) * 100 for f in fr], "o-", label=f"clairvoyant, {R} rank(s)")
        axes[0].plot(x, [mean("optimum", f) * 100 for f in fr], "k:", label=f"offline optimum, {R} rank(s)")
        axes[0].plot(x, [mean("lru", f) * 100 for f in fr], "s--", label=f"LRU, {R} rank(s)")
        axes[1].plot(x, [mean("source_fraction", f) * 100 for f in fr], "o-", label=f"clairvoyant, {R} rank(s)")
    axes[1].plot([10, 75], [90 + 2, 25 + 2], "k:", label="target (1 - f + 2%)")
    axes[0].set(xlabel="local capacity (% of the data set)", ylabel="hit rate per epoch after the first (%)",
                title="hit rate: farthest next use vs LRU")
    axes[1].set(xlabel="local capacity (% of the data set)", ylabel="bytes read from the source per epoch (%)",
                title="load left on the shared storage")
    for a in axes:
        a.grid(alpha=0.3)
        a.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write(summary: dict[str, Any], out_dir: str) -> tuple[str, str | None]:
    os.makedirs(out_dir, exist_ok=True)
    jpath = os.path.join(out_dir, "caching.json")
    with open(jpath, "w") as f:
        json.dump(summary, f, indent=1)
    return jpath, plot(summary, os.path.join(out_dir, "caching.png"))
