"""One scenario of the peer service, run by tests/cluster/test_peers.py under ``mpirun -n 4``.

Usage: ``mpi_peers_script.py SCENARIO OUTDIR TOKEN``. Each rank writes what it saw as
JSON to OUTDIR/rank-N.json (no rank's results travel over MPI, so a dead rank
cannot take the others' with it); TOKEN only marks the processes, so the test
can tell that none is left behind.
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing as mp
import os
import pickle
import random
import signal
import sys
import threading
import time
import traceback
import warnings

import numpy as np
from mpi4py import MPI

from clairvoyant.cluster import peers
from clairvoyant.errors import ConfigError

N = 400   # samples 0..N-1 are staged on rank i % size; N..N+49 nowhere


def content(i: int) -> bytes:
    return random.Random(i).randbytes(64 + (i * 7919) % 30000)


def staged(rank: int, size: int) -> dict[int, bytes]:
    return {i: content(i) for i in range(N) if i % size == rank}


def wait_all(comm) -> None:
    """A barrier that sleeps instead of spinning (4 ranks share 2 cores)."""
    req = comm.Ibarrier()
    while not req.Test():
        time.sleep(0.002)


def timed_fetch(svc: peers.PeerService, peer: int, i: int, timeout: float, size: int = -1):
    t = time.monotonic()
    got = svc.fetch(peer, i, len(content(i)) if size < 0 else size, timeout)
    return got, time.monotonic() - t


def finish(svc: peers.PeerService, out: dict) -> dict:
    """Record the service's counters, then close it and record how long closing took."""
    out["counters"] = svc.counters()
    t = time.monotonic()
    svc.close()
    out["close_s"] = time.monotonic() - t
    return out


