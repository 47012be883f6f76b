"""Benchmark: `clairvoyant mount` under capacity pressure (issue 22's defect), 4 "nodes" on this
machine. Each node is a `clairvoyant mount` process of one FUSE-emulated slow store, with its own
local directory at ``--capacity`` of the data set, and a DataLoader process reading the node's
quarter of every shuffled epoch through ``clairvoyant.torch.DistributedSampler(num_replicas=4,
rank=i, mount=...)``; the kernel's pages of the mount are dropped between epochs, so that every
read reaches the daemon as it would with a data set larger than memory.

It prints the store's opens per file over the job, beside the reference computed from the same
orders: the misses of the Loader's plan (farthest next use over each node's sequence, looking into
the next epoch, at the same capacity), and each node's staging counters (staged, evicted, evicted
unread). With ``--no-sampler`` the DataLoaders shuffle on their own (PyTorch's DistributedSampler:
the mount sees only opens, and caches what was read in first-open order), the other configuration
the issue names; the plan's figure is then that of clairvoyant's orders, for scale. With
``--cluster`` the 4 mounts are started as one MPI job (``mpirun -n 4 clairvoyant mount --cluster``):
each file kept at its home node, read from there by the others (issue 23); with samplers the nodes
exchange their orders and run the Loader's cluster plan, and the run prints what
``clairvoyant simulate``'s ``cluster`` policy predicts (``cluster-lru`` without a sampler).

    python benchmarks/mount_capacity.py                        # 3,200 files, 4 epochs, 30%
    python benchmarks/mount_capacity.py --no-sampler
    python benchmarks/mount_capacity.py --no-sampler --cluster   # issue 23: the 4 mounts as one cache
    python benchmarks/mount_capacity.py --cluster --capacity 15%   # with samplers: the cluster plan
    python benchmarks/mount_capacity.py --cluster --launcher torchrun   # issue 32: the mounts started by torchrun
    python benchmarks/mount_capacity.py --cluster --lose-node-at 2   # issue 33: node 3 lost as epoch 2 starts
    python benchmarks/mount_capacity.py --cluster --start-skew 2   # issue 42: node r's program starts 2r s late
    python benchmarks/mount_capacity.py --images 160 --epochs 2 --json   # a smoke run

With ``--lose-node-at E`` node 3 is killed (its member, its mount service and its program, SIGKILL)
as soon as node 0's program starts epoch E; the other programs go on (their samplers still deal 4
shares: node 3's share of each later epoch is read by nobody), and the run prints the store's opens
per epoch, each epoch counted when the slowest surviving program has finished it.

The 4 programs start their first epoch together, as DDP's ranks do (since issue 32; before, each
started when its imports were done, seconds apart on 2 cores). The 2 cores are shared by 4 mounts
and 4 DataLoaders: the counts, not the times, are the result.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.abspath(__file__)
NODES = 4


def reader_main(args: argparse.Namespace) -> None:
    """One node's training program: a DataLoader over the node's quarter, through its mount."""
    import torch
    from torch.utils.data import DataLoader, Dataset

    from clairvoyant.testing import drop_pages
    from clairvoyant.torch import DistributedSampler

    mnt, rank = args.reader, args.rank
    keys = sorted(os.path.relpath(os.path.join(d, f), mnt) for d, _, fs in os.walk(mnt) for f in fs
                  if not f.startswith("."))

    class Files(Dataset):
        samples = [(os.path.join(mnt, k), 0) for k in keys]

        def __len__(self) -> int:
            return len(self.samples)

        def __getitem__(self, i: int) -> int:
            with open(self.samples[i][0], "rb", buffering=0) as f:
                return len(f.read())

    ds = Files()
    if args.no_sampler:   # PyTorch's own DistributedSampler: a new quarter each epoch, no order published
        sampler = torch.utils.data.DistributedSampler(ds, num_replicas=NODES, rank=rank, shuffle=True, seed=0)
    else:
        sampler = DistributedSampler(ds, num_replicas=NODES, rank=rank, seed=0, mount=mnt)
    loader = DataLoader(ds, batch_size=32, sampler=sampler, num_workers=2)
    # the nodes start their first epoch together, as DDP's ranks do (its constructor synchronises
    # them): on 2 cores the 4 programs' imports alone spread their starts by seconds otherwise
    work = os.path.dirname(mnt)
    first = args.first_epoch
    open(os.path.join(work, f"ready.{rank}.{first}"), "w").close()
    while not all(os.path.exists(os.path.join(work, f"ready.{r}.{first}")) for r in range(NODES)):
        time.sleep(0.01)
    time.sleep(rank * args.start_skew)   # (--start-skew: node r starts r times that much later)
    at = os.path.join(work, f"at.{rank}")
    for e in range(first, first + args.epochs):
        if hasattr(sampler, "set_epoch"):
            sampler.set_epoch(e)
        with open(at, "w") as f:
            f.write(f"{e} 0")
        seen = 0
        for batch in loader:
            seen += len(batch)
        with open(at, "w") as f:
            f.write(f"{e} 1 {seen}")   # (epoch e done)
        drop_pages(p for p, _ in ds.samples)


def plan_misses(manifest, epochs: int, capacity: int) -> int:
    """Store reads of the Loader's plan of every node's sequence at ``capacity`` bytes."""
    from clairvoyant.cache.entry import entry_size
    from clairvoyant.plan.order import epoch_order
    from clairvoyant.plan.partition import rank_indices
    from clairvoyant.plan.residency import simulate_epoch

    n = len(manifest)
    entry = np.asarray(manifest.sizes) + entry_size(0)
    total = 0
    for r in range(NODES):
        seqs = [np.asarray(rank_indices(epoch_order(n, 0, e, True), r, NODES)) for e in range(epochs + 1)]
        held: dict[int, int] = {}
        for e in range(epochs):
            x = simulate_epoch(seqs[e], seqs[e + 1], entry, capacity, held)
            total += int((~x.hit).sum())
            held = dict(zip(x.residents_after.samples.tolist(), x.residents_after.sizes.tolist()))
    return total


def simulated_per_file(manifest, epochs: int, capacity: int, policy: str) -> float:
    """Store reads per file that ``clairvoyant simulate``'s ``policy`` predicts for this job (the
    same sizes, capacity and seed; a step per index, as the mount interleaves its ranks)."""
    from clairvoyant.cache.entry import entry_size
    from clairvoyant.sim import Hardware, Job
    from clairvoyant.sim.policies import make_policy

    sizes = np.asarray(manifest.sizes, np.int64)
    job = Job(nodes=NODES, gpus=1, batch_size=1, step_time=0.0, epochs=epochs, seed=0)
    runs = make_policy(policy, job, sizes, Hardware(local_capacity=capacity), overhead=entry_size(0)).epochs()
    return round(sum(int(t.store_n.sum()) for t in runs) / len(sizes), 3)


def run(args: argparse.Namespace) -> dict:
    from clairvoyant.fuse.daemon import mounted
    from clairvoyant.manifest import obtain
    from clairvoyant.source import as_source
    from clairvoyant.testing import FuseStore, make_dataset

    work = tempfile.mkdtemp(prefix="cv-mount-capacity-")
    raw = make_dataset(os.path.join(args.data or work, f"imgs-{args.images}-{args.size}"), args.images,
                       num_classes=10, size=args.size)
    cv = os.path.join(os.path.dirname(sys.executable), "clairvoyant")
    out: dict = {"images": args.images, "epochs": args.epochs, "capacity": args.capacity,
                 "start_skew": args.start_skew, "program_per_epoch": args.program_per_epoch,
                 "sampler": not args.no_sampler, "cluster": args.cluster,
                 "nodes": []}
    with FuseStore(raw, open_latency=args.open_latency, read_latency=0.0) as store:
        mounts, mnts = [], []
        try:
            for i in range(NODES):
                mnt = os.path.join(work, f"mnt{i}")
                os.makedirs(mnt)
                mnts.append(mnt)
                if not args.cluster:
                    mounts.append(subprocess.Popen([cv, "mount", store.path, mnt, "--local-dir",
                                                    os.path.join(work, f"local{i}"), "--local-capacity",
                                                    args.capacity],
                                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
            mount_args = [cv, "mount", "--cluster", store.path, os.path.join(work, "mnt{node}"), "--local-dir",
                          os.path.join(work, "local{node}"), "--local-capacity", args.capacity]
            if args.cluster and args.launcher == "mpirun":   # one MPI job of 4 mounts, {node} their number
                env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
                           OMPI_MCA_btl="self,tcp")
                mpirun = os.path.join(os.path.dirname(sys.executable), "mpirun")
                mounts.append(subprocess.Popen([mpirun, "-n", str(NODES), "--oversubscribe", *mount_args],
                                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env))
            elif args.cluster:   # a torchrun agent per node, one mount each, c10d rendezvous on this machine
                torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
                port = _free_port()
                for i in range(NODES):
                    mounts.append(subprocess.Popen(
                        [torchrun, "--nnodes", str(NODES), "--nproc-per-node", "1", "--node-rank", str(i),
                         "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "--no-python", *mount_args],
                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
            deadline = time.monotonic() + 60
            while not all(mounted(m) for m in mnts):
                if time.monotonic() > deadline:
                    raise RuntimeError("the mounts did not come up within 60 s")
                time.sleep(0.1)
            store.reset()
            t0 = time.perf_counter()
            def programs(first: int, epochs: int) -> list[subprocess.Popen]:
                return [subprocess.Popen([sys.executable, HERE, "--reader", mnts[i], "--rank", str(i), "--epochs",
                                          str(epochs), "--first-epoch", str(first), "--start-skew", str(args.start_skew)]
                                         + (["--no-sampler"] if args.no_sampler else []))
                        for i in range(NODES)]

            if args.program_per_epoch:   # each epoch a new program per node, all ended before the next
                marks = []
                for e in range(args.epochs):
                    readers = programs(e, 1)
                    if any([r.wait() for r in readers]):   # (every one waited for)
                        raise RuntimeError(f"a node's DataLoader failed in epoch {e}")
                    marks.append(store.counters().opens)
                out["store_opens_per_epoch"] = [b - a for a, b in zip([0] + marks[:-1], marks)]
            else:
                readers = programs(0, args.epochs)
                out["store_opens_per_epoch"] = _watch(work, readers, args, store, mnts)
            if any(r.wait() for r in readers[:3 if args.lose_node_at is not None else NODES]):
                raise RuntimeError("a node's DataLoader failed")
            out["lost_at"] = args.lose_node_at
            time.sleep(1.0)   # the last staging reports settle
            out["seconds"] = round(time.perf_counter() - t0, 1)
            out["store_opens"] = store.counters().opens
            for m in mnts:
                if not mounted(m):   # (node 3, lost: --lose-node-at)
                    out["nodes"].append({"lost": True})
                    continue
                d = json.loads(subprocess.run([cv, "mount", "--stats", "--json", m], capture_output=True,
                                              text=True, check=True).stdout)
                st = d.get("staging", {})
                out["nodes"].append({k: st.get(k) for k in ("staged_local", "evicted", "evicted_unread", "kept_reads")}
                                    | {k: d.get(k) for k in ("opens_local", "opens_source", "opens_peer", "asks", "wait_timeouts",
                                                             "ask_timeouts")}
                                | {k: round(v, 2) for k, v in st.get("cluster", {}).items()
                                   if k in ("plans", "gather_seconds", "plan_store", "served_absent",
                                            "served_from_store", "ahead_from_store", "evicted", "taken_over",
                                            "served_not_home", "plan_store", "served_absent")})
            manifest, _ = obtain(as_source(store.path))
            capacity = json.loads(subprocess.run([cv, "mount", "--stats", "--json", mnts[0]], capture_output=True,
                                                 text=True, check=True).stdout).get("capacity")
        finally:
            for p in mounts:   # as `clairvoyant umount` does (which would wait on our unreaped children)
                p.terminate()
            for p in mounts:
                try:
                    p.wait(30)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
            deadline = time.monotonic() + 30   # (a cluster's mounts go once every node has answered)
            while any(mounted(m) for m in mnts) and time.monotonic() < deadline:
                time.sleep(0.2)
            for m in mnts:
                if mounted(m):
                    subprocess.run([cv, "umount", m], capture_output=True)
            shutil.rmtree(work, ignore_errors=True)
    if capacity is None:   # as the mount resolves a share of the data set
        from clairvoyant.cache import capacity as capacity_mod
        from clairvoyant.cache.entry import entry_size
        entry = np.asarray(manifest.sizes) + entry_size(0)
        capacity = capacity_mod.resolve(args.capacity, what="local_capacity", dataset_bytes=int(entry.sum()),
                                        largest_entry=int(entry.max()), default=lambda: 0).nbytes
    out["plan_misses"] = plan_misses(manifest, args.epochs, int(capacity))
    if args.cluster:   # what the simulator predicts: the cluster plan with samplers, recency without
        out["simulated_policy"] = "cluster-lru" if args.no_sampler else "cluster"
        out["simulated_per_file"] = simulated_per_file(manifest, args.epochs, int(capacity), out["simulated_policy"])
    out["store_opens_per_file"] = round(out["store_opens"] / args.images, 3)
    out["plan_per_file"] = round(out["plan_misses"] / args.images, 3)
    out["ratio_to_plan"] = round(out["store_opens"] / max(1, out["plan_misses"]), 3)
    return out


def _at(work: str, rank: int) -> tuple[int, bool]:
    """Reader ``rank``'s epoch and whether it has finished it."""
    try:
        with open(os.path.join(work, f"at.{rank}")) as f:
            parts = f.read().split()
        return int(parts[0]), parts[1] == "1"
    except (OSError, ValueError, IndexError):
        return -1, False


