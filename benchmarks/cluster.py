"""Benchmark: the cluster cache (issue 9) against node-by-node tiers, ``mpirun -n 4`` on this machine,
each rank its own "node" (CLAIRVOYANT_NODE) with its own local directory, all on one emulated shared
store whose counters the processes share.

For each configuration (capacity per node, store latency) it runs the same job twice, cluster cache
on and off, and prints per epoch: bytes read from the store (as a share of the data set), bytes
from peers, and the epoch's wall time; the ratios on/off come from the same run. ``--plot PATH``
draws the store's bytes per epoch, on against off, one panel per configuration (matplotlib: the
``plot`` extra).

    python benchmarks/cluster.py                  # 4 nodes x {30%, 10%}, slow and fast store, 4 epochs
    python benchmarks/cluster.py --images 400     # smaller
    python benchmarks/cluster.py --plot out/cluster.png
    python benchmarks/cluster.py --images 200 --epochs 2 --stores fast --plot out/cluster.png   # a smoke run

The ranks talk through shared memory, far faster than a network: the data plane emulates an
interconnect (cluster/peers.py: every message leaves after a latency plus its size over a bandwidth),
by default a plausible HPC fabric, ``--peer-latency 20e-6`` (20 us, one way) and
``--peer-bandwidth 10e9`` (10 GB/s per rank); ``--peer-latency 0 --peer-bandwidth 0`` turns it off.
They reach the ranks as ``CLAIRVOYANT_PEER_LATENCY`` and ``CLAIRVOYANT_PEER_BANDWIDTH``.

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

HERE = os.path.abspath(__file__)


def rank_main(args: argparse.Namespace) -> None:
    os.environ["CLAIRVOYANT_NODE"] = "node%s" % os.environ.get("OMPI_COMM_WORLD_RANK", "0")
    import torch  # noqa: F401  (before the clock, as users run)
    from mpi4py import MPI

    from mpi_epochs import timed_epochs

    from clairvoyant import Loader
    from clairvoyant.cluster.wire import emulated_link
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
    rows = [{"epoch": e, "seconds": dt, "store": store_bytes / total, "peer": peer / total,
             "link": list(emulated_link())}
            for e, dt, peer, store_bytes in timed_epochs(comm, ld, store, args.epochs)]
    ld.close()
    if rank == 0:
        print(json.dumps(rows))


def run(data: str, capacity: str, store: str, cluster: str, epochs: int, link: tuple[float, float]) -> list[dict]:
    from clairvoyant.cluster.wire import BANDWIDTH_VAR, LATENCY_VAR
    mpirun = os.path.join(os.path.dirname(sys.executable), "mpirun")
    with tempfile.TemporaryDirectory(prefix="cv-cluster-") as work:
        cmd = [mpirun, "-n", "4", "--oversubscribe", "--bind-to", "none", "-x", LATENCY_VAR, "-x", BANDWIDTH_VAR,
               sys.executable, HERE, "--rank", "--data", data, "--work", work, "--capacity", capacity,
               "--store", store, "--cluster", cluster, "--epochs", str(epochs)]
        env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
                   **{LATENCY_VAR: repr(link[0]), BANDWIDTH_VAR: repr(link[1])})
        r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1800)
        if r.returncode != 0:
            raise SystemExit(r.stderr[-3000:])
        rows = json.loads(r.stdout.strip().splitlines()[-1])
        if any(tuple(row.pop("link")) != link for row in rows):
            raise SystemExit(f"the ranks did not get the emulated link {link}")
        return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rank", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--data"), p.add_argument("--work"), p.add_argument("--capacity", default="30%")
    p.add_argument("--store", default="slow"), p.add_argument("--cluster", default="on")
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--images", type=int, default=1600)
    p.add_argument("--capacities", default="30%,10%")
    p.add_argument("--stores", default="slow,fast")
    p.add_argument("--peer-latency", type=float, default=20e-6,
                   help="emulated interconnect: seconds per message, one way (default 20e-6; 0: none)")
    p.add_argument("--peer-bandwidth", type=float, default=10e9,
                   help="emulated interconnect: bytes per second per rank (default 10e9; 0: unlimited)")
    p.add_argument("--json", help="write the results here")
    p.add_argument("--plot", help="draw the store's bytes per epoch, cluster cache on and off, into this image")
    args = p.parse_args(argv)
    if args.peer_latency < 0 or args.peer_bandwidth < 0:
        p.error("--peer-latency and --peer-bandwidth must be >= 0")
    if args.plot and not args.rank:
        try:
            import matplotlib  # noqa: F401  (fail before the runs, not after)
        except ImportError:
            p.error("--plot needs matplotlib: pip install 'clairvoyant[plot]'")
    if args.rank:
        rank_main(args)
        return 0
    from clairvoyant.nodeio.paths import cache_home
    from clairvoyant.testing import make_dataset
    data = args.data or make_dataset(os.path.join(cache_home(), "bench", f"cluster-data-{args.images}"),
                                     args.images, num_classes=10, size=128)
    results = []
    link = (args.peer_latency, args.peer_bandwidth)
    print(f"{args.images} images, 4 nodes, {args.epochs} epochs; peers over an emulated link of "
          f"{link[0] * 1e6:g} us and {link[1] / 1e9:g} GB/s (0: no limit); store share and peer share of the data set "
          "per epoch; epoch seconds; on/off from the same run")
    for store in args.stores.split(","):
        for cap in args.capacities.split(","):
            on = run(data, cap, store, "on", args.epochs, link)
            off = run(data, cap, store, "off", args.epochs, link)
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
            json.dump({"images": args.images, "epochs": args.epochs, "peer_latency": link[0],
                       "peer_bandwidth": link[1], "results": results}, f, indent=1)
    if args.plot:
        plot(results, args.plot, f"{args.images} images, 4 nodes; peers over {link[0] * 1e6:g} us, "
                                 f"{link[1] / 1e9:g} GB/s")
        print(f"plot: {args.plot}")
    return 0


def plot(results: list[dict], path: str, title: str) -> None:
    """Shared-store bytes per epoch (share of the data set), cluster cache on and off, and the
    peers' share with it on: one panel per configuration."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, len(results), figsize=(3.6 * len(results), 3.4), sharey=True, squeeze=False)
    lines = []
    for ax, res in zip(axes[0], results):
        epochs = [r["epoch"] for r in res["on"]]
        lines = [ax.plot(epochs, [r["store"] for r in res["off"]], "s--", color="tab:gray")[0],
                 ax.plot(epochs, [r["store"] for r in res["on"]], "o-", color="tab:blue")[0],
                 ax.plot(epochs, [r["peer"] for r in res["on"]], "^:", color="tab:orange")[0]]
        job_on, job_off = sum(r["store"] for r in res["on"]), sum(r["store"] for r in res["off"])
        ax.set_title(f"{res['store']} store, {res['capacity']} per node\nper job: {job_on:.2f}x vs {job_off:.2f}x",
                     fontsize=9)
        ax.set_xlabel("epoch")
        ax.set_xticks(epochs)
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("bytes / data set")
    axes[0][0].set_ylim(0, 1.08)
    fig.legend(lines, ["shared store, node by node", "shared store, cluster cache", "peers, cluster cache"],
               loc="lower center", ncol=3, fontsize=8, frameon=False)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
