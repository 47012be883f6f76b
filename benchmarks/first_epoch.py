"""Benchmark: the first (cold) epoch against the store's limit, on every door (issue 39).

A store where the CPU does not bind: a FuseStore mount (reads through the kernel) charging
``--open-latency`` per open (40 ms), ``--read-latency`` per read (2 ms), a shared ``--bandwidth``
and at most ``--max-inflight`` requests in service at once (64); nothing decoded (the Loader's
``decode=len``; the mount's Dataset only reads each file's bytes). Each door runs with its
defaults, a fresh local tier, one epoch:

  (a) tree:   ``Loader(<store>)`` on a tree of JPEGs; limit min(in flight / (open + read latency),
              bandwidth / mean file size) files/s;
  (b) shards: the same JPEGs packed into tar shards of ``--shard-mib`` MiB on a store of
              ``--shard-bandwidth`` (100 MB/s); limit: bandwidth / mean bytes per sample in the
              shards; also the bytes read from the store over the shards' size (<= 1.02 wanted);
  (c) mount:  ``clairvoyant mount`` of the tree's store, PyTorch's DataLoader (``--workers``) with
              ``clairvoyant.torch.RandomSampler(mount=)``, its Dataset reading each file by path;
              the same limit as (a).

Prints samples/s, the limit and their ratio per door (the median of ``--repeat`` runs, each on a
fresh store and tier), and what each door's staging chose (its requests in flight and why);
writes benchmarks/results/first_epoch.json.

    python benchmarks/first_epoch.py            # 3,200 JPEGs of 256x256
    python benchmarks/first_epoch.py --tiny     # a smoke size for CI
"""

from __future__ import annotations

import torch  # imported before any clock

import argparse
import os
import shutil
import tempfile
import time

import numpy as np
from fusebench import add_store_args, run_and_report, store_of

from clairvoyant import Loader
from clairvoyant.mount import Mount
from clairvoyant.nodeio.paths import cache_home
from clairvoyant.pack.tar import pack
from clairvoyant.testing import FuseStore, make_dataset
from clairvoyant.torch import RandomSampler

READ_CHUNK = 128 << 10   # the kernel's FUSE read size: a file of n bytes costs ceil(n / 128 KiB) reads


class BytesDataset(torch.utils.data.Dataset):
    """A folder dataset whose items are the files' bytes (their length as the sample): reads, no decode."""

    def __init__(self, root: str) -> None:
        classes = sorted(d for d in os.listdir(root) if not d.startswith("."))
        self.samples = [(os.path.join(root, c, f), k) for k, c in enumerate(classes)
                        for f in sorted(os.listdir(os.path.join(root, c))) if not f.startswith(".")]

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, i: int):
        path, label = self.samples[i]
        with open(path, "rb", buffering=0) as f:
            return len(f.read()), label


def file_limit(sizes: np.ndarray, store: dict) -> float:
    """Files/s the store allows: each file holds a slot for an open and its reads; the pipe is shared."""
    reads = np.ceil(np.maximum(sizes, 1) / READ_CHUNK)
    per_file = store["open_latency"] + store["read_latency"] * float(reads.mean())
    return min(store["max_inflight"] / per_file, store["bandwidth"] / float(sizes.mean()))


def timed_epoch(it) -> tuple[float, int]:
    t0, n = time.perf_counter(), 0
    for batch in it:
        n += len(batch[1])
    return time.perf_counter() - t0, n


def staging_choice(loader: Loader) -> dict:
    s = loader.stats()
    return {"staging": s.get("staging"), "stage_threads": s["stage_threads"], "wait_by_cause": s.get("wait_by_cause"),
            "verdict": s.get("verdict")}


def run_loader(data: str, store: dict, work: str, batch: int, name: str) -> dict:
    with FuseStore(data, **store) as fs:
        with Loader(fs.path, batch_size=batch, local_dir=os.path.join(work, f"local-{name}"), seed=0,
                    decode=len, output="numpy") as loader:   # lists or indexes the store here, before the clock
            loader.set_epoch(0)
            fs.reset()
            secs, n = timed_epoch(loader)
            c = fs.counters()
            return {"samples": n, "seconds": secs, "samples_per_s": n / secs, "store_opens": c.opens,
                    "store_bytes": c.bytes, "peak_inflight": c.peak_inflight, **staging_choice(loader)}


def run_mount(data: str, store: dict, work: str, batch: int, workers: int) -> dict:
    mnt = os.path.join(work, "mnt")
    os.makedirs(mnt)
    with FuseStore(data, **store) as fs:
        with Mount(fs.path, mnt, local_dir=os.path.join(work, "local-mount")) as m:   # lists the store first
            ds = BytesDataset(mnt)
            sampler = RandomSampler(ds, seed=0, mount=mnt)
            dl = torch.utils.data.DataLoader(ds, batch_size=batch, sampler=sampler, num_workers=workers)
            fs.reset()
            secs, n = timed_epoch(dl)
            c = fs.counters()
            staged = m.staging()
            return {"samples": n, "seconds": secs, "samples_per_s": n / secs, "store_opens": c.opens,
                    "store_bytes": c.bytes, "peak_inflight": c.peak_inflight, "workers": workers,
                    "mount": m.stats()._asdict(), "mount_staging": staged,
                    "staging": staged.get("requests")}


