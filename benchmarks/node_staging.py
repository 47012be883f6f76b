"""Benchmark: a node stages as one (issue 52) -- several ranks, and several jobs, on one node.

Two cases, each on a FuseStore mount (reads through the kernel) charging ``--open-latency`` per
open, ``--read-latency`` per read, a shared ``--bandwidth`` and at most ``--max-inflight``
requests in service at once; nothing decoded (``decode=len``), defaults otherwise:

  (a) lockstep: ``--ranks`` ranks of one node (``torchrun --standalone --nproc-per-node``), in
      lockstep as DDP runs them (a gloo ``all_reduce`` after every batch), one first epoch of the
      tree of JPEGs, each rank's Loader on the node's one ``local_dir``. Prints the node's files/s
      over the store's limit (min(in flight / (open + read latency), bandwidth / mean size)), each
      rank's share of the epoch spent waiting for its batches, and the staging threads of the
      node (``stats()["stage_threads"]`` summed over its ranks) beside the store's requests in
      flight; against the same ranks' sum alone (one rank alone: ``--ranks 1``);
  (b) sweep: ``--jobs`` jobs of one rank each (seeds 0, 1, ...) started together on the node,
      sharing one ``local_dir`` that can hold the whole data set, ``--sweep-epochs`` epochs each;
      prints the store's opens per file over all jobs (one shared cache: 1.00; islands: the
      number of jobs), beside the same jobs with a ``local_dir`` each (the reference run);
  (c) sweep-half (``--cases sweep-half``): the same jobs on one ``local_dir`` of half the data
      set's bytes; prints their store opens per file beside the offline optimum of the jobs'
      merged sequence (their orders interleaved sample by sample; farthest next use, one tier).

The store's counters are reset once every rank has made its Loader (the listing is not
counted), and the clock starts there, ``import torch`` done before.

    python benchmarks/node_staging.py                 # 3,200 JPEGs of 256x256, 4 ranks, 2 jobs
    python benchmarks/node_staging.py --tiny          # a smoke size for CI
    python benchmarks/node_staging.py --cases sweep   # one case
"""

from __future__ import annotations

import torch  # imported before any clock

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time

import numpy as np
from first_epoch import file_limit
from fusebench import add_store_args, run_and_report, store_of

from clairvoyant.nodeio.paths import cache_home
from clairvoyant.testing import FuseStore, make_dataset

HERE = os.path.abspath(__file__)


