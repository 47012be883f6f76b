"""The peer service over ZeroMQ (cluster/wire_zmq.py), the backend of jobs without MPI: services of
one process joined on loopback. Each check has a control."""

from __future__ import annotations

import os
import threading
import time

import pytest

zmq = pytest.importorskip("zmq")

from clairvoyant.cluster import peers  # noqa: E402
from clairvoyant.cluster.peers import PeerService  # noqa: E402
from clairvoyant.cluster.wire import REPLY, REQUEST, REQUEST_MAGIC  # noqa: E402
from clairvoyant.cluster.secret import JobSecret, rank_keys  # noqa: E402
from clairvoyant.cluster.wire_zmq import ZmqWire  # noqa: E402

SECRET = JobSecret(b"0123456789abcdef-the-tests-secret", "the tests")


def _services(n: int, serve, state=None, secret=SECRET, **kw) -> list[PeerService]:
    wires = [ZmqWire(r, n, "127.0.0.1", secret=secret) for r in range(n)]
    for w in wires:
        w.connect([x.address for x in wires])
    out = [PeerService(w, serve(r), state=None if state is None else state(r), **kw) for r, w in enumerate(wires)]
    for s in out:
        s.start()
    return out


def _peer_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("clairvoyant-peers")]


def test_fetches_over_zeromq_return_the_served_bytes_and_misses():
    """Every fetch returns the serving rank's bytes, verified; an index it lacks is a miss. Control:
    the bytes of another rank's sample differ."""
    data = {r: {i: os.urandom(500 + i) for i in range(r * 50, (r + 1) * 50)} for r in range(3)}
    svcs = _services(3, lambda r: data[r].get)
    try:
        for i in range(50, 150):
            r = i // 50
            assert svcs[0].fetch(r, i, 10_000, 5.0) == data[r][i]
        assert svcs[0].fetch(1, 5, 10_000, 5.0) is None            # rank 1 does not hold 5
        assert svcs[0].fetch(1, 60, 10_000, 5.0) != data[2][110]   # control
        c = svcs[0].counters()
        assert c["hits"] == 101 and c["misses"] == 1 and c["timeouts"] == 0, c
    finally:
        for s in svcs:
            s.close()
    assert _peer_threads() == []


def test_a_request_for_state_is_a_kind_of_its_own():
    """A fetch of a node's state is answered by its state callback, never by its samples' serve,
    and a sample's fetch never by the state. Control: the same number asked as a sample gets the
    sample."""
    svcs = _services(2, lambda r: (lambda i: b"sample%d" % i), lambda r: (lambda i: b"state%d" % i))
    try:
        assert svcs[0].fetch(1, 7, 100, 5.0, state=True) == b"state7"
        assert svcs[0].fetch(1, 7, 100, 5.0) == b"sample7"   # control
    finally:
        for s in svcs:
            s.close()
    bare = _services(2, lambda r: (lambda i: b"sample%d" % i))   # no state callback: state requests miss
    try:
        assert bare[0].fetch(1, 7, 100, 5.0, state=True) is None
        assert bare[0].fetch(1, 7, 100, 5.0) == b"sample7"
    finally:
        for s in bare:
            s.close()


def test_corrupt_bytes_and_foreign_messages_are_refused(monkeypatch):
    """A payload flipped after its checksum is dropped (a miss for the caller, counted); messages
    that are not ours (wrong magic, wrong size, a pickle) are refused unread. Control: the next
    clean fetch succeeds."""
    monkeypatch.setattr(peers, "CORRUPT_ON_SEND", {3})
    svcs = _services(3, lambda r: (lambda i: b"x" * 1000))   # rank 2 never asks rank 1: the intruder is "2"
    try:
        assert svcs[0].fetch(1, 3, 2000, 5.0) is None
        assert svcs[0].counters()["bad_checksum"] == 1
        ctx = zmq.Context()
        d = _dealer(ctx, svcs[1].wire.address, b"2", rank_keys(SECRET, 2), rank_keys(SECRET, 1)[0])   # rank 2's key
        d.send(REQUEST.pack(b"NOTOURS!", 1, 2, 3))               # right size, wrong magic
        d.send(b"\x80\x04\x95" + b"p" * 40)                      # a pickle's opening, wrong size
        d.send(REQUEST.pack(REQUEST_MAGIC, 9, 4, 1000))          # a real request: answered
        assert d.poll(5000) and len(d.recv()) > 1000
        time.sleep(0.2)
        d.close()
        ctx.term()
        assert svcs[1].counters()["refused"] == 2, svcs[1].counters()
        assert svcs[0].fetch(1, 4, 2000, 5.0) == b"x" * 1000      # control
    finally:
        for s in svcs:
            s.close()


def _dealer(ctx, address: str, ident: bytes, keys=None, server_key=None):
    """A DEALER that speaks for rank ``ident``: with CURVE ``keys`` (public, secret) toward a server
    of ``server_key``, or none."""
    d = ctx.socket(zmq.DEALER)
    d.setsockopt(zmq.IDENTITY, ident)
    d.setsockopt(zmq.LINGER, 0)
    if keys is not None:
        d.curve_serverkey = server_key
        d.curve_publickey, d.curve_secretkey = keys
    d.connect(address)
    return d


