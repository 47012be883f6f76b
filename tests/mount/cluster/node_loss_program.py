"""One node's training program for tests/mount/cluster/test_mount_node_loss.py: a DataLoader over the
node's share of every shuffled epoch, through the node's mount, with clairvoyant's sampler.

    python node_loss_program.py MNT RANK NODES EPOCHS DIGESTS OUT [FIRST]

Each sample's bytes are checked against DIGESTS (key -> sha256); per epoch one JSON line goes to
OUT: the indices read in order, the sampler's indices, how many had wrong bytes. A progress file
``OUT.at`` says the epoch and the samples read so far (the test kills a node mid-epoch by it)."""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time

from torch.utils.data import DataLoader, Dataset

from clairvoyant.testing import drop_pages
from clairvoyant.torch import DistributedSampler

PACE = float(os.environ.get("NODE_LOSS_PACE", "0.02"))   # seconds of "training" per sample: the epoch
                                                        # lasts long enough to be cut


def main() -> None:
    mnt, rank, nodes, epochs, digests, out = sys.argv[1], *map(int, sys.argv[2:5]), sys.argv[5], sys.argv[6]
    first = int(sys.argv[7]) if len(sys.argv) > 7 else 0   # (epochs first .. epochs - 1)
    with open(digests) as f:
        want = json.load(f)
    keys = sorted(want)

    class Files(Dataset):
        samples = [(os.path.join(mnt, k), 0) for k in keys]   # (the paths the sampler publishes)

        def __len__(self) -> int:
            return len(keys)

        def __getitem__(self, i: int) -> tuple[int, bool]:
            with open(os.path.join(mnt, keys[i]), "rb", buffering=0) as f:
                data = f.read()
            time.sleep(PACE)
            return i, hashlib.sha256(data).hexdigest() == want[keys[i]]

    ds = Files()
    sampler = DistributedSampler(ds, num_replicas=nodes, rank=rank, seed=0, mount=mnt)
    loader = DataLoader(ds, batch_size=4, sampler=sampler, num_workers=0, collate_fn=lambda b: b)
    for e in range(first, epochs):
        sampler.set_epoch(e)
        read, bad = [], 0
        for batch in loader:
            for i, ok in batch:
                read.append(int(i))
                bad += not ok
            with open(out + ".at", "w") as f:
                f.write(f"{e} {len(read)}")
        with open(out, "a") as f:
            f.write(json.dumps({"epoch": e, "read": read, "expected": [int(i) for i in sampler], "bad": bad}) + "\n")
        drop_pages(os.path.join(mnt, k) for k in keys)


if __name__ == "__main__":
    main()
