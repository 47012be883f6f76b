"""The per-epoch loop the multi-process benchmarks share (cluster.py, simulate_validation.py), run by
every rank under mpirun: all ranks start an epoch together, rank 0 having reset the emulated store's
counters; the epoch's time is taken after the last rank is done."""

from __future__ import annotations

import time


def timed_epochs(comm, loader, store, epochs: int) -> list[tuple[int, float, int, int]]:
    """``(epoch, seconds, peer bytes summed over the ranks (0 on ranks other than 0), store bytes)``
    for each epoch."""
    out = []
    for e in range(epochs):
        comm.Barrier()
        if comm.Get_rank() == 0:
            store.reset()
        comm.Barrier()
        loader.set_epoch(e)
        t0 = time.perf_counter()
        for _ in loader:
            pass
        comm.Barrier()
        dt = time.perf_counter() - t0
        peer = comm.reduce(loader.stats()["epochs"].get(e, {}).get("peer_bytes", 0), root=0)
        out.append((e, dt, peer or 0, store.counters().bytes))
    return out
