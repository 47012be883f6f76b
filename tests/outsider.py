"""An outsider beside a running job (issue 41): a process that knows the peer service's wire
format finds the TCP ports the job's processes listen on and asks each, as every rank of the job
in turn, for every sample. What it receives is what the job leaked."""

from __future__ import annotations

import time

import psutil
import zmq

from clairvoyant.cluster.wire import REPLY, REQUEST, REQUEST_MAGIC


def with_word(pids: list[int], word: bytes) -> list[int]:
    """Those of ``pids`` whose command line holds ``word`` (one that ended meanwhile: not)."""
    out = []
    for pid in pids:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if word in f.read():
                    out.append(pid)
        except OSError:
            continue
    return out


def listening_ports(pids: list[int]) -> list[tuple[str, int]]:
    """(address, port) on which the processes ``pids`` listen over TCP."""
    ports = set()
    for pid in pids:
        try:
            for c in psutil.Process(pid).net_connections(kind="tcp"):
                if c.status == psutil.CONN_LISTEN:
                    ports.add(("127.0.0.1" if c.laddr.ip in ("0.0.0.0", "::") else c.laddr.ip, c.laddr.port))
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return sorted(ports)


def speaks_zmtp(where: tuple[str, int]) -> bool:
    """Whether ``port`` greets a connection as ZeroMQ does (its signature's first byte, 0xFF,
    sent at once): the peer service's ports, not the process group's."""
    import socket
    try:
        with socket.create_connection(where, timeout=0.5) as s:
            s.settimeout(0.5)
            return s.recv(1)[:1] == b"\xff"
    except OSError:
        return False


def ask_for_every_sample(ports: list[tuple[str, int]], ranks: int, samples: int, wait: float = 1.5) -> list[bytes]:
    """Connect to every port as every rank of ``ranks`` (plain, and with CURVE keys of its own
    toward a guessed server key), ask for samples 0..samples-1 (up to 1 MB each) and return every
    payload received."""
    ctx = zmq.Context()
    socks = []
    try:
        for host, port in ports:
            for rank in range(ranks):
                for curve in (False, True):
                    d = ctx.socket(zmq.DEALER)
                    d.setsockopt(zmq.IDENTITY, str(rank).encode())
                    d.setsockopt(zmq.LINGER, 0)
                    if curve:
                        d.curve_publickey, d.curve_secretkey = zmq.curve_keypair()
                        d.curve_serverkey = zmq.curve_keypair()[0]
                    socks.append(d)
                    d.connect(f"tcp://{host}:{port}")
                    for i in range(samples):
                        try:
                            d.send(REQUEST.pack(REQUEST_MAGIC, 1 + i, i, 1 << 20), zmq.NOBLOCK)
                        except zmq.Again:   # no connection to queue on (its handshake failed)
                            break
        got: list[bytes] = []
        end = time.monotonic() + wait
        poller = zmq.Poller()
        for d in socks:
            poller.register(d, zmq.POLLIN)
        while time.monotonic() < end:
            for d, _ in poller.poll(100):
                while d.poll(0):
                    msg = d.recv()
                    if len(msg) > REPLY.size:
                        got.append(msg[REPLY.size:])
        return got
    finally:
        for d in socks:
            d.close(0)
        ctx.term()