def _watch(work: str, readers: list, args: argparse.Namespace, store, mnts: list[str]) -> list[int]:
    """The store's opens per epoch, each read when the slowest of readers 0-2 has finished that
    epoch; with ``args.lose_node_at``, node 3 killed (its program, its member, its mount service)
    when reader 0 starts that epoch."""
    from clairvoyant.mount.fs import read_info

    service = int(read_info(mnts[3])["pid"]) if args.cluster else -1
    members = [p for p in _pids() if "mount --cluster" in _cmd(p) and "--serve-node" not in _cmd(p)
               and "mnt{node}" in _cmd(p) and _env(p).get("OMPI_COMM_WORLD_RANK", _env(p).get("RANK")) == "3"]
    killed, marks = args.lose_node_at is None, []
    while len(marks) < args.epochs and any(r.poll() is None for r in readers[:3]):
        if not killed and _at(work, 0)[0] >= args.lose_node_at:
            for pid in [readers[3].pid, service, *members]:
                try:
                    os.kill(pid, 9)
                except ProcessLookupError:
                    pass
            killed = True
        done = min((e + 1 if fin else e) for e, fin in (_at(work, r) for r in range(3)))
        while len(marks) < min(done, args.epochs):
            marks.append(store.counters().opens)
        time.sleep(0.05)
    while len(marks) < args.epochs:
        marks.append(store.counters().opens)
    return [b - a for a, b in zip([0] + marks[:-1], marks)]