def _wait_for(paths: list[str], procs: list[subprocess.Popen], what: str, limit: float = 600.0) -> None:
    deadline = time.monotonic() + limit
    while not all(os.path.exists(p) for p in paths):
        if any(p.poll() not in (None, 0) for p in procs):
            raise RuntimeError(f"node_staging: a process failed before {what}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"node_staging: {what} did not come within {limit:.0f} s")
        time.sleep(0.05)


def worker(args: argparse.Namespace) -> int:
    """One rank (under torchrun: lockstep) or one job of a sweep: its Loader, the go, its epochs."""
    from clairvoyant import Loader

    lockstep = "LOCAL_RANK" in os.environ
    if lockstep:
        import torch.distributed as dist
        dist.init_process_group("gloo")
        me = dist.get_rank()
    else:
        me = args.seed
    with Loader(args.store, batch_size=args.batch, local_dir=args.local_dir, seed=args.seed, decode=len,
                output="numpy", local_capacity=args.local_capacity) as loader:
        open(os.path.join(args.sync, f"ready{me}"), "w").close()
        _wait_for([os.path.join(args.sync, "go")], [], "the go")
        one = torch.zeros(1)
        t0 = time.perf_counter()
        waited, n = 0.0, 0
        for e in range(args.epochs):
            loader.set_epoch(e)
            it = iter(loader)
            while True:
                w0 = time.perf_counter()
                try:
                    batch = next(it)
                except StopIteration:
                    break
                waited += time.perf_counter() - w0
                n += len(batch[1])
                if lockstep:
                    dist.all_reduce(one)
        seconds = time.perf_counter() - t0
        s = loader.stats()
        out = {"rank": me, "samples": n, "seconds": seconds, "waited": waited, "stage_threads": s["stage_threads"],
               "staging": s.get("staging")}
    with open(os.path.join(args.sync, f"out{me}.json"), "w") as f:
        json.dump(out, f)
    if lockstep:
        dist.destroy_process_group()
    return 0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run_processes(fs: FuseStore, cmds: list[list[str]], sync: str, names: list[str]) -> tuple[list[dict], float, dict]:
    """Start ``cmds``, reset the store once every ``ready<name>`` is there, say go, wait for them:
    each one's output, the wall seconds from the go, the store's counters. (Their temporary files
    go under ``sync``: torchrun's agents leave theirs behind.)"""
    procs = [subprocess.Popen(c, env={**os.environ, "TMPDIR": sync}) for c in cmds]
    try:
        _wait_for([os.path.join(sync, f"ready{n}") for n in names], procs, "every Loader")
        fs.reset()
        t0 = time.perf_counter()
        open(os.path.join(sync, "go"), "w").close()
        if any(p.wait(1800) for p in procs):
            raise RuntimeError("node_staging: a rank or job failed")
        wall = time.perf_counter() - t0
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    c = fs.counters()
    outs = [json.load(open(os.path.join(sync, f"out{n}.json"))) for n in names]
    return outs, wall, {"opens": c.opens, "bytes": c.bytes, "peak_inflight": c.peak_inflight}


def lockstep(data: str, store: dict, work: str, ranks: int, batch: int) -> dict:
    sync = tempfile.mkdtemp(dir=work, prefix=f"lockstep{ranks}-")
    torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
    with FuseStore(data, **store) as fs:
        cmd = [torchrun, "--standalone", "--nproc-per-node", str(ranks), "--master-port", str(_free_port()), HERE,
               "--worker", "--store", fs.path, "--local-dir", os.path.join(sync, "local"), "--sync", sync,
               "--batch", str(batch), "--epochs", "1", "--seed", "0"]
        outs, wall, counters = _run_processes(fs, [cmd], sync, [str(r) for r in range(ranks)])
    samples = sum(o["samples"] for o in outs)
    seconds = max(o["seconds"] for o in outs)   # the go to the last rank's last batch (not the processes' exits)
    return {"ranks": ranks, "samples": samples, "seconds": seconds, "wall": wall, "files_per_s": samples / seconds,
            "waited": [o["waited"] / o["seconds"] for o in outs],
            "stage_threads": sum(o["stage_threads"] for o in outs), "per_rank_threads": [o["stage_threads"] for o in outs],
            "store": counters, "staging": outs[0].get("staging")}


def sweep(data: str, store: dict, work: str, jobs: int, epochs: int, batch: int, islands: bool = False,
          capacity: int | None = None) -> dict:
    """``jobs`` jobs of one rank, seeds 0.., on one ``local_dir`` (``islands``: each its own, the
    reference: every job reads the store for itself) of ``capacity`` bytes (None: the default)."""
    sync = tempfile.mkdtemp(dir=work, prefix="sweep-")
    with FuseStore(data, **store) as fs:
        cmds = [[sys.executable, HERE, "--worker", "--store", fs.path, "--local-dir",
                 os.path.join(sync, f"local{j}" if islands else "local"), "--sync", sync, "--batch", str(batch),
                 "--epochs", str(epochs), "--seed", str(j)] + ([] if capacity is None else ["--local-capacity", str(capacity)])
                for j in range(jobs)]
        outs, wall, counters = _run_processes(fs, cmds, sync, [str(j) for j in range(jobs)])
    return {"jobs": jobs, "epochs": epochs, "islands": islands, "capacity": capacity, "seconds": wall,
            "samples": [o["samples"] for o in outs], "store": counters}


def merged_optimum(entry: np.ndarray, jobs: int, epochs: int, capacity: int) -> int:
    """Store reads of the offline optimum (farthest next use, one tier of ``capacity`` bytes) over
    the jobs' merged sequence: their orders (seeds 0.., one rank each) interleaved sample by
    sample, as jobs running at one pace read them."""
    from clairvoyant.plan.order import epoch_order
    from clairvoyant.plan.residency import simulate_epoch

    n = len(entry)
    orders = [np.concatenate([epoch_order(n, j, e, True) for e in range(epochs)]) for j in range(jobs)]
    merged = np.stack(orders, axis=1).reshape(-1).astype(np.int64)
    x = simulate_epoch(merged, np.zeros(0, np.int64), entry, int(capacity), {})
    return int((~x.hit).sum())


def sizes_in_manifest_order(data: str) -> np.ndarray:
    """The files' sizes in the order of the Loader's manifest of ``data`` (its index numbers)."""
    from clairvoyant.manifest import obtain
    from clairvoyant.source import as_source

    manifest, _ = obtain(as_source(data))
    return np.asarray(manifest.sizes, np.int64)


def run(args: argparse.Namespace) -> dict:
    name = f"synthetic-imagenet-{args.images}"   # the demo's data set
    data = make_dataset(os.path.join(cache_home(), "demo", name), args.images, size=args.size)
    sizes = np.array([os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(data) for f in fs
                      if not f.startswith(".")], dtype=np.int64)
    store = store_of(args)
    limit = file_limit(sizes, store)
    out: dict = {"params": dict(images=len(sizes), size=args.size, batch=args.batch, store=store, limit_per_s=limit,
                                cpus=os.cpu_count(), torch=torch.__version__)}
    with tempfile.TemporaryDirectory(prefix="clairvoyant-node-staging-") as work:
        if "lockstep" in args.cases:
            rows = []
            for ranks in sorted({1, args.ranks}):
                for k in range(args.repeat):
                    print(f"node_staging: lockstep, {ranks} rank(s), run {k + 1} of {args.repeat}", flush=True)
                    r = lockstep(data, store, work, ranks, args.batch)
                    r["ratio"] = r["files_per_s"] / limit
                    rows.append(r)
            out["lockstep"] = rows
        if "sweep" in args.cases:
            rows = []
            for islands in (False, True):   # one local_dir, then the reference: one each
                print(f"node_staging: sweep, {args.jobs} jobs, {'a local_dir each' if islands else 'one local_dir'}",
                      flush=True)
                r = sweep(data, store, work, args.jobs, args.sweep_epochs, args.batch, islands)
                r["opens_per_file"] = r["store"]["opens"] / len(sizes)
                rows.append(r)
            out["sweep"] = rows
        if "sweep-half" in args.cases:   # the shared tier at half the data set, beside the offline optimum
            from clairvoyant.cache.entry import entry_size
            entry = sizes_in_manifest_order(data) + entry_size(0)
            capacity = int(entry.sum() // 2)
            print(f"node_staging: sweep, {args.jobs} jobs, one local_dir of half the data set", flush=True)
            r = sweep(data, store, work, args.jobs, args.sweep_epochs, args.batch, capacity=capacity)
            r["opens_per_file"] = r["store"]["opens"] / len(sizes)
            r["optimum_per_file"] = merged_optimum(entry, args.jobs, args.sweep_epochs, capacity) / len(sizes)
            out["sweep_half"] = r
    return out


def format_table(s: dict) -> str:
    p = s["params"]
    st = p["store"]
    lines = [f"a node's staging: {p['images']} JPEGs; store {st['open_latency'] * 1e3:g} ms per open, "
             f"{st['read_latency'] * 1e3:g} ms per read, {st['bandwidth'] / 1e6:g} MB/s, {st['max_inflight']} in "
             f"flight (limit {p['limit_per_s']:,.0f} files/s); {p['cpus']} CPUs, torch {p['torch']}"]
    if "lockstep" in s:
        lines.append(f"{'ranks':>5} {'files/s':>8} {'ratio':>6} {'waited (per rank)':>24} {'threads':>8} {'peak':>5}")
        for r in s["lockstep"]:
            waited = "/".join(f"{w:.0%}" for w in r["waited"])
            lines.append(f"{r['ranks']:5d} {r['files_per_s']:8,.0f} {r['ratio']:6.2f} {waited:>24} "
                         f"{r['stage_threads']:8d} {r['store']['peak_inflight']:5d}")
    if "sweep_half" in s:
        r = s["sweep_half"]
        lines.append(f"sweep: {r['jobs']} jobs x {r['epochs']} epochs on one local_dir of half the data set: the store "
                     f"opened {r['opens_per_file']:.2f} times per file; the offline optimum of their merged sequence "
                     f"{r['optimum_per_file']:.2f}")
    for r in s.get("sweep", []):
        where = "a local_dir each (the reference)" if r["islands"] else "one local_dir"
        lines.append(f"sweep: {r['jobs']} jobs x {r['epochs']} epochs on {where}: the store opened "
                     f"{r['opens_per_file']:.2f} times per file (one shared cache: 1.00; islands: {r['jobs']:.2f})")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--images", type=int, default=3200)
    p.add_argument("--size", type=int, default=256)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument("--sweep-epochs", type=int, default=2)
    add_store_args(p)
    p.add_argument("--cases", default="lockstep,sweep")
    p.add_argument("--repeat", type=int, default=1, help="runs of each lockstep case")
    p.add_argument("--tiny", action="store_true", help="a smoke size for CI")
    p.add_argument("--out", default=os.path.join(os.path.dirname(HERE), "results"))
    # one rank or job (started by this script)
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--store", help=argparse.SUPPRESS)
    p.add_argument("--local-dir", help=argparse.SUPPRESS)
    p.add_argument("--sync", help=argparse.SUPPRESS)
    p.add_argument("--epochs", type=int, default=1, help=argparse.SUPPRESS)
    p.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--local-capacity", type=int, default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        return worker(args)
    args.cases = args.cases.split(",")
    if args.tiny:
        args.images, args.size, args.ranks, args.batch = 192, 64, 2, 8
    return run_and_report("node_staging", args, run, format_table)


if __name__ == "__main__":
    raise SystemExit(main())