def exchange(comm) -> dict:
    """Every rank fetches from every other rank at once, from 8 threads."""
    rank, size = comm.Get_rank(), comm.Get_size()
    svc = peers.PeerService(comm, staged(rank, size).get, max_inflight=16, max_bytes=256 << 10)
    svc.start()
    wait_all(comm)
    jobs = [(i % size, i, True) for i in range(N) if i % size != rank]
    jobs += [(p, i, False) for i in range(N, N + 50) for p in [i % size] if p != rank]   # nobody has these
    jobs += [((i + 1) % size, i, False) for i in range(0, N, 37) if (i + 1) % size != rank]   # the wrong rank
    seen = {"right": 0, "wrong_bytes": 0, "missing": 0, "misses": 0, "false_hits": 0}
    lock = threading.Lock()

    def work(part):
        for peer, i, there in part:
            got = svc.fetch(peer, i, len(content(i)), 30.0)
            key = ("right" if got == content(i) else "wrong_bytes" if got is not None else "missing") if there \
                else ("misses" if got is None else "false_hits")
            with lock:
                seen[key] += 1

    threads = [threading.Thread(target=work, args=(jobs[k::8],)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    peer, i = next((p, i) for p, i, there in jobs if there)
    seen["wrong_size_none"] = svc.fetch(peer, i, len(content(i)) - 1, 10.0) is None   # negative control
    wait_all(comm)   # everyone is done asking: stop serving
    seen["expected_hits"] = sum(there for *_, there in jobs)
    seen["jobs"] = len(jobs) + 1
    return finish(svc, seen)


def corrupt(comm) -> dict:
    """Rank 1 flips a bit of sample 1's payload after taking its checksum; rank 0 asks for it."""
    rank, size = comm.Get_rank(), comm.Get_size()
    svc = peers.PeerService(comm, staged(rank, size).get)
    svc.start()
    if rank == 1:
        peers.CORRUPT_ON_SEND.add(1)
    wait_all(comm)
    out: dict = {}
    if rank == 0:
        out["corrupted"] = svc.fetch(1, 1, len(content(1)), 5.0)
        out["other_ok"] = svc.fetch(1, 5, len(content(5)), 5.0) == content(5)
    wait_all(comm)
    if rank == 1:
        peers.CORRUPT_ON_SEND.clear()
    wait_all(comm)
    if rank == 0:   # negative control: the same fetch without the hook
        out["clean_ok"] = svc.fetch(1, 1, len(content(1)), 5.0) == content(1)
    wait_all(comm)
    out["counters"] = svc.counters()
    svc.close()
    return out


def slow(comm) -> dict:
    """Rank 1 takes 1.5 s to serve sample 1; rank 0 waits 0.5 s for it, then asks again at once (rank 1
    is passed over), and again once the pass-over has ended."""
    rank, size = comm.Get_rank(), comm.Get_size()
    mine = staged(rank, size)

    def serve(i):
        if i == 1:
            time.sleep(1.5)
        return mine.get(i)

    svc = peers.PeerService(comm, serve)
    svc.start()
    wait_all(comm)
    out: dict = {}
    if rank == 0:
        got, out["slow_s"] = timed_fetch(svc, 1, 1, 0.5)
        out["slow_none"] = got is None
        got, out["passed_s"] = timed_fetch(svc, 1, 5, 5.0)
        out["passed_none"], out["slow_peers"] = got is None, svc.counters()["slow_peers"]
        time.sleep(peers.PASS_OVER * 0.5 + 0.2)   # the late reply arrives meanwhile; the pass-over ends
        got, out["after_s"] = timed_fetch(svc, 1, 5, 5.0)
        out["after_ok"] = got == content(5)
        out["again_ok"] = svc.fetch(1, 1, len(content(1)), 5.0) == content(1)   # slow, but within 5 s
    wait_all(comm)
    out["counters"] = svc.counters()
    svc.close()
    return out


def blocking(comm) -> dict:
    """Rank 1's serve of sample 1 blocks until it has served sample 3 (a home reading the store for
    a peer). Rank 0 asks for 1 (from a thread), then for 3. With serve threads both come back; with
    none (the control) the service thread is stuck in serve(1): 3 times out, and so does 1."""
    rank, size = comm.Get_rank(), comm.Get_size()
    mine = staged(rank, size)
    out: dict = {}
    for threads in (2, 0):
        released = threading.Event()

        def serve(i, released=released):
            if i == 1:
                released.wait(3.0)
            elif i == 3:
                released.set()
            return mine.get(i)

        svc = peers.PeerService(comm, serve, serve_threads=threads)
        svc.start()
        wait_all(comm)
        if rank == 0:
            first: list = []
            t = threading.Thread(target=lambda: first.append(svc.fetch(1, 1, len(content(1)), 5.0)))
            t.start()
            time.sleep(0.2)   # its request is in
            got, secs = timed_fetch(svc, 1, 3, 1.5)
            t.join()
            out[str(threads)] = {"three_ok": got == content(3), "one_ok": first[0] == content(1), "three_s": secs}
        wait_all(comm)
        finish(svc, {})
    return out


def dead(comm) -> dict:
    """Rank 3 SIGKILLs itself on the first request it gets, while the others' requests to it are in
    flight; they go on asking it, then close (run with --with-ft ulfm)."""
    rank, size = comm.Get_rank(), comm.Get_size()
    survivors = comm.Split(0 if rank < 3 else 1)
    mine = staged(rank, size)

    def serve(i):
        if rank == 3:
            os.kill(os.getpid(), signal.SIGKILL)
        return mine.get(i)

    svc = peers.PeerService(comm, serve)
    svc.start()
    wait_all(comm)
    if rank == 3:
        time.sleep(30)   # until a request comes
    times, results = [], []

    def ask(i):
        got, dt = timed_fetch(svc, 3, i, 1.0)
        results.append(got)
        times.append(dt)

    threads = [threading.Thread(target=ask, args=(i,)) for i in (3, 7, 11, 15, 19, 23)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    peer = (rank + 1) % 3
    i = next(i for i in range(N) if i % size == peer)
    out = {"all_none": all(r is None for r in results), "max_s": max(times),
           "live_ok": svc.fetch(peer, i, len(content(i)), 5.0) == content(i)}
    deadline = time.monotonic() + 5.0   # MPI tells of the failure in its own time
    while 3 not in svc.counters()["dead_peers"] and time.monotonic() < deadline:
        svc.fetch(3, 3, len(content(3)), 0.2)
    out["detected"] = 3 in svc.counters()["dead_peers"]
    out["after_detect_s"] = timed_fetch(svc, 3, 3, 1.0)[1]
    wait_all(survivors)
    return finish(svc, out)


def link(comm) -> dict:
    """Two services per rank on 2 ranks: one plain, one on an emulated link of 100 ms and 1 MB/s
    (from the environment); rank 0 fetches from rank 1 through each."""
    rank, size = comm.Get_rank(), comm.Get_size()
    mine = staged(rank, size)
    plain = peers.PeerService(comm, mine.get, latency=0.0, bandwidth=0.0, tag_base=7100)
    os.environ[peers.LATENCY_VAR], os.environ[peers.BANDWIDTH_VAR] = "0.1", "1e6"
    svc = peers.PeerService(comm, mine.get)
    plain.start()
    svc.start()
    wait_all(comm)
    out: dict = {"link": [svc.latency, svc.bandwidth], "plain_link": [plain.latency, plain.bandwidth]}
    if rank == 0:
        theirs = [i for i in range(N) if i % size == 1]
        wire = lambda i: peers.REPLY.size + len(content(i))   # noqa: E731  (the reply's bytes on the link)
        got, out["plain_s"] = timed_fetch(plain, 1, theirs[0], 5.0)
        out["plain_ok"] = got == content(theirs[0])
        got, out["one_s"] = timed_fetch(svc, 1, theirs[0], 5.0)
        out["one_ok"], out["one_bytes"] = got == content(theirs[0]), wire(theirs[0])
        many = theirs[1:9]
        results: dict[int, bytes | None] = {}
        threads = [threading.Thread(target=lambda i=i: results.__setitem__(i, svc.fetch(1, i, len(content(i)), 5.0)))
                   for i in many]
        t = time.monotonic()
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        out["many_s"] = time.monotonic() - t
        out["many_ok"] = all(results[i] == content(i) for i in many)
        out["many_bytes"] = sum(wire(i) for i in many)
    wait_all(comm)
    finish(plain, {})
    return finish(svc, out)


def stuck(comm) -> dict:
    """Rank 3 never starts its service (alive, but deaf); the others ask it twice, then close."""
    rank, size = comm.Get_rank(), comm.Get_size()
    svc = peers.PeerService(comm, staged(rank, size).get)
    if rank != 3:
        svc.start()
    wait_all(comm)
    out: dict = {}
    if rank != 3:
        results = [timed_fetch(svc, 3, i, 0.5) for i in (3, 7)]
        out = {"all_none": all(got is None for got, _ in results), "times": [dt for _, dt in results]}
        t = time.monotonic()
        svc.close()
        out["close_s"] = time.monotonic() - t
        out["counters"] = svc.counters()
    wait_all(comm)
    svc.close()
    return out


class Bomb:
    """Unpickling this creates a file: proof that a peer unpickled what it was sent."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        return open, (self.path, "w")


def pickled(comm, outdir: str) -> dict:
    """Rank 1 sends rank 0's service pickles and other foreign messages on its own tags."""
    rank, size = comm.Get_rank(), comm.Get_size()
    svc = peers.PeerService(comm, staged(rank, size).get)
    svc.start()
    wait_all(comm)
    marker = os.path.join(outdir, "unpickled")
    out: dict = {}
    if rank == 1:
        svc.comm.send(Bomb(marker), dest=0, tag=7000)       # pickled, on the request tag
        svc.comm.send(Bomb(marker), dest=0, tag=7001)       # pickled, on the reply tag
        svc.comm.Send(bytearray(peers.REQUEST.size), dest=0, tag=7000)       # right size, no magic
        svc.comm.Send(np.zeros(1 << 20, np.uint8), dest=0, tag=7001)        # 1 MiB of nothing as a reply
        svc.comm.Send(bytearray(b"x" * 10), dest=0, tag=12345)              # a tag the service does not use
    if rank == 0:
        deadline = time.monotonic() + 10.0
        while svc.counters()["refused"] < 5 and time.monotonic() < deadline:
            time.sleep(0.01)
        out["from_1_ok"] = svc.fetch(1, 5, len(content(5)), 5.0) == content(5)
    if rank == 1:
        out["from_0_ok"] = svc.fetch(0, 4, len(content(4)), 5.0) == content(4)
    wait_all(comm)
    out["unpickled"] = os.path.exists(marker)
    if rank == 0:   # negative control: the bomb goes off when unpickled
        pickle.loads(pickle.dumps(Bomb(marker + "-control")))
        out["control_went_off"] = os.path.exists(marker + "-control")
    out["counters"] = svc.counters()
    svc.close()
    return out


def agreement(comm) -> dict:
    """agree() on equal and unequal fingerprints; node_groups() on three layouts."""
    rank = comm.Get_rank()
    out: dict = {}
    peers.agree(comm, hashlib.sha256(b"same").digest(), "the seed")   # negative control: no error
    try:
        peers.agree(comm, hashlib.sha256(b"odd" if rank == 2 else b"same").digest(), "the seed")
        out["disagreement"] = None
    except ConfigError as e:
        out["disagreement"] = str(e)
    layouts = {"blocks": f"node-{rank // 2}", "stripes": f"node-{rank % 2}", "own": "nœud" + "x" * rank}
    for key, name in layouts.items():
        os.environ["CLAIRVOYANT_NODE"] = name
        out[key] = peers.node_groups(comm, peers.node_name())
    return out


def _child() -> None:
    """Numpy work, then a plain return: multiprocessing ends a fork child with os._exit, so the
    child never runs mpi4py's MPI_Finalize (which, in a forked child, hangs the job)."""
    a = np.random.default_rng(0).random((300, 300))
    if not np.isfinite((a @ a).sum()):
        raise SystemExit(3)


def forked(comm) -> dict:
    """A reader-style child forked from an MPI process with the service running; it never calls MPI."""
    rank, size = comm.Get_rank(), comm.Get_size()
    svc = peers.PeerService(comm, staged(rank, size).get)
    svc.start()
    wait_all(comm)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        children = [mp.get_context("fork").Process(target=_child) for _ in range(2)]
        for c in children:
            c.start()
        for c in children:
            c.join(30)
    peer = (rank + 1) % size
    i = next(i for i in range(N) if i % size == peer)
    out = {"exitcodes": [c.exitcode for c in children], "warnings": [str(w.message) for w in caught],
           "fetch_ok": svc.fetch(peer, i, len(content(i)), 10.0) == content(i)}
    wait_all(comm)
    svc.close()
    return out


def main() -> None:
    scenario, outdir = sys.argv[1], sys.argv[2]
    comm = MPI.COMM_WORLD
    run = {"exchange": exchange, "corrupt": corrupt, "slow": slow, "dead": dead, "stuck": stuck, "agree": agreement,
           "fork": forked, "link": link, "blocking": blocking, "pickle": lambda c: pickled(c, outdir)}[scenario]
    try:
        result = run(comm)
    except Exception:
        result = {"error": traceback.format_exc()}
    path = os.path.join(outdir, f"rank-{comm.Get_rank()}.json")
    with open(path + ".tmp", "w") as f:
        json.dump(result, f)
    os.replace(path + ".tmp", path)
    if scenario == "dead":   # a survivor of a dead rank: Open MPI's MPI_Finalize can wait forever for it
        os._exit(0)          # under ULFM (open-mpi/ompi#11404), so end as docs/user-guide.md advises


if __name__ == "__main__":
    main()
