"""Benchmark: issue 11's measurement through the kernel, on a FUSE mount of the emulated store.

The data set is served by FuseStore (12 ms per open, 2 ms per read, 400 MB/s shared, 64 requests
in flight by default): every reader pays the system calls, the FUSE round trip and a cold page
cache per open, as on a real shared file system client. Images/s, whole epochs, batch 32:
  (a) clairvoyant's Loader given the mount's path, a fresh local_dir: first (cold) and second
      (warm) epoch;
  (b) PyTorch's DataLoader over a map-style dataset that opens each file by path and decodes it
      with clairvoyant's decoder, on the mount, for each worker count (first epoch; best shown);
  (c) the same DataLoader on a local copy of the data set (best worker count);
  (d) the decode limit: decode_image on every image held in memory, in os.cpu_count() processes.
Writes benchmarks/results/kernel_path.json.

    python benchmarks/kernel_path.py           # 3,200 JPEGs of 256x256
    python benchmarks/kernel_path.py --tiny    # a smoke size for CI
"""

from __future__ import annotations

import torch  # imported before any clock: its import is not timed

import argparse

import multiprocessing as mp
import os
import shutil
import sys
import tempfile
import time

from fusebench import run_and_report

from clairvoyant import Loader
from clairvoyant import manifest as manifest_mod
from clairvoyant.experiments import staging
from clairvoyant.load.decode import decode_image
from clairvoyant.nodeio.paths import cache_home
from clairvoyant.source import PosixSource
from clairvoyant.testing import FuseStore, make_dataset

_IMAGES: list[bytes] = []  # the decode limit's input, inherited by forked processes


def _decode_range(bounds: tuple[int, int]) -> int:
    for data in _IMAGES[bounds[0]:bounds[1]]:
        decode_image(data)
    return bounds[1] - bounds[0]


