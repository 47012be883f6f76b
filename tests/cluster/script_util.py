"""What the torchrun scripts of tests/cluster share: a sample's digest as its decoded value, and a
barrier that waits without spinning."""

from __future__ import annotations

import hashlib
import time

import numpy as np
import torch.distributed as dist


def md5(b: bytes) -> np.ndarray:
    return np.frombuffer(hashlib.md5(b).digest(), np.uint8).copy()


def barrier() -> None:
    work = dist.barrier(async_op=True)
    while not work.is_completed():
        time.sleep(0.002)   # (4 ranks share 2 cores: no spinning)
    work.wait()   # (raises if a peer was lost)


def run_epoch(ld, store, epoch: int) -> tuple[list, object]:
    """Epoch ``epoch`` of the Loader ``ld``, the store's counters reset at its start (by rank 0,
    between barriers): every rank's samples (their digests, hex) and the store's counters after it."""
    rank, size = dist.get_rank(), dist.get_world_size()
    barrier()
    if rank == 0:
        store.reset()
    barrier()
    ld.set_epoch(epoch)
    mine = [bytes(row).hex() for x, _ in ld for row in np.asarray(x)]
    barrier()
    counters = store.counters()
    every: list = [None] * size
    dist.all_gather_object(every, mine)   # (the test's own results, between its own processes)
    return every, counters
