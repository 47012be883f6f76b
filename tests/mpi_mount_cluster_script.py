"""The ranks of an MPI job mount the data themselves, one mount per node (MPILink.node_leaders),
run by tests/test_mount_cluster.py under ``mpirun -n 4``: ranks 2k and 2k+1 are node k
(CLAIRVOYANT_NODE). Usage: ``mpi_mount_cluster_script.py SRC WORK TOKEN``; each rank writes what it saw
to WORK/rank-N.json."""

from __future__ import annotations

import json
import os
import sys
import time
import traceback

os.environ["CLAIRVOYANT_NODE"] = f"node{int(os.environ.get('OMPI_COMM_WORLD_RANK', '0')) // 2}"

from mpi4py import MPI  # noqa: E402

from clairvoyant.mount import Mount  # noqa: E402
from clairvoyant.mount.cluster import MPILink  # noqa: E402


def wait_all(comm) -> None:
    req = comm.Ibarrier()
    while not req.Test():
        time.sleep(0.002)


def main() -> None:
    src, work = sys.argv[1], sys.argv[2]
    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()
    node = rank // 2
    out: dict = {"rank": rank}
    mount = None
    try:
        link = MPILink.node_leaders(comm)
        out["leader"] = link is not None
        mnt = os.path.join(work, f"mnt{node}")
        if link is not None:
            out["link"] = [link.node, link.nodes]
            mount = Mount(src, mnt, local_dir=os.path.join(work, f"local{node}"), local_capacity="60%", cluster=link)
        wait_all(comm)
        keys = sorted(os.path.relpath(os.path.join(d, f), src) for d, _, fs in os.walk(src) for f in fs)
        mine = keys[rank::4]   # every file read once, by one rank of the job
        bad = []
        for k in mine:
            with open(os.path.join(mnt, k), "rb") as f, open(os.path.join(src, k), "rb") as g:
                if f.read() != g.read():
                    bad.append(k)
        out["read"], out["bad"] = len(mine), bad
        wait_all(comm)
        if mount is not None:
            deadline = time.monotonic() + 20
            while (mount.controller._in_flight() or mount.cluster.busy()) and time.monotonic() < deadline:
                time.sleep(0.05)
            s, c = mount.stats(), mount.cluster.counters()
            out["store"] = s.opens_source + c.get("served_from_store", 0) + c.get("ahead_from_store", 0)
            out["opens_peer"] = s.opens_peer
        wait_all(comm)
    except Exception:
        out["error"] = traceback.format_exc()
    finally:
        if mount is not None:
            mount.close()
    with open(os.path.join(work, f"rank-{rank}.json"), "w") as f:
        json.dump(out, f)


if __name__ == "__main__":
    main()
