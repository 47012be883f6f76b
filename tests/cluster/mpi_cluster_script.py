"""Run by tests/cluster/test_cluster.py under ``mpirun -n N``: each rank is its own "node" (CLAIRVOYANT_NODE),
with its own local directory, all reading one emulated store whose counters the processes share.

argv: dataset, workdir, local_capacity, epochs, cluster (on/off), scenario, token (only marks the
processes). Scenarios plain, corrupt-wire, corrupt-entry, compress (the tiers compress with zlib: the
wire carries their entries), compress-corrupt (and every kept entry is damaged after epoch 0): rank 0
prints one JSON line: store opens per
epoch, whether every epoch served every sample exactly once with the source's bytes, and each rank's
per-epoch counters.

Scenarios steady, kill and slow (:func:`faults`; two epochs, cluster on, staging only 2 batches ahead
and a short training step, so that epoch 1 still needs its peers when one fails): rank 2 SIGKILLs
itself after 3 batches of epoch 1 (kill: run it with ``mpirun --with-ft ulfm``), or rank 1's replies
are held back past the peer deadline from epoch 1 on (slow), or nothing happens (steady, the control).
Every rank that lives writes OUTDIR/out/rank-N.json itself (a dead rank cannot take the others' results
with it): its samples of each epoch as md5s, those its share of the epoch's order should hold (read
from the files), its epoch times and its counters. No collective call over the job's communicator
follows the start of epoch 1. With CLAIRVOYANT_TEST_PAUSE (seconds) rank 0 writes OUTDIR/probe-now after
epoch 0 and every rank waits that long before epoch 1."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import sys
import time
import traceback

import numpy as np

os.environ["CLAIRVOYANT_NODE"] = "node%s" % os.environ.get("OMPI_COMM_WORLD_RANK", os.environ.get("PMI_RANK", "0"))

from mpi4py import MPI  # noqa: E402

from clairvoyant import Loader  # noqa: E402
from clairvoyant.cluster import peers  # noqa: E402
from clairvoyant.cluster.job import PEER_TIMEOUT  # noqa: E402
from clairvoyant.plan.order import epoch_order  # noqa: E402
from clairvoyant.plan.partition import rank_indices  # noqa: E402
from clairvoyant.testing import EmulatedStore  # noqa: E402

VICTIM, KILL_AFTER = 2, 3   # kill: this rank dies after yielding this many batches of epoch 1
SLOW, SLOW_BY = 1, PEER_TIMEOUT + 1.0   # slow: this rank's replies leave this many seconds late
STEP = 0.03   # seconds of "training" per batch in the fault scenarios


def md5(b: bytes) -> np.ndarray:
    return np.frombuffer(hashlib.md5(b).digest(), np.uint8).copy()


def wait_all(comm) -> None:
    """A barrier that sleeps instead of spinning (4 ranks share 2 cores)."""
    req = comm.Ibarrier()
    while not req.Test():
        time.sleep(0.002)


def share(ld: Loader, dataset: str, epoch: int, rank: int, world_size: int) -> list[str]:
    """md5s of the files of this rank's share of the epoch's order, read from the data set itself."""
    order = epoch_order(len(ld.manifest), ld.seed, epoch, ld.shuffle)
    out = []
    for i in rank_indices(order, rank, world_size):
        with open(os.path.join(dataset, ld.manifest.keys[int(i)]), "rb") as f:
            out.append(hashlib.md5(f.read()).hexdigest())
    return out


def faults(dataset: str, work: str, cap: str, scenario: str) -> None:
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    dies = scenario == "kill" and rank == VICTIM
    survivors = comm.Split(int(dies))   # made while everyone lives: the survivors' own barrier at the end
    store = EmulatedStore(dataset, open_latency=0.0, read_latency=0.0, state_dir=os.path.join(work, "emu"))
    ld = Loader(store, batch_size=4, local_dir=os.path.join(work, f"l{rank}"), local_capacity=cap, cluster=True,
                ram_dir=os.path.join(work, f"ram{rank}"),   # a killed rank leaves its RAM tier behind: not in /dev/shm
                decode=md5, output="numpy", num_workers=1, stage_threads=4, lookahead=2)
    out: dict = {"rank": rank, "epoch_s": [], "waits": [], "yielded": [], "expected": []}
    os.makedirs(os.path.join(work, "out"), exist_ok=True)
    for e in range(2):
        wait_all(comm)   # the last call over the whole job: every epoch starts together
        if scenario == "slow" and e == 1 and rank == SLOW:
            peers.DELAY_REPLIES = SLOW_BY
        ld.set_epoch(e)
        got, waits = [], []
        t0 = t = time.monotonic()
        for k, (x, _) in enumerate(ld):
            waits.append(time.monotonic() - t)
            got += [bytes(row).hex() for row in np.asarray(x)]
            if dies and e == 1 and k + 1 == KILL_AFTER:
                with open(os.path.join(work, "out", "victim.json"), "w") as f:
                    json.dump({"killed_at": time.time()}, f)
                os.kill(os.getpid(), signal.SIGKILL)
            time.sleep(STEP)   # a training step
            t = time.monotonic()
        out["epoch_s"].append(time.monotonic() - t0)
        out["waits"].append(waits)
        out["yielded"].append(got)
        out["expected"].append(share(ld, dataset, e, rank, size))
        pause = float(os.environ.get("CLAIRVOYANT_TEST_PAUSE", "0"))
        if pause and e == 0:   # an outsider asks the running job meanwhile (tests/outsider.py)
            if rank == 0:
                open(os.path.join(work, "probe-now"), "w").close()
            time.sleep(pause)
    out["finished_at"] = time.time()
    if scenario == "kill":   # the next epoch needs every rank: a clear error, not a hang or a raw MPI one
        ld.set_epoch(2)
        try:
            next(iter(ld))
            out["next_epoch"] = "started"
        except Exception as e:   # noqa: BLE001 - the test checks which
            out["next_epoch"] = f"{type(e).__name__}: {e}"
        print(f"rank {rank}: next epoch: {out['next_epoch'][:40]}", file=sys.stderr, flush=True)
    stats = ld.stats()
    out.update(epochs={str(k): v for k, v in stats["epochs"].items()}, tiers=stats["tiers"],
               cluster=stats.get("cluster"))
    wait_all(survivors)   # no one stops serving while another survivor still reads
    ld.close()
    if scenario == "kill":
        print(f"rank {rank}: closed", file=sys.stderr, flush=True)
    path = os.path.join(work, "out", f"rank-{rank}.json")
    with open(path + ".tmp", "w") as f:
        json.dump(out, f, default=str)
    os.replace(path + ".tmp", path)
    if scenario == "kill":   # as docs/user-guide.md advises after PeerLost: Open MPI's MPI_Finalize can
        wait_all(survivors)  # wait forever for the dead rank under ULFM (open-mpi/ompi#11404; 3 runs in 18
        sys.stderr.flush()   # here), so the survivors end without it, once every one has written
        os._exit(0)


def main() -> None:
    dataset, work, cap, epochs, mode, scenario = sys.argv[1:7]   # argv[7]: the test's token
    if scenario in ("steady", "kill", "slow"):
        try:
            faults(dataset, work, cap, scenario)
        except BaseException:
            if scenario != "kill":
                raise
            traceback.print_exc()   # a survivor that failed: a failure, not a hang in MPI_Finalize
            sys.stderr.flush()
            os._exit(1)
        return
    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()
    store = EmulatedStore(dataset, open_latency=0.0, read_latency=0.0, state_dir=os.path.join(work, "emu"))
    ld = Loader(store, batch_size=4, local_dir=os.path.join(work, f"l{rank}"), local_capacity=cap,
                cluster=mode == "on", decode=md5, output="numpy", num_workers=1, stage_threads=4,
                # off: each rank alone on its "node" (the launcher would say 4 ranks share one)
                local_world_size=None if mode == "on" else 1,
                compress="zlib" if scenario in ("compress", "compress-corrupt") else None)
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
        if scenario in ("corrupt-entry", "compress-corrupt") and e == 0:   # flip a byte in every entry kept
            for row in ld.store.index.present():
                path = ld.store.extent_path(int(row["extent"]))
                # (compressed: a byte amid the stream, past its header, so that only the checksum can tell)
                at = int(row["offset"]) + (int(row["length"]) // 2 if scenario == "compress-corrupt" else 0)
                with open(path, "r+b") as f:
                    f.seek(at)
                    b = f.read(1)
                    f.seek(at)
                    f.write(bytes([b[0] ^ 0x40]))
        comm.Barrier()
        opens.append(store.counters().opens)
        served.append(comm.gather(mine, root=0))
    stats = ld.stats()
    ld.close()
    per_rank = comm.gather({"epochs": {str(k): v for k, v in stats["epochs"].items()}, "tiers": stats["tiers"],
                            "cluster": stats.get("cluster"), "ratio": ld.compress_ratio}, root=0)
    if rank == 0:
        truth = sorted(hashlib.md5(open(os.path.join(r, f), "rb").read()).hexdigest()
                       for r, _, fs in os.walk(dataset) for f in fs if not f.startswith("."))
        exact = [sorted(h for part in s for h in part) == truth for s in served]
        print(json.dumps({"opens": opens, "exact": exact, "samples": len(truth), "ranks": per_rank}, default=str))


if __name__ == "__main__":
    main()