def _pids() -> list[int]:
    return [int(p) for p in os.listdir("/proc") if p.isdigit()]


def _cmd(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            parts = f.read().split(b"\0")
        return " ".join([os.path.basename(parts[0].decode())] + [x.decode() for x in parts[1:] if x])
    except (OSError, IndexError, UnicodeDecodeError):
        return ""


def _env(pid: int) -> dict:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return dict(x.decode(errors="replace").split("=", 1) for x in f.read().split(b"\0") if b"=" in x)
    except OSError:
        return {}


def _free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--images", type=int, default=3200)
    p.add_argument("--size", type=int, default=128, help="image side in pixels")
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--capacity", default="30%", help="each node's local tier")
    p.add_argument("--open-latency", type=float, default=0.002, help="the store's seconds per open")
    p.add_argument("--no-sampler", action="store_true", help="programs shuffle on their own")
    p.add_argument("--first-epoch", type=int, default=0, help=argparse.SUPPRESS)   # (a program's first)
    p.add_argument("--program-per-epoch", action="store_true",
                   help="each node runs a new program per epoch (with --start-skew: skewed each epoch)")
    p.add_argument("--start-skew", type=float, default=0.0,
                   help="seconds between one node's program's start and the next's (issue 42)")
    p.add_argument("--cluster", action="store_true", help="the 4 mounts as one cache (mpirun, issue 23)")
    p.add_argument("--launcher", choices=("mpirun", "torchrun"), default="mpirun",
                   help="what starts the cluster's mounts (issue 32: torchrun, no MPI)")
    p.add_argument("--lose-node-at", type=int, help="kill node 3 (its mount and its program) as epoch E starts "
                   "(issue 33; with --cluster)")
    p.add_argument("--data", help="where to keep the generated data set (default: a temporary folder)")
    p.add_argument("--json", action="store_true")
    p.add_argument("--reader", help=argparse.SUPPRESS)
    p.add_argument("--rank", type=int, default=0, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.program_per_epoch and args.lose_node_at is not None:
        p.error("--lose-node-at needs the programs that run every epoch (not --program-per-epoch)")
    if args.reader:
        reader_main(args)
        return 0
    res = run(args)
    if args.json:
        print(json.dumps(res))
        return 0
    print(f"{args.images} files, {args.epochs} epochs, 4 nodes at {args.capacity} each, "
          f"{'clairvoyant sampler' if res['sampler'] else 'programs shuffle on their own'}: "
          f"store opened {res['store_opens_per_file']} times per file over the job; the Loader's plan of the "
          f"same sequences {res['plan_per_file']} ({res['ratio_to_plan']}x the plan); {res['seconds']} s")
    lost = f"node 3 lost as epoch {res['lost_at']} started; " if res["lost_at"] is not None else ""
    print(f"  {lost}the store's opens per epoch (per file): "
          + ", ".join(f"{n / args.images:.3f}" for n in res["store_opens_per_epoch"]))
    if "simulated_per_file" in res:
        print(f"  clairvoyant simulate's {res['simulated_policy']} policy predicts {res['simulated_per_file']} per file")
    for i, n in enumerate(res["nodes"]):
        print(f"  node {i}: {n}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
