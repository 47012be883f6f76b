"""Serizawa & Tatebe's measurement on the emulated store: time to draw N mini-batches, no compute.

Configurations, all on the same data and the same emulated store, in one process:
  (a) PyTorch's DataLoader reading the emulated store directly, for each worker count;
  (b) the same DataLoader on a complete local copy, the copy's time left out (the ideal);
  (c) copy everything (with as many threads as clairvoyant stages with), then the best (b);
  (d) clairvoyant with a cold local_dir; then a second epoch, warm.
(b) at its best worker count and (d) run ``repeats`` times, interleaved, and the
median run of each is reported: this machine is shared and noisy.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .. import manifest as manifest_mod
from ..load.decode import decode_image, decode_image_pillow
from ..load.loader import Loader
from ..nodeio.paths import cache_home
from ..testing.emulated import EmulatedStore
from ..testing.synthetic import make_dataset


@dataclass
class RunResult:
    name: str
    label: str
    images: int
    seconds: float
    first_batch: float
    batch_times: list[float] = field(default_factory=list)  # seconds to the k-th batch
    workers: int | None = None
    source_bytes: int | None = None

    @property
    def images_per_s(self) -> float:
        return self.images / self.seconds if self.seconds > 0 else float("inf")


DECODERS = {"auto": decode_image, "pillow": decode_image_pillow}


class _ReadDataset:
    """A map-style dataset as users write it: read the file, decode, return (image, label)."""

    def __init__(self, read, keys, labels, decode) -> None:
        self.read, self.keys, self.labels, self.decode = read, keys, labels, decode

    def __len__(self) -> int:
        return len(self.keys)

    def __getitem__(self, i: int):
        return self.decode(self.read(self.keys[i])), int(self.labels[i])


def file_reader(root: str):
    def read(key: str) -> bytes:
        with open(os.path.join(root, key), "rb") as f:
            return f.read()
    return read


def time_batches(it, n_batches: int, progress) -> tuple[float, float, list[float], int]:
    t0 = time.perf_counter()
    times, images = [], 0
    for batch in it:
        images += len(batch[1])
        times.append(time.perf_counter() - t0)
        if progress is not None:
            progress.update(1)
        if len(times) == n_batches:
            break
    return times[-1], times[0], times, images


def _bar(total: int, desc: str, enabled: bool):
    if not enabled:
        return None
    from tqdm import tqdm
    return tqdm(total=total, desc=desc, unit="batch", leave=False)


def run_dataloader(read, keys, labels, *, workers: int, batch_size: int, n_batches: int, seed: int,
                   progress: bool, decode=decode_image) -> tuple[float, float, list[float], int]:
    import torch
    from torch.utils.data import DataLoader

    ds = _ReadDataset(read, keys, labels, decode)
    g = torch.Generator()
    g.manual_seed(seed)
    bar = _bar(n_batches, f"DataLoader {workers}w", progress)
    with warnings.catch_warnings():
        # Pillow's arrays are read-only; default_collate copies them anyway, and says so once
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        # more workers than cores is the point of the (a) sweep
        warnings.filterwarnings("ignore", message="This DataLoader will create")
        dl = DataLoader(ds, batch_size=batch_size, shuffle=True, num_workers=workers, generator=g)
        it = iter(dl)
        try:
            return time_batches(it, n_batches, bar)
        finally:
            getattr(it, "_shutdown_workers", lambda: None)()  # reap workers now, not at GC
            del it
            if bar is not None:
                bar.close()


def dataloader_sweep(read, keys, labels, workers_grid, *, name: str, label: str, batch_size: int, n_batches: int,
                     seed: int, progress: bool, decode=decode_image, reset=None,
                     source_bytes=lambda: 0) -> list[RunResult]:
    """One :func:`run_dataloader` per worker count, named ``f"{name}{w}"`` and labelled
    ``label.format(w=w)``; ``reset()`` before each run, ``source_bytes()`` after it."""
    out = []
    for w in workers_grid:
        if reset is not None:
            reset()
        secs, first, times, n = run_dataloader(read, keys, labels, workers=w, batch_size=batch_size,
                                               n_batches=n_batches, seed=seed, progress=progress, decode=decode)
        out.append(RunResult(f"{name}{w}", label.format(w=w), n, secs, first, times, w, source_bytes()))
    return out


def copy_all(store: EmulatedStore, keys, dest: str, threads: int) -> float:
    """Copy the whole data set to ``dest`` with ``threads`` parallel readers; return seconds."""
    t0 = time.perf_counter()
    for d in {os.path.dirname(k) for k in keys}:
        os.makedirs(os.path.join(dest, d), exist_ok=True)

    def one(key: str) -> None:
        data = store.read(key)
        with open(os.path.join(dest, key), "wb") as f:
            f.write(data)

    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(one, keys))
    return time.perf_counter() - t0


def run(*, batches: int = 100, batch_size: int = 32, workers_grid: tuple[int, ...] = (2, 4, 8, 16),
        data_dir: str | None = None, work_dir: str | None = None, stage_threads: int | str = "auto",
        copy_threads: int = 32,
        open_latency: float = 0.010, read_latency: float = 0.002, bandwidth: float = 400e6,
        max_inflight: int = 64, seed: int = 0, repeats: int = 3, decoder: str = "auto",
        progress: bool = True) -> dict[str, Any]:
    decode = DECODERS[decoder]
    num_images = batches * batch_size
    data_dir = data_dir or os.path.join(cache_home(), "demo", f"synthetic-imagenet-{num_images}")
    bar = _bar(num_images, "generating synthetic ImageNet", progress) if not os.path.exists(
        os.path.join(data_dir, ".complete.json")) else None
    make_dataset(data_dir, num_images, progress=(bar.update if bar is not None else None))
    if bar is not None:
        bar.close()
    store = EmulatedStore(data_dir, open_latency=open_latency, read_latency=read_latency,
                          bandwidth=bandwidth, max_inflight=max_inflight)
    man = manifest_mod.build(store)  # listed once, untimed, for every configuration alike
    keys, labels = list(man.keys), man.labels
    work = tempfile.mkdtemp(prefix="clairvoyant-demo-", dir=work_dir)
    results: list[RunResult] = []
    try:
        sweep = dict(batch_size=batch_size, n_batches=batches, seed=seed, progress=progress, decode=decode)
        results += dataloader_sweep(store.read, keys, labels, workers_grid, name="a",
                                    label="(a) DataLoader on store, {w} workers", reset=store.reset,
                                    source_bytes=lambda: store.counters().bytes, **sweep)
        copy_dir = os.path.join(work, "copy")
        store.reset()
        copy_s = copy_all(store, keys, copy_dir, copy_threads)
        b_grid = dataloader_sweep(file_reader(copy_dir), keys, labels, workers_grid, name="b",
                                  label="(b) DataLoader on local copy, {w} workers", **sweep)
        best_w = max(b_grid, key=lambda r: r.images_per_s).workers
        # the copy stays until the end: deleting thousands of files just before (d) would make
        # the file system slower at creating (d)'s files (ext4 skips recently deleted inodes)
        mpath = os.path.join(work, "manifest.json")
        manifest_mod.save(man, mpath)  # handed to (d) like the DataLoader's file list
        b_runs, d_runs = [], []
        for rep in range(repeats):
            # (b) at its best worker count and (d) cold, interleaved, so that both see the same machine
            if rep > 0:
                secs, first, times, n = run_dataloader(file_reader(copy_dir), keys, labels, workers=best_w,
                                                       batch_size=batch_size, n_batches=batches, seed=seed,
                                                       progress=progress, decode=decode)
                b_runs.append(RunResult(f"b{best_w}", f"(b) DataLoader on local copy, {best_w} workers", n,
                                        secs, first, times, best_w, 0))
            else:
                b_runs.append(next(r for r in b_grid if r.workers == best_w))
            loader = Loader(store, batch_size=batch_size, local_dir=os.path.join(work, f"local{rep}"), seed=seed,
                            manifest=mpath, stage_threads=stage_threads, decode=decode)
            try:
                epochs = ((0, "d"), (1, "d2")) if rep == repeats - 1 else ((0, "d"),)
                for epoch, name in epochs:
                    loader.set_epoch(epoch)
                    store.reset()
                    bar = _bar(batches, f"clairvoyant epoch {epoch}", progress)
                    secs, first, times, n = time_batches(iter(loader), batches, bar)
                    if bar is not None:
                        bar.close()
                    label = ("(d) clairvoyant, cold local_dir" if epoch == 0
                             else "(d') clairvoyant, 2nd epoch (warm)")
                    r = RunResult(name, label, n, secs, first, times, loader.num_workers, store.counters().bytes)
                    if epoch == 0:
                        d_runs.append(r)
                    else:
                        warm = r
                stats = loader.stats()
            finally:
                loader.close()
        best_b, d = _median(b_runs), _median(d_runs)
        results.append(best_b)
        results.append(RunResult("c", f"(c) copy all ({copy_threads} threads), then (b) {best_w}w",
                                 best_b.images, copy_s + best_b.seconds, copy_s + best_b.first_batch,
                                 [copy_s + t for t in best_b.batch_times], best_w, man.total_bytes))
        results += [d, warm]
        spread = {"b_images_per_s": [r.images_per_s for r in b_runs],
                  "d_images_per_s": [r.images_per_s for r in d_runs]}
    finally:
        shutil.rmtree(work, ignore_errors=True)
    summary = summarize(results, stats=stats, params=dict(
        repeats=repeats, decoder=decoder, batches=batches, batch_size=batch_size, images=num_images,
        workers_grid=list(workers_grid),
        stage_threads=stage_threads, copy_threads=copy_threads, open_latency=open_latency, read_latency=read_latency, bandwidth=bandwidth,
        max_inflight=max_inflight, dataset_bytes=man.total_bytes, cpus=os.cpu_count()))
    summary["repeats"] = spread
    return summary


def _median(runs: list[RunResult]) -> RunResult:
    """The run of median throughput (the lower middle one for an even count)."""
    return sorted(runs, key=lambda r: r.images_per_s)[(len(runs) - 1) // 2]


def summarize(results: list[RunResult], *, stats: dict, params: dict) -> dict[str, Any]:
    by = {r.name: r for r in results}
    a_runs = [r for r in results if r.name.startswith("a")]
    best_a = max(a_runs, key=lambda r: r.images_per_s)
    best_a8 = max((r for r in a_runs if (r.workers or 0) <= 8), key=lambda r: r.images_per_s, default=best_a)
    a16 = by.get("a16")
    b = next(r for r in results if r.name.startswith("b"))
    d = by["d"]
    rows = []
    for r in results:
        rows.append(dict(name=r.name, label=r.label, images_per_s=r.images_per_s, seconds=r.seconds,
                         first_batch_s=r.first_batch, speedup_vs_best_a=r.images_per_s / best_a.images_per_s,
                         fraction_of_b=r.images_per_s / b.images_per_s, source_bytes=r.source_bytes))
    targets = {
        "d_over_best_a_upto_8_workers": d.images_per_s / best_a8.images_per_s,
        "d_over_a16": (d.images_per_s / a16.images_per_s) if a16 else None,
        "d_over_b": d.images_per_s / b.images_per_s,
        "d_total_over_c_total": d.seconds / by["c"].seconds,
        "d_first_batch_s": d.first_batch,
        "second_epoch_source_bytes": by["d2"].source_bytes,
    }
    return {"params": params, "rows": rows, "targets": targets, "loader_stats": stats,
            "curves": {r.name: r.batch_times for r in results}, "labels": {r.name: r.label for r in results}}


def format_table(summary: dict[str, Any]) -> str:
    lines = [f"{'configuration':48s} {'images/s':>9s} {'vs best (a)':>11s} {'of (b)':>7s} "
             f"{'1st batch':>9s} {'total s':>8s}"]
    for r in summary["rows"]:
        lines.append(f"{r['label']:48s} {r['images_per_s']:9.0f} {r['speedup_vs_best_a']:10.2f}x "
                     f"{r['fraction_of_b']:6.2f}x {r['first_batch_s']:8.3f}s {r['seconds']:8.2f}")
    t = summary["targets"]
    if "repeats" in summary:
        rep = summary["repeats"]
        lines.append(f"(b) and (d) are the median of {len(rep['d_images_per_s'])} interleaved runs: "
                     f"(b) {', '.join(f'{x:.0f}' for x in rep['b_images_per_s'])}; "
                     f"(d) {', '.join(f'{x:.0f}' for x in rep['d_images_per_s'])} images/s")
    lines.append("")
    lines.append(f"(d) / best (a) at <= 8 workers: {t['d_over_best_a_upto_8_workers']:.2f}x   (target >= 2.5)")
    if t["d_over_a16"] is not None:
        lines.append(f"(d) / (a) at 16 workers:        {t['d_over_a16']:.2f}x   (target >= 1.8)")
    lines.append(f"(d) / (b):                      {t['d_over_b']:.2f}x   (target >= 0.85)")
    lines.append(f"(d) total / (c) total:          {t['d_total_over_c_total']:.2f}x   (target <= 0.8)")
    lines.append(f"(d) time to first batch:        {t['d_first_batch_s']:.3f} s (target < 1 s)")
    lines.append(f"2nd epoch bytes from the store: {t['second_epoch_source_bytes']}   (target 0)")
    return "\n".join(lines)


def plot(summary: dict[str, Any], path: str) -> None:
    """Seconds to the k-th batch for every configuration; the right panel zooms on the fast ones."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 5))
    curves = summary["curves"]
    fast = {n: t for n, t in curves.items() if not n.startswith("a")}
    colors = {name: f"C{i}" for i, name in enumerate(curves)}  # one colour per configuration, both panels
    for ax, shown, title in ((axes[0], curves, "all configurations"),
                             (axes[1], fast, "local copy, copy-then-train and clairvoyant")):
        for name, times in shown.items():
            ax.plot(np.arange(1, len(times) + 1), times, label=summary["labels"][name], color=colors[name],
                    linewidth=2.5 if name.startswith("d") else 1.2)
        ax.set_xlabel("mini-batch k")
        ax.set_ylabel("seconds to the k-th mini-batch")
        ax.set_title(title, fontsize=9)
        ax.legend(fontsize=7)
        ax.grid(alpha=0.3)
    p = summary["params"]
    fig.suptitle(f"{p['images']} images, batch {p['batch_size']}, emulated store "
                 f"({p['open_latency'] * 1e3:.0f} ms open, {p['read_latency'] * 1e3:.0f} ms read, "
                 f"{p['bandwidth'] / 1e6:.0f} MB/s), {p['cpus']} CPUs", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write(summary: dict[str, Any], out_dir: str) -> tuple[str, str]:
    os.makedirs(out_dir, exist_ok=True)
    jpath, ppath = os.path.join(out_dir, "staging.json"), os.path.join(out_dir, "staging.png")
    with open(jpath, "w") as f:
        json.dump(summary, f, indent=1)
    plot(summary, ppath)
    return jpath, ppath


__all__ = ["run", "summarize", "format_table", "plot", "write", "RunResult", "run_dataloader", "dataloader_sweep",
           "file_reader", "time_batches"]