def shards_of(data: str, shard_mib: int) -> tuple[str, int, int]:
    """The tree packed into tar shards (once, under the cache home): the folder, its bytes, its shards."""
    out = os.path.join(cache_home(), "bench", f"first-epoch-{os.path.basename(data)}-{shard_mib}MiB")
    done = os.path.join(out, ".complete")
    if not os.path.exists(done):
        shutil.rmtree(out, ignore_errors=True)
        pack(data, out, shard_size=shard_mib << 20)
        open(done, "w").close()
    tars = [os.path.join(out, f) for f in os.listdir(out) if f.endswith(".tar")]
    return out, sum(os.path.getsize(p) for p in tars), len(tars)


def run(args) -> dict:
    name = f"synthetic-imagenet-{args.images}"   # the demo's data set
    data = make_dataset(os.path.join(cache_home(), "demo", name), args.images, size=args.size)
    sizes = np.array([os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(data) for f in fs
                      if not f.startswith(".")], dtype=np.int64)
    store = store_of(args)
    shard_store = dict(store, bandwidth=args.shard_bandwidth)
    shard_dir, shard_bytes, nshards = shards_of(data, args.shard_mib)
    rows = {}
    with tempfile.TemporaryDirectory(prefix="clairvoyant-first-epoch-") as work:
        doors = [d for d in ("tree", "shards", "mount") if d in args.doors]
        for door in doors:
            runs = []
            for k in range(args.repeat):   # a fresh store, tier and process state each time
                print(f"first_epoch: {door}, run {k + 1} of {args.repeat}", flush=True)
                run_dir = os.path.join(work, f"{door}-{k}")
                os.makedirs(run_dir)
                if door == "tree":
                    r = run_loader(data, store, run_dir, args.batch, "tree")
                    r["limit_per_s"] = file_limit(sizes, store)
                elif door == "shards":
                    r = run_loader(shard_dir, shard_store, run_dir, args.batch, "shards")
                    r["limit_per_s"] = args.shard_bandwidth / (shard_bytes / len(sizes))
                    r["shard_bytes"], r["shards"] = shard_bytes, nshards
                    r["bytes_over_shards"] = r["store_bytes"] / shard_bytes
                else:
                    r = run_mount(data, store, run_dir, args.batch, args.workers)
                    r["limit_per_s"] = file_limit(sizes, store)
                r["ratio"] = r["samples_per_s"] / r["limit_per_s"]
                runs.append(r)
            runs.sort(key=lambda r: r["ratio"])
            rows[door] = dict(runs[len(runs) // 2], ratios=[r["ratio"] for r in runs])   # the median run
    params = dict(images=args.images, size=args.size, batch=args.batch, store=store, shard_store=shard_store,
                  shard_mib=args.shard_mib, mean_size=float(sizes.mean()), workers=args.workers,
                  cpus=os.cpu_count(), torch=torch.__version__)
    return {"params": params, "rows": rows, "ratios": {d: r["ratio"] for d, r in rows.items()}}


def _chose(r: dict) -> str:
    s = r.get("staging") or {}
    if "inflight" in s:
        return f"{s['inflight']} in flight ({s.get('why', '')})"
    return ""


def format_table(s: dict) -> str:
    p = s["params"]
    st = p["store"]
    lines = [f"first epoch against the store's limit: {p['images']} JPEGs (mean {p['mean_size'] / 1e3:.1f} kB); store "
             f"{st['open_latency'] * 1e3:g} ms per open, {st['read_latency'] * 1e3:g} ms per read, "
             f"{st['bandwidth'] / 1e6:g} MB/s ({p['shard_store']['bandwidth'] / 1e6:g} MB/s for shards), "
             f"{st['max_inflight']} in flight; {p['cpus']} CPUs",
             f"median of {len(next(iter(s['rows'].values()), {}).get('ratios', [0]))} runs per door",
             f"{'door':8} {'samples/s':>10} {'limit':>8} {'ratio':>6} {'(runs)':>16} {'store MB':>9} {'peak':>5}  "
             "staging chose"]
    for door, r in s["rows"].items():
        extra = f" ({r['bytes_over_shards']:.3f}x the shards' bytes)" if "bytes_over_shards" in r else ""
        runs = "/".join(f"{x:.2f}" for x in r.get("ratios", [r["ratio"]]))
        lines.append(f"{door:8} {r['samples_per_s']:10,.0f} {r['limit_per_s']:8,.0f} {r['ratio']:6.2f} {runs:>16} "
                     f"{r['store_bytes'] / 1e6:9.1f} {r['peak_inflight']:5d}  {_chose(r)}{extra}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--images", type=int, default=3200)
    p.add_argument("--size", type=int, default=256)
    p.add_argument("--batch", type=int, default=32)
    add_store_args(p)
    p.add_argument("--shard-bandwidth", type=float, default=100e6)
    p.add_argument("--shard-mib", type=int, default=16)
    p.add_argument("--workers", type=int, default=8, help="the mount door's DataLoader workers")
    p.add_argument("--doors", default="tree,shards,mount")
    p.add_argument("--repeat", type=int, default=3, help="runs per door; the median is shown")
    p.add_argument("--tiny", action="store_true", help="a smoke size for CI")
    p.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results"))
    args = p.parse_args(argv)
    args.doors = args.doors.split(",")
    if args.tiny:
        args.images, args.shard_mib, args.workers, args.repeat = 256, 1, 2, 1
    return run_and_report("first_epoch", args, run, format_table)


if __name__ == "__main__":
    raise SystemExit(main())