def decode_limit(root: str, keys: list[str], procs: int) -> float:
    """Images/s of decode_image alone, every image's bytes in memory, ``procs`` processes."""
    _IMAGES[:] = [staging.file_reader(root)(k) for k in keys]
    step = max(1, len(keys) // (procs * 8))
    chunks = [(i, min(i + step, len(keys))) for i in range(0, len(keys), step)]
    with mp.get_context("fork").Pool(procs) as pool:
        pool.map(_decode_range, chunks[:procs])  # the processes are up and warm before the clock
        t0 = time.perf_counter()
        n = sum(pool.map(_decode_range, chunks, chunksize=1))
        secs = time.perf_counter() - t0
    _IMAGES.clear()
    return n / secs


def clairvoyant_epochs(store: FuseStore, batch_size: int, seed: int, work: str) -> list[dict]:
    """The Loader on the mount's path, a fresh local_dir: epoch 0 (cold), then epoch 1 (warm)."""
    runs = []
    with Loader(store.path, batch_size=batch_size, local_dir=os.path.join(work, "local"), seed=seed,
                decode="numpy") as loader:  # lists the mount here, before the clock, as (b) is given its keys
        for epoch in (0, 1):
            loader.set_epoch(epoch)
            store.reset()
            secs, first, _, n = staging.time_batches(iter(loader), len(loader), None)
            runs.append(dict(name=f"clairvoyant epoch {epoch}", images=n, seconds=secs, first_batch_s=first,
                             images_per_s=n / secs, workers=loader.num_workers, **counted(store)))
    return runs


def counted(store: FuseStore) -> dict:
    c = store.counters()
    return dict(opens=c.opens, bytes=c.bytes, reads=c.reads, peak_inflight=c.peak_inflight)


def row(r: staging.RunResult, counters: dict | None = None) -> dict:
    return dict(name=r.label, images=r.images, seconds=r.seconds, first_batch_s=r.first_batch,
                images_per_s=r.images_per_s, workers=r.workers, **(counters or {}))


def run(args) -> dict:
    name = f"synthetic-imagenet-{args.images}" + ("" if args.size == 256 else f"-{args.size}px")  # the demo's
    data = make_dataset(os.path.join(cache_home(), "demo", name), args.images, size=args.size)
    man = manifest_mod.build(PosixSource(data))  # listed once, untimed, for every DataLoader alike
    keys, labels = list(man.keys), man.labels
    n_batches = -(-len(keys) // args.batch)
    work = tempfile.mkdtemp(prefix="clairvoyant-kernel-path-")
    sweep = dict(batch_size=args.batch, n_batches=n_batches, seed=args.seed, progress=sys.stderr.isatty(),
                 decode=decode_image)
    try:
        copy = os.path.join(work, "copy")
        shutil.copytree(data, copy)  # also brings the source into the host's page cache for every run alike
        with FuseStore(data, open_latency=args.open_latency, read_latency=args.read_latency,
                       bandwidth=args.bandwidth, max_inflight=args.max_inflight) as store:
            cv = clairvoyant_epochs(store, args.batch, args.seed, work)
            seen: list[dict] = []

            def source_bytes() -> int:
                seen.append(counted(store))
                return seen[-1]["bytes"]

            on_mount = staging.dataloader_sweep(
                staging.file_reader(store.path), keys, labels, args.workers, name="mount",
                label="DataLoader on the mount, {w} workers", reset=store.reset, source_bytes=source_bytes,
                **sweep)
        local = staging.dataloader_sweep(staging.file_reader(copy), keys, labels, args.local_workers,
                                         name="local", label="DataLoader on a local copy, {w} workers", **sweep)
        limit = decode_limit(copy, keys, os.cpu_count() or 1)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    best_mount = max(on_mount, key=lambda r: r.images_per_s)
    best_local = max(local, key=lambda r: r.images_per_s)
    rows = cv + [row(r, c) for r, c in zip(on_mount, seen)] + [row(r) for r in local]
    rows.append(dict(name=f"decode limit, {os.cpu_count()} processes, bytes in memory", images=len(keys),
                     images_per_s=limit))
    ratios = {"clairvoyant_first_over_best_dataloader_on_mount": cv[0]["images_per_s"] / best_mount.images_per_s,
              "clairvoyant_first_over_best_dataloader_local": cv[0]["images_per_s"] / best_local.images_per_s,
              "clairvoyant_warm_over_decode_limit": cv[1]["images_per_s"] / limit}
    params = dict(images=len(keys), size=args.size, batch_size=args.batch, open_latency=args.open_latency,
                  read_latency=args.read_latency, bandwidth=args.bandwidth, max_inflight=args.max_inflight,
                  workers=list(args.workers), local_workers=list(args.local_workers), seed=args.seed,
                  dataset_bytes=man.total_bytes, cpus=os.cpu_count(), torch=torch.__version__,
                  best_workers={"mount": best_mount.workers, "local": best_local.workers})
    return {"params": params, "rows": rows, "ratios": ratios}


def format_table(summary: dict) -> str:
    lines = [f"{'configuration':52s} {'images/s':>9s} {'seconds':>8s} {'1st batch':>9s} {'opens':>6s} "
             f"{'MB read':>8s}"]
    for r in summary["rows"]:
        secs = f"{r['seconds']:8.2f}" if "seconds" in r else f"{'':8s}"
        first = f"{r['first_batch_s']:8.3f}s" if "first_batch_s" in r else f"{'':9s}"
        opens = f"{r['opens']:6d}" if "opens" in r else f"{'':6s}"
        mb = f"{r['bytes'] / 1e6:8.1f}" if "bytes" in r else f"{'':8s}"
        lines.append(f"{r['name']:52s} {r['images_per_s']:9.0f} {secs} {first} {opens} {mb}")
    t, p = summary["ratios"], summary["params"]
    lines += ["",
              f"clairvoyant 1st epoch / best DataLoader on the mount ({p['best_workers']['mount']} workers): "
              f"{t['clairvoyant_first_over_best_dataloader_on_mount']:.2f}x",
              f"clairvoyant 1st epoch / best DataLoader on a local copy ({p['best_workers']['local']} workers): "
              f"{t['clairvoyant_first_over_best_dataloader_local']:.2f}x",
              f"clairvoyant 2nd epoch / decode limit: {t['clairvoyant_warm_over_decode_limit']:.2f}x",
              f"({p['images']} images of {p['size']}x{p['size']}, {p['dataset_bytes'] / 1e6:.1f} MB; FUSE store "
              f"{p['open_latency'] * 1e3:g} ms per open, {p['read_latency'] * 1e3:g} ms per read, "
              f"{p['bandwidth'] / 1e6:g} MB/s, {p['max_inflight']} in flight; {p['cpus']} CPUs)"]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--images", type=int, default=3200)
    p.add_argument("--size", type=int, default=256, help="image side in pixels")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--open-latency", type=float, default=0.012, help="seconds per open")
    p.add_argument("--read-latency", type=float, default=0.002, help="seconds per read request")
    p.add_argument("--bandwidth", type=float, default=400e6, help="bytes/s, shared")
    p.add_argument("--max-inflight", type=int, default=64)
    p.add_argument("--workers", default="4,8,16", help="DataLoader workers on the mount")
    p.add_argument("--local-workers", default="1,2,4", help="DataLoader workers on the local copy")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--tiny", action="store_true", help="a few dozen small images, 1-2 workers, for CI")
    p.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results"))
    args = p.parse_args(argv)
    if args.tiny:
        args.images, args.size, args.batch = 48, 32, 8
        args.open_latency, args.read_latency, args.workers, args.local_workers = 0.001, 0.0, "1,2", "1"
    args.workers = tuple(int(w) for w in args.workers.split(","))
    args.local_workers = tuple(int(w) for w in args.local_workers.split(","))
    return run_and_report("kernel_path", args, run, format_table)

if __name__ == "__main__":
    sys.exit(main())
