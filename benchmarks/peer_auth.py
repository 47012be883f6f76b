"""Benchmark: what authenticating and encrypting the cluster's peers costs (issue 41).

Two processes, each a rank with the peer service the Loader and the mounts use (cluster/peers.py
over cluster/wire_zmq.py, TCP on loopback): rank 1 serves ``--size``-byte samples from memory, rank
0 fetches them by number, one at a time (``--fetches``; median and p99) and 16 at once from 16
threads (fetches/s). Each round runs twice side by side: CURVE with the job's keys (the default)
and ``CLAIRVOYANT_PEER_AUTH=off`` (plain TCP, as before issue 41); ``--rounds`` rounds alternate
the two, and the median of the rounds is shown with the ratio authenticated / plain.

    python benchmarks/peer_auth.py                 # 110 KB samples (a 256x256 JPEG is 29 KB, ImageNet's ~110 KB)
    python benchmarks/peer_auth.py --size 4096
    PYTHONPATH=<a checkout before issue 41>/src python benchmarks/peer_auth.py --modes plain   # "before"
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import threading
import time

from clairvoyant.cluster.peers import PeerService
from clairvoyant.cluster.wire_zmq import ZmqWire

FILES = 64
try:
    from clairvoyant.cluster.secret import JobSecret
    SECRET = JobSecret(os.urandom(32), "the benchmark")
except ImportError:   # before issue 41: plain only
    SECRET = None


def _wire(rank: int, secret) -> ZmqWire:
    try:
        return ZmqWire(rank, 2, "127.0.0.1", secret=secret)
    except TypeError:   # a checkout from before issue 41 (--modes plain with PYTHONPATH=<it>/src)
        assert secret is None
        return ZmqWire(rank, 2, "127.0.0.1")


def _serve(conn, size: int, secret) -> None:
    payloads = [os.urandom(size) for _ in range(FILES)]
    wire = _wire(1, secret)
    conn.send(wire.address)
    wire.connect([conn.recv(), wire.address])
    svc = PeerService(wire, lambda i: payloads[i % FILES])
    svc.start()
    conn.recv()   # the asking side is done
    svc.close()


def one_round(size: int, fetches: int, auth: bool) -> dict:
    secret = SECRET if auth else None
    ctx = mp.get_context("fork")
    here, there = ctx.Pipe()
    child = ctx.Process(target=_serve, args=(there, size, secret))
    child.start()
    wire = _wire(0, secret)
    peer = here.recv()
    here.send(wire.address)
    wire.connect([wire.address, peer])
    svc = PeerService(wire, lambda i: None)
    svc.start()
    try:
        for i in range(50):   # the connection and its handshake, before the clock
            assert svc.fetch(1, i, size, 10.0) is not None
        lat = []
        for i in range(fetches):
            t0 = time.perf_counter()
            got = svc.fetch(1, i, size, 10.0)
            lat.append(time.perf_counter() - t0)
            assert got is not None and len(got) == size
        done = [0]

        def many(k: int) -> None:
            for i in range(k, fetches, 16):
                if svc.fetch(1, i, size, 10.0) is not None:
                    done[0] += 1
        threads = [threading.Thread(target=many, args=(k,)) for k in range(16)]
        t0 = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        secs = time.perf_counter() - t0
        lat.sort()
        return {"p50_us": lat[len(lat) // 2] * 1e6, "p99_us": lat[int(len(lat) * 0.99)] * 1e6,
                "per_s_16": done[0] / secs, "refused_keys": svc.counters().get("refused_keys", 0)}
    finally:
        here.send(b"done")
        child.join(30)
        svc.close()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size", type=int, default=110_000)
    p.add_argument("--fetches", type=int, default=2000)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--modes", default="curve,plain", help="curve (the default), plain (CLAIRVOYANT_PEER_AUTH=off)")
    p.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results"))
    args = p.parse_args(argv)
    modes = [m for m in ("curve", "plain") if m in args.modes.split(",")]
    runs: dict[str, list[dict]] = {m: [] for m in modes}
    for r in range(args.rounds):
        for name in (modes if r % 2 == 0 else modes[::-1]):
            runs[name].append(one_round(args.size, args.fetches, name == "curve"))
    med = {name: {k: statistics.median(x[k] for x in rs) for k in ("p50_us", "p99_us", "per_s_16")}
           for name, rs in runs.items()}
    ratio = {"p50": med["curve"]["p50_us"] / med["plain"]["p50_us"],
             "per_s_16": med["plain"]["per_s_16"] / med["curve"]["per_s_16"]} if len(modes) == 2 else {}
    print(f"peer fetch of {args.size:,} B over ZeroMQ on loopback, median of {args.rounds} rounds, {os.cpu_count()} CPUs")
    print(f"{'':8} {'p50 us':>8} {'p99 us':>8} {'16 at once /s':>14}")
    for name in modes[::-1]:
        m = med[name]
        print(f"{name:8} {m['p50_us']:8.0f} {m['p99_us']:8.0f} {m['per_s_16']:14,.0f}")
    if ratio:
        print(f"time per fetch, CURVE / plain: {ratio['p50']:.2f}x one at a time, {ratio['per_s_16']:.2f}x 16 at once")
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "peer_auth.json" if len(modes) == 2 else f"peer_auth_{modes[0]}.json")
    with open(path, "w") as f:
        json.dump({"size": args.size, "fetches": args.fetches, "runs": runs, "median": med, "ratio": ratio}, f, indent=1)
    print(json.dumps({"json": path}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
