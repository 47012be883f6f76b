"""Run by tests/mount/test_mount.py under ``mpirun -n 2``: each rank builds clairvoyant's DistributedSampler
with no rank or world size given (they come from the launcher's environment, as PyTorch's come from
its process group), reads its files through the mount and compares them with the source.

    python tests/mount/mpi_mount_script.py MNT SRC TOKEN

Prints one JSON line per rank: rank, world size, the indices it read, files that differed."""

from __future__ import annotations

import json
import os
import sys
import time


def main() -> int:
    mnt, src = sys.argv[1], sys.argv[2]
    from clairvoyant.torch import DistributedSampler

    keys = sorted(os.path.relpath(os.path.join(d, f), src) for d, _, fs in os.walk(src) for f in fs
                  if not f.startswith("."))

    class Folder:
        samples = [(os.path.join(mnt, k), 0) for k in keys]

        def __len__(self) -> int:
            return len(self.samples)

    sampler = DistributedSampler(Folder(), seed=5, mount=mnt)
    time.sleep(0.5)   # both ranks have published before either reads: they step in lockstep
    read, wrong = [], 0
    for i in sampler:
        time.sleep(0.02)   # a training step
        with open(Folder.samples[i][0], "rb") as f, open(os.path.join(src, keys[i]), "rb") as g:
            wrong += f.read() != g.read()
        read.append(int(i))
    print(json.dumps({"rank": sampler.rank, "world": sampler.num_replicas, "read": read, "wrong": wrong}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
