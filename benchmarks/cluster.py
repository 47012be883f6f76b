"""Benchmark: the cluster cache (issue 9) against node-by-node tiers, ``mpirun -n 4`` on this machine,
each rank its own "node" (CLAIRVOYANT_NODE) with its own local directory, all on one emulated shared
store whose counters the processes share.

For each configuration (capacity per node, store latency) it runs the same job twice, cluster cache
on and off, and prints per epoch: bytes read from the store (as a share of the data set), bytes
from peers, and the epoch's wall time; the ratios on/off come from the same run.

    python benchmarks/cluster.py                  # 4 nodes x {30%, 10%}, slow and fast store, 4 epochs
    python benchmarks/cluster.py --images 400     # smaller
    python benchmarks/cluster.py --plot out/cluster.png

The 2 cores are shared by the 4 "nodes", so epoch times measure CPU contention as much as I/O:
the slow store (10 ms per open) shows what the cluster cache saves where the store binds; the
fast store (no latency) shows its cost where it does not.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.abspath(__file__)


def rank_main(args: argparse.Namespace) -> None:
    os.environ["CLAIRVOYANT_NODE"] = "node%s" % os.environ.get("OMPI_COMM_WORLD_RANK", "0")
    import torch  # noqa: F401  (before the clock, as users run)
    from mpi4py import MPI

    from clairvoyant import Loader
    from clairvoyant.testing import EmulatedStore
    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()
    lat = (0.010, 0.002) if args.store == "slow" else (0.0, 0.0)
    store = EmulatedStore(args.data, open_latency=lat[0], read_latency=lat[1], state_dir=os.path.join(args.work, "emu"))
    ld = Loader(store, batch_size=32, local_dir=os.path.join(args.work, f"l{rank}"), local_capacity=args.capacity,
                cluster=args.cluster == "on", output="numpy", num_workers=1, decode=len,
                # off: each rank alone on its "node" (the launcher would say 4 ranks share one)
                local_world_size=None if args.cluster == "on" else 1)
    total = int(sum(ld.manifest.sizes))
    rows = []
    for e in range(args.epochs):
        comm.Barrier()
        if rank == 0:
            store.reset()
        comm.Barrier()
        ld.set_epoch(e)
        t0 = time.perf_counter()
        for _ in ld:
            pass
        comm.Barrier()
        dt = time.perf_counter() - t0
        peer = comm.reduce(ld.stats()["epochs"].get(e, {}).get("peer_bytes", 0), root=0)
        rows.append({"epoch": e, "seconds": dt, "store": store.counters().bytes / total,
                     "peer": (peer or 0) / total})
    ld.close()
    if rank == 0:
        print(json.dumps(rows))


def run(data: str, capacity: str, store: str, cluster: str, epochs: int) -> list[dict]:
    mpirun = os.path.join(os.path.dirname(sys.executable), "mpirun")
    with tempfile.TemporaryDirectory(prefix="cv-cluster-") as work:
        cmd = [mpirun, "-n", "4", "--oversubscribe", "--bind-to", "none", sys.executable, HERE, "--rank",
               "--data", data, "--work", work, "--capacity", capacity, "--store", store, "--cluster", cluster,
               "--epochs", str(epochs)]
        env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
        r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1800)
        if r.returncode != 0:
            raise SystemExit(r.stderr[-3000:])
        return json.loads(r.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rank", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--data"), p.add_argument("--work"), p.add_argument("--capacity", default="30%")
    p.add_argument("--store", default="slow"), p.add_argument("--cluster", default="on")
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--images", type=int, default=1600)
    p.add_argument("--capacities", default="30%,10%")
    p.add_argument("--stores", default="slow,fast")
    p.add_argument("--json", help="write the results here")
    args = p.parse_args(argv)
    if args.rank:
        rank_main(args)
        return 0
    from clairvoyant.testing import make_dataset
    data = args.data or make_dataset(os.path.join(tempfile.gettempdir(), f"cv-cluster-data-{args.images}"),
                                     args.images, num_classes=10, size=128)
    results = []
    print(f"{args.images} images, 4 nodes, {args.epochs} epochs; store share and peer share of the data set "
          "per epoch; epoch seconds; on/off from the same run")
    for store in args.stores.split(","):
        for cap in args.capacities.split(","):
            on = run(data, cap, store, "on", args.epochs)
            off = run(data, cap, store, "off", args.epochs)
            results.append({"store": store, "capacity": cap, "on": on, "off": off})
            job_on, job_off = sum(r["store"] for r in on), sum(r["store"] for r in off)
            later = sum(r["seconds"] for r in off[1:]) / max(1e-9, sum(r["seconds"] for r in on[1:]))
            print(f"{store:4} store, {cap:>4} per node: store per epoch on "
                  f"{[round(r['store'], 3) for r in on]} off {[round(r['store'], 3) for r in off]}; "
                  f"per job {job_on:.2f}x vs {job_off:.2f}x; peers {[round(r['peer'], 3) for r in on]}; "
                  f"later epochs' speed on/off {later:.2f}x "
                  f"(s: on {[round(r['seconds'], 2) for r in on]} off {[round(r['seconds'], 2) for r in off]})")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
