"""Run by tests/cluster/test_cluster_elastic.py under torchrun: one agent per "node" of one rank
(``PHYS_NODE``, set by the test for each agent, names its local directory) reading one emulated
store.

argv: dataset, workdir, local_capacity, epochs, lose_at, token (only marks the processes). Every
epoch ends with a checkpoint (the Loader's ``state_dict()``); at the start of epoch ``lose_at``
node 3 is lost (its worker kills its agent, then itself, before anything of that epoch is read),
and the others' workers fail in their next collective. Started again (on 3 nodes), the job resumes
from the checkpoint.
The first rank appends one JSON line per epoch to ``workdir/epochs.jsonl``: the world size, the
store's bytes, whether every sample was served exactly once with the source's bytes.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import sys

PHYS = int(os.environ["PHYS_NODE"])
os.environ["CLAIRVOYANT_NODE"] = f"node{PHYS}"

import torch.distributed as dist  # noqa: E402

from clairvoyant import Loader  # noqa: E402
from clairvoyant.testing import EmulatedStore  # noqa: E402
from script_util import barrier, md5, run_epoch  # noqa: E402


def main() -> None:
    dataset, work, cap, epochs, lose_at = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
    store = EmulatedStore(dataset, open_latency=0.0, read_latency=0.0, state_dir=os.path.join(work, "emu"))
    dist.init_process_group("gloo")
    rank, size = dist.get_rank(), dist.get_world_size()
    ld = Loader(store, batch_size=4, local_dir=os.path.join(work, f"l{PHYS}"), local_capacity=cap, cluster="auto",
                decode=md5, output="numpy", num_workers=1, stage_threads=4)
    ckpt = os.path.join(work, "ckpt.json")
    first = 0
    if os.path.exists(ckpt):
        with open(ckpt) as f:
            state = json.load(f)
        ld.load_state_dict(state)
        first = state["epoch"] + 1
    for e in range(first, epochs):
        if e == lose_at and PHYS == 3:   # this node is lost: its agent and its worker
            os.kill(os.getppid(), signal.SIGKILL)
            os._exit(1)
        every, counters = run_epoch(ld, store, e)
        got = counters.bytes
        if rank == 0:
            truth = sorted(hashlib.md5(open(os.path.join(r, f), "rb").read()).hexdigest()
                           for r, _, fs in os.walk(dataset) for f in fs if not f.startswith("."))
            exact = sorted(h for part in every for h in part) == truth
            with open(os.path.join(work, "epochs.jsonl"), "a") as f:
                f.write(json.dumps({"epoch": e, "world": size, "bytes": got, "exact": exact}) + "\n")
            with open(ckpt + ".tmp", "w") as f:
                json.dump(ld.state_dict(), f)
            os.replace(ckpt + ".tmp", ckpt)
        barrier()
    ld.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
