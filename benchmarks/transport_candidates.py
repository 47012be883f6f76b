"""Benchmark: the candidates for the cluster's transport without MPI (issue 32), beside MPI.

One "peer" process serves files of a given size from memory; a second asks for them by number,
as the cluster cache's peer fetch does. For each transport: the latency of one fetch at a time
(median and p99), the throughput with 16 fetches in flight, and what the asking side sees when the
serving process is killed in the middle (an error, a time-out, or a hang).

- ``mpi``: mpi4py point to point (``Isend``/``Irecv`` on tags), under ``mpirun -n 2``, as the
  peer service does today (cluster/peers.py);
- ``zmq``: pyzmq, a ROUTER socket serving, a DEALER asking, over TCP on loopback;
- ``gloo``: torch.distributed's gloo backend, ``isend``/``irecv`` of tensors (a header, then the
  bytes), in a process group of 2 set up through its TCPStore.

Nothing is pickled: every message is raw bytes with a fixed header.

    python benchmarks/transport_candidates.py [--size 110000] [--fetches 2000] [--only zmq,gloo,mpi]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import time

import numpy as np

HEADER = struct.Struct("<qq")   # fetch id, file number (a request); fetch id, size (a reply)
FILES = 64


def _payloads(size: int) -> list[bytes]:
    rng = np.random.default_rng(0)
    return [rng.integers(0, 256, size, dtype=np.uint8).tobytes() for _ in range(FILES)]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _summary(lat: list[float], n: int, seconds: float, size: int) -> dict:
    lat_us = np.asarray(lat) * 1e6
    return {"latency_p50_us": float(np.percentile(lat_us, 50)), "latency_p99_us": float(np.percentile(lat_us, 99)),
            "fetches_per_s_16_in_flight": n / seconds, "mb_per_s_16_in_flight": n * size / seconds / 1e6}


# -- zmq ---------------------------------------------------------------------------------------------

def _zmq_serve(port: int, size: int) -> None:
    import zmq
    files = _payloads(size)
    ctx = zmq.Context()
    s = ctx.socket(zmq.ROUTER)
    s.bind(f"tcp://127.0.0.1:{port}")
    while True:
        ident, msg = s.recv_multipart(copy=False)
        fid, number = HEADER.unpack(msg.bytes)
        if number < 0:
            break
        s.send_multipart([ident, HEADER.pack(fid, size), files[number % FILES]], copy=False)
    s.close(0)
    ctx.term()


def _zmq_client(port: int, size: int, fetches: int, kill) -> dict:
    import zmq
    ctx = zmq.Context()
    s = ctx.socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    s.connect(f"tcp://127.0.0.1:{port}")
    poller = zmq.Poller()
    poller.register(s, zmq.POLLIN)

    def fetch_many(ids) -> None:
        for i in ids:
            s.send(HEADER.pack(i, i), copy=False)
        for _ in ids:
            if not poller.poll(5000):
                raise TimeoutError("no answer in 5 s")
            head, data = s.recv_multipart(copy=False)
            assert HEADER.unpack(head.bytes)[1] == size and len(data) == size

    lat = []
    for i in range(fetches):
        t0 = time.perf_counter()
        fetch_many([i])
        lat.append(time.perf_counter() - t0)
    t0 = time.perf_counter()
    for i in range(0, fetches, 16):
        fetch_many(list(range(i, min(fetches, i + 16))))
    out = _summary(lat, fetches, time.perf_counter() - t0, size)
    kill()   # the peer dies: what does the next fetch see?
    t0 = time.perf_counter()
    try:
        fetch_many([0])
        out["peer_killed"] = "answered (?)"
    except TimeoutError as e:
        out["peer_killed"] = f"the fetch times out ({e}) after {time.perf_counter() - t0:.1f} s; the socket stays usable"
    s.close(0)
    ctx.term()
    return out


def run_zmq(size: int, fetches: int) -> dict:
    port = _free_port()
    ctx = mp.get_context("spawn")
    server = ctx.Process(target=_zmq_serve, args=(port, size), daemon=True)
    server.start()
    try:
        return _zmq_client(port, size, fetches, lambda: (os.kill(server.pid, signal.SIGKILL), server.join()))
    finally:
        if server.is_alive():
            server.kill()


# -- gloo --------------------------------------------------------------------------------------------

def _gloo_rank(rank: int, port: int, size: int, fetches: int, q) -> None:
    import datetime

    import torch
    import torch.distributed as dist
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2,
                            timeout=datetime.timedelta(seconds=10))
    req, head = torch.zeros(2, dtype=torch.int64), torch.zeros(2, dtype=torch.int64)
    if rank == 1:   # the peer that serves
        files = [torch.frombuffer(bytearray(b), dtype=torch.uint8) for b in _payloads(size)]
        while True:
            dist.recv(req, src=0)
            if int(req[1]) < 0:
                break
            head[0], head[1] = req[0], size
            dist.send(head, dst=0)
            dist.send(files[int(req[1]) % FILES], dst=0)
        dist.destroy_process_group()
        return
    buf = torch.empty(size, dtype=torch.uint8)
    bufs = [torch.empty(size, dtype=torch.uint8) for _ in range(16)]
    heads = [torch.zeros(2, dtype=torch.int64) for _ in range(16)]
    lat = []
    for i in range(fetches):
        t0 = time.perf_counter()
        req[0], req[1] = i, i
        dist.send(req, dst=1)
        dist.recv(head, src=1)
        dist.recv(buf, src=1)
        lat.append(time.perf_counter() - t0)
    t0 = time.perf_counter()
    for i in range(0, fetches, 16):
        k = min(16, fetches - i)
        # requests out first (isend: a gloo send waits for its receive), then the answers in order
        sent = [dist.isend(torch.tensor([i + j, i + j], dtype=torch.int64), dst=1) for j in range(k)]
        for j in range(k):
            dist.recv(heads[j], src=1)
            dist.recv(bufs[j], src=1)
        for w in sent:
            w.wait()
    out = _summary(lat, fetches, time.perf_counter() - t0, size)
    q.put(("ready", None))
    time.sleep(1.0)   # the parent kills the peer now
    t0 = time.perf_counter()
    try:
        dist.send(torch.tensor([0, 0], dtype=torch.int64), dst=1)
        dist.recv(head, src=1)
        out["peer_killed"] = "answered (?)"
    except Exception as e:
        out["peer_killed"] = (f"{type(e).__name__} after {time.perf_counter() - t0:.1f} s; the process group is "
                              f"unusable from then on ({str(e).splitlines()[0][:80]})")
    q.put(("result", out))
    q.close()
    q.join_thread()   # (the queue's feeder thread flushes before the exit)
    os._exit(0)   # (the group cannot be torn down with its peer gone)


def run_gloo(size: int, fetches: int) -> dict:
    port = _free_port()
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=_gloo_rank, args=(r, port, size, fetches, q), daemon=True) for r in (0, 1)]
    for p in procs:
        p.start()
    try:
        kind, _ = q.get(timeout=600)
        assert kind == "ready"
        os.kill(procs[1].pid, signal.SIGKILL)
        kind, out = q.get(timeout=120)
        return out
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
            p.join(5)


# -- mpi ---------------------------------------------------------------------------------------------

def _mpi_child(size: int, fetches: int) -> None:
    from mpi4py import MPI
    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()
    if rank == 1:
        files = _payloads(size)
        req = bytearray(HEADER.size)
        while True:
            comm.Recv([req, MPI.BYTE], source=0, tag=1)
            fid, number = HEADER.unpack(req)
            if number < 0:
                return
            comm.Send([HEADER.pack(fid, size) + files[number % FILES], MPI.BYTE], dest=0, tag=2)
    bufs = [bytearray(HEADER.size + size) for _ in range(16)]
    lat = []
    for i in range(fetches):
        t0 = time.perf_counter()
        comm.Send([HEADER.pack(i, i), MPI.BYTE], dest=1, tag=1)
        comm.Recv([bufs[0], MPI.BYTE], source=1, tag=2)
        lat.append(time.perf_counter() - t0)
    t0 = time.perf_counter()
    for i in range(0, fetches, 16):
        k = min(16, fetches - i)
        rs = [comm.Irecv([bufs[j], MPI.BYTE], source=1, tag=2) for j in range(k)]
        for j in range(k):
            comm.Send([HEADER.pack(i + j, i + j), MPI.BYTE], dest=1, tag=1)
        MPI.Request.Waitall(rs)
    out = _summary(lat, fetches, time.perf_counter() - t0, size)
    out["peer_killed"] = ("the job ends (Open MPI aborts every rank when one dies, as issue 33 saw; ULFM's "
                          "--with-ft ulfm reports it to the survivors instead)")
    comm.Send([HEADER.pack(0, -1), MPI.BYTE], dest=1, tag=1)
    print(json.dumps(out), flush=True)


def run_mpi(size: int, fetches: int) -> dict:
    mpirun = shutil.which("mpirun") or os.path.join(os.path.dirname(sys.executable), "mpirun")
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    r = subprocess.run([mpirun, "-n", "2", "--oversubscribe", sys.executable, os.path.abspath(__file__),
                        "--mpi-child", "--size", str(size), "--fetches", str(fetches)],
                       capture_output=True, text=True, timeout=600, env=env)
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("{")]
    if r.returncode != 0 or not lines:
        return {"error": (r.stderr or r.stdout)[-300:]}
    return json.loads(lines[-1])


RUNS = {"mpi": run_mpi, "zmq": run_zmq, "gloo": run_gloo}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size", type=int, default=110_000, help="bytes per file (ImageNet's mean JPEG: about 110 KB)")
    p.add_argument("--fetches", type=int, default=2000)
    p.add_argument("--only", default="mpi,zmq,gloo")
    p.add_argument("--mpi-child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.mpi_child:
        _mpi_child(args.size, args.fetches)
        return 0
    import torch  # noqa: F401  (imported before any clock, as users have it)
    rows = {}
    for name in args.only.split(","):
        try:
            rows[name] = RUNS[name](args.size, args.fetches)
        except ImportError as e:
            rows[name] = {"error": f"not installed: {e}"}
        r = rows[name]
        if "error" in r:
            print(f"{name:5s} {r['error']}")
            continue
        print(f"{name:5s} one at a time: p50 {r['latency_p50_us']:7.0f} us, p99 {r['latency_p99_us']:7.0f} us;  "
              f"16 in flight: {r['fetches_per_s_16_in_flight']:7.0f} fetches/s, {r['mb_per_s_16_in_flight']:6.0f} MB/s;"
              f"  peer killed: {r['peer_killed']}", flush=True)
    print(json.dumps({"size": args.size, "fetches": args.fetches, "rows": rows}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
