"""Run by tests/cluster/test_stuck_rank.py under ``mpirun -n 3``: three ranks as three "nodes"
(CLAIRVOYANT_NODE), each with a Loader of the job's cluster (``cluster=True``). After making its
Loader, rank 2 stops (``stop``: SIGSTOP, as a debugger, a hung ``__getitem__`` or a swapped-out
process would) or sleeps ``CLAIRVOYANT_GATHER_TIMEOUT / 3`` seconds (``slow``: within the time-out,
the control), then all iterate one epoch.

argv: dataset, workdir, mode (stop or slow), token (only marks the processes). Each of ranks 0 and 1
writes OUTDIR/out-R.json: how its epoch ended ("done" with the samples, or the error's type and
text) and the seconds from its first ``next`` to that end. Then, in ``stop``, they end the job as
the PeerLost's advice says (``comm.Abort()``: Open MPI's MPI_Finalize would wait for rank 2)."""

from __future__ import annotations

import json
import os
import signal
import sys
import time

os.environ["CLAIRVOYANT_NODE"] = "node%s" % os.environ.get("OMPI_COMM_WORLD_RANK", "0")

import numpy as np  # noqa: E402
from mpi4py import MPI  # noqa: E402

from clairvoyant import Loader  # noqa: E402
from clairvoyant.cluster.timeouts import GATHER_TIMEOUT  # noqa: E402

STUCK = 2


def main() -> None:
    dataset, work, mode = sys.argv[1:4]
    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()
    others = comm.Split(int(rank == STUCK))   # made while every rank runs: ranks 0 and 1's own barrier
    ld = Loader(dataset, batch_size=4, local_dir=os.path.join(work, f"l{rank}"), cluster=True, output="numpy",
                decode=lambda b: np.frombuffer(b[:16].ljust(16, b"\0"), np.uint8).copy(), num_workers=1)
    if rank == STUCK:
        if mode == "stop":
            os.kill(os.getpid(), signal.SIGSTOP)
        else:
            time.sleep(GATHER_TIMEOUT / 3)
    t0 = time.monotonic()
    try:
        n = sum(len(y) for _, y in ld)
        out = {"end": "done", "samples": n}
    except Exception as e:   # noqa: BLE001 - the test checks which
        out = {"end": type(e).__name__, "text": str(e)}
    out["seconds"] = time.monotonic() - t0
    if rank != STUCK:
        path = os.path.join(work, f"out-{rank}.json")
        with open(path + ".tmp", "w") as f:
            json.dump(out, f)
        os.replace(path + ".tmp", path)
    ld.close()
    if out["end"] != "done":
        req = others.Ibarrier()   # both have written: then the job ends, as the advice says
        while not req.Test():
            time.sleep(0.01)
        if rank == 0:
            comm.Abort(3)
        time.sleep(60)   # (mpirun ends this rank with the job)
        os._exit(1)


if __name__ == "__main__":
    main()
