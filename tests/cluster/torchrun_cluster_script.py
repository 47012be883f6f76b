"""Run by tests/cluster/test_cluster_torchrun.py under torchrun, one agent per "node" (``--nnodes N
--node-rank I``, c10d rendezvous on this machine): each node (CLAIRVOYANT_NODE from torchrun's
GROUP_RANK) has its own local directory, and all read one emulated store whose counters the
processes share.

argv: dataset, workdir, local_capacity, epochs, cluster ("auto" or "off"), when ("before": the
Loader is made before torch.distributed is initialised, as Lightning does, and finds its peers
through torchrun's agent store; "after": through the process group's store), token (only marks the
processes), and optionally the first epoch (a job restarted at an epoch boundary: epochs first to
first + epochs - 1). With CLAIRVOYANT_TEST_PAUSE (seconds), rank 0 writes ``probe-now`` in the
workdir after the first epoch and every rank waits that long before the next. Rank 0 prints one JSON line: store opens per epoch, whether every epoch served every
sample exactly once with the source's bytes, and each rank's counters.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time

os.environ["CLAIRVOYANT_NODE"] = "node%s" % os.environ["GROUP_RANK"]

import torch.distributed as dist  # noqa: E402

from clairvoyant import Loader  # noqa: E402
from clairvoyant.testing import EmulatedStore  # noqa: E402
from script_util import md5, run_epoch  # noqa: E402


def main() -> None:
    dataset, work, cap, epochs, mode, when = sys.argv[1:7]   # argv[7]: the test's token
    first = int(sys.argv[8]) if len(sys.argv) > 8 else 0
    node = int(os.environ["GROUP_RANK"])
    store = EmulatedStore(dataset, open_latency=0.0, read_latency=0.0, state_dir=os.path.join(work, "emu"))

    def make() -> Loader:
        return Loader(store, batch_size=4, local_dir=os.path.join(work, f"l{node}"), local_capacity=cap,
                      cluster="auto" if mode == "auto" else False, decode=md5, output="numpy", num_workers=1,
                      stage_threads=4)
    ld = make() if when == "before" else None
    dist.init_process_group("gloo")
    ld = ld or make()
    rank, size = dist.get_rank(), dist.get_world_size()
    opens, reads, served = [], [], []
    for e in range(first, first + int(epochs)):
        every, counters = run_epoch(ld, store, e)
        opens.append(counters.opens)
        reads.append(counters.bytes)
        served.append(every)
        pause = float(os.environ.get("CLAIRVOYANT_TEST_PAUSE", "0"))
        if pause and e == first:   # an outsider asks the running job's services meanwhile (tests/outsider.py)
            if rank == 0:
                open(os.path.join(work, "probe-now"), "w").close()
            time.sleep(pause)
    stats = ld.stats()
    ld.close()
    per_rank: list = [None] * size
    dist.all_gather_object(per_rank, {"cluster": stats.get("cluster"), "node": node})
    if rank == 0:
        truth = sorted(hashlib.md5(open(os.path.join(r, f), "rb").read()).hexdigest()
                       for r, _, fs in os.walk(dataset) for f in fs if not f.startswith("."))
        exact = [sorted(h for part in s for h in part) == truth for s in served]
        print(json.dumps({"opens": opens, "bytes": reads, "exact": exact, "samples": len(truth), "ranks": per_rank}, default=str))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
