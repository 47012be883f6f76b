"""Run by tests/test_cluster.py under ``mpirun -n N``: each rank is its own "node" (CLAIRVOYANT_NODE),
with its own local directory, all reading one emulated store whose counters the processes share.

argv: dataset, workdir, local_capacity, epochs, cluster (on/off), scenario (plain, corrupt-wire,
corrupt-entry). Rank 0 prints one JSON line: store opens per epoch, whether every epoch served every
sample exactly once with the source's bytes, and each rank's per-epoch counters."""

from __future__ import annotations

import hashlib
import json
import os
import sys

import numpy as np

os.environ["CLAIRVOYANT_NODE"] = "node%s" % os.environ.get("OMPI_COMM_WORLD_RANK", os.environ.get("PMI_RANK", "0"))

from mpi4py import MPI  # noqa: E402

from clairvoyant import Loader  # noqa: E402
from clairvoyant.dist import peers  # noqa: E402
from clairvoyant.testing import EmulatedStore  # noqa: E402


def md5(b: bytes) -> np.ndarray:
    return np.frombuffer(hashlib.md5(b).digest(), np.uint8).copy()


def main() -> None:
    dataset, work, cap, epochs, mode, scenario = sys.argv[1:7]   # argv[7]: the test's token
    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()
    store = EmulatedStore(dataset, open_latency=0.0, read_latency=0.0, state_dir=os.path.join(work, "emu"))
    ld = Loader(store, batch_size=4, local_dir=os.path.join(work, f"l{rank}"), local_capacity=cap,
                cluster=mode == "on", decode=md5, output="numpy", num_workers=1, stage_threads=4,
                # off: each rank alone on its "node" (the launcher would say 4 ranks share one)
                local_world_size=None if mode == "on" else 1)
    if scenario == "corrupt-wire":
        peers.CORRUPT_ON_SEND.update(range(len(ld.manifest)))   # every sample this rank serves
    opens, served = [], []
    for e in range(int(epochs)):
        comm.Barrier()
        if rank == 0:
            store.reset()
        comm.Barrier()
        ld.set_epoch(e)
        mine = [bytes(row).hex() for x, _ in ld for row in np.asarray(x)]
        if scenario == "corrupt-entry" and e == 0:   # flip a byte in every entry this node keeps
            for name in ld.store.entries():
                path = os.path.join(ld.store.data_dir, name[:2], name)
                with open(path, "r+b") as f:
                    b = f.read(1)
                    f.seek(0)
                    f.write(bytes([b[0] ^ 0x40]))
        comm.Barrier()
        opens.append(store.counters().opens)
        served.append(comm.gather(mine, root=0))
    stats = ld.stats()
    ld.close()
    per_rank = comm.gather({"epochs": {str(k): v for k, v in stats["epochs"].items()}, "tiers": stats["tiers"],
                            "cluster": stats.get("cluster")}, root=0)
    if rank == 0:
        truth = sorted(hashlib.md5(open(os.path.join(r, f), "rb").read()).hexdigest()
                       for r, _, fs in os.walk(dataset) for f in fs if not f.startswith("."))
        exact = [sorted(h for part in s for h in part) == truth for s in served]
        print(json.dumps({"opens": opens, "exact": exact, "samples": len(truth), "ranks": per_rank}, default=str))


if __name__ == "__main__":
    main()
