"""The ranks of an MPI job mount the data themselves, one mount per node (ServiceLink.node_leaders),
run by tests/mount/cluster/test_mount_cluster.py under ``mpirun -n 4``: ranks 2k and 2k+1 are node k
(CLAIRVOYANT_NODE). Usage: ``mpi_mount_cluster_script.py SRC WORK TOKEN [samplers]``; each rank
writes what it saw to WORK/rank-N.json. With ``samplers`` each rank publishes its quarter of two
shuffled epochs to its node's mount and reads it (the nodes run the cluster plan)."""

from __future__ import annotations

import json
import os
import sys
import time
import traceback

os.environ["CLAIRVOYANT_NODE"] = f"node{int(os.environ.get('OMPI_COMM_WORLD_RANK', '0')) // 2}"

from mpi4py import MPI  # noqa: E402

from clairvoyant.mount import Mount  # noqa: E402
from clairvoyant.mount.cluster.links import ServiceLink  # noqa: E402


def wait_all(comm) -> None:
    req = comm.Ibarrier()
    while not req.Test():
        time.sleep(0.002)


def main() -> None:
    src, work = sys.argv[1], sys.argv[2]
    samplers = sys.argv[4:5] == ["samplers"]
    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()
    node = rank // 2
    out: dict = {"rank": rank}
    mount = None
    try:
        link = ServiceLink.node_leaders(comm)
        out["leader"] = link is not None
        mnt = os.path.join(work, f"mnt{node}")
        if link is not None:
            out["link"] = [link.node, link.nodes]
            mount = Mount(src, mnt, local_dir=os.path.join(work, f"local{node}"), local_capacity="60%", cluster=link)
        wait_all(comm)
        keys = sorted(os.path.relpath(os.path.join(d, f), src) for d, _, fs in os.walk(src) for f in fs)
        bad, reads = [], 0
        if not samplers:
            mine = [keys[rank::4]]   # every file read once, by one rank of the job
        else:   # each rank's sampler publishes its quarter of two shuffled epochs to its node's mount
            from clairvoyant.mount import read_info
            from clairvoyant.mount.orders import publish_order, publish_progress
            from clairvoyant.plan.order import epoch_order
            orders = read_info(mnt)["orders"]
            mine = [[keys[i] for i in epoch_order(len(keys), 0, e, True)[rank::4]] for e in range(3)]
        for e, quarter in enumerate(mine[:2] if samplers else mine):
            if samplers:
                publish_order(orders, rank=rank, world_size=4, epoch=e, seed=0, groups=[[k] for k in quarter],
                              following=[[k] for k in mine[e + 1]])
                if mount is not None:   # the node's plan is made before its ranks read
                    deadline = time.monotonic() + 30
                    while mount.cluster.counters().get("plans", 0) <= e and time.monotonic() < deadline:
                        time.sleep(0.02)
                wait_all(comm)
            for i, k in enumerate(quarter):
                with open(os.path.join(mnt, k), "rb") as f, open(os.path.join(src, k), "rb") as g:
                    if f.read() != g.read():
                        bad.append(k)
                reads += 1
                if samplers and i % 4 == 3:
                    publish_progress(orders, rank, e, i + 1)
            wait_all(comm)
            if mount is not None:
                deadline = time.monotonic() + 20
                while (mount.controller._in_flight() or mount.cluster.busy()) and time.monotonic() < deadline:
                    time.sleep(0.05)
            wait_all(comm)
        out["read"], out["bad"] = reads, bad
        wait_all(comm)
        if mount is not None:
            deadline = time.monotonic() + 20
            while (mount.controller._in_flight() or mount.cluster.busy()) and time.monotonic() < deadline:
                time.sleep(0.05)
            s, c = mount.stats(), mount.cluster.counters()
            out["store"] = s.opens_source + c.get("served_from_store", 0) + c.get("ahead_from_store", 0)
            out["opens_peer"] = s.opens_peer
            out["cluster"] = {k: v for k, v in c.items() if k != "link"}
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