def _asks_for_every_sample(address: str, ident: bytes, keys=None, server_key=None, n: int = 20) -> list[bytes]:
    """An outsider that knows the wire: asks ``address`` for samples 0..n-1 as rank ``ident``; what
    it received (each answer's payload)."""
    ctx = zmq.Context()
    d = _dealer(ctx, address, ident, keys, server_key)
    try:
        for i in range(n):
            d.send(REQUEST.pack(REQUEST_MAGIC, 100 + i, i, 10_000))
        got, end = [], time.monotonic() + 1.5
        while time.monotonic() < end:
            if d.poll(100):
                got.append(d.recv()[REPLY.size:])
        return got
    finally:
        d.close()
        ctx.term()


def test_an_outsider_receives_no_sample():
    """A process that knows the wire format and the ranks' identities, beside the job's services,
    asks for every sample: without a key, with a key from another secret (toward the real
    server's public key), and with a rank's real key but another rank's identity. It receives no
    sample; the handshakes are refused and counted, the claimed identity refused unread; the job
    still serves its own ranks. Control: with authentication off the outsider gets every sample."""
    data = {i: b"sample-%03d" % i * 50 for i in range(20)}
    svcs = _services(3, lambda r: data.get)
    try:
        target, server_key = svcs[0].wire.address, rank_keys(SECRET, 0)[0]
        other = JobSecret(b"another-secret-of-another-job!!", "a guess")
        assert _asks_for_every_sample(target, b"1") == []
        assert _asks_for_every_sample(target, b"1", rank_keys(other, 1), server_key) == []
        assert _asks_for_every_sample(target, b"1", rank_keys(SECRET, 2), server_key) == []   # rank 2 as rank 1
        c = svcs[0].counters()
        assert c["refused_keys"] >= 2 and c["refused"] == 20 and c["served"] == 0, c
        assert svcs[1].fetch(0, 7, 10_000, 5.0) == data[7]   # the job's own ranks are served
    finally:
        for s in svcs:
            s.close()
    assert _peer_threads() == []
    open_svcs = _services(3, lambda r: data.get, secret=None)   # control: nothing authenticated
    try:
        got = _asks_for_every_sample(open_svcs[0].wire.address, b"1")
        assert sorted(got) == sorted(data.values())
        assert open_svcs[0].counters()["refused_keys"] == 0
    finally:
        for s in open_svcs:
            s.close()


def test_a_dead_peer_costs_one_time_out_then_is_passed_over():
    """A peer whose service is gone: the first fetch times out, the next ones return at once
    (passed over), the service goes on with the others. Control: a live peer still answers."""
    svcs = _services(3, lambda r: (lambda i: b"y" * 100))
    try:
        svcs[2].close()
        t0 = time.monotonic()
        assert svcs[0].fetch(2, 1, 200, 0.5) is None
        assert 0.4 < time.monotonic() - t0 < 2.0
        t0 = time.monotonic()
        assert svcs[0].fetch(2, 1, 200, 0.5) is None
        assert time.monotonic() - t0 < 0.1
        assert svcs[0].counters()["passed_over"] == 1
        assert svcs[0].fetch(1, 1, 200, 5.0) == b"y" * 100   # control
    finally:
        for s in svcs:
            s.close()
    assert _peer_threads() == []


def test_one_probe_tells_who_serves_and_a_closed_peer_is_lost():
    """``PeerService.probe``: every peer serving answers ``SERVING`` (or what its ``alive`` says),
    even one passed over; a closed peer answers neither ask and plan/membership.py finds it lost.
    The asks count as probes, not fetches. Controls: before the close, no peer is lost; a fetch
    counts as a fetch."""
    from clairvoyant.plan.membership import ORPHANED, SERVING, probed
    services = _services(3, lambda r: (lambda i: None))
    try:
        services[2]._alive = lambda: ORPHANED   # (a mount whose member ended without a word)
        services[0]._passed[1] = time.monotonic() + 60   # passed over: a probe asks all the same
        got = services[0].probe([1, 2], timeout=2.0)
        assert got == {1: SERVING, 2: ORPHANED}, got
        assert probed([1, 2], got) == ([], [2], [])   # control: none lost
        services[1].close()
        before = services[0].counters()
        t = time.monotonic()
        got = services[0].probe([1, 2], timeout=0.3)
        assert probed([1, 2], got) == ([1], [2], []), got
        assert time.monotonic() - t < 2.0   # two asks of 0.3 s at most
        after = services[0].counters()   # a probe's asks are not fetches: their outcomes count nowhere else
        assert after["probes"] == before["probes"] + 3, after
        assert all(after[k] == before[k] for k in ("fetches", "timeouts", "failed", "hits", "misses")), after
        services[0].fetch(1, 0, 1, 0.3)   # control: a fetch of the closed peer counts as one
        assert services[0].counters()["fetches"] == before["fetches"] + 1
    finally:
        for s in services:
            s.close()
