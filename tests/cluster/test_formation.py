"""How the nodes of a cluster form it, the one way for the Loader's peers and the mounts': the
address each rank is reached by (cluster/formation.py ``peer_host``), the exchange of the services'
addresses (``exchange_addresses``), and a cluster of mounts formed by a job's own ranks over a
launcher's group (mount/cluster/links.py ``ServiceLink.of_group``). Ranks are threads
of this process (tests/cluster/thread_group.py). Each check has a control."""

from __future__ import annotations

import socket
import threading

import pytest

from clairvoyant.cluster import members as formation
from clairvoyant.cluster import wire_zmq
from clairvoyant.errors import ConfigError
from thread_group import ThreadGroup

pytest.importorskip("zmq")


def _hosts(monkeypatch, names: list[str]):
    """Rank r (the thread named rank-r's group's) runs on host ``names[r]``."""
    where = threading.local()
    monkeypatch.setattr(formation.socket, "gethostname", lambda: where.name)

    def on(r: int) -> None:
        where.name = names[r]
    return on


def test_a_loopback_address_is_refused_where_the_ranks_are_on_several_hosts(monkeypatch):
    """peer_host: the route gives 127.0.0.1; with the ranks on two hosts every rank refuses it,
    naming the variable that fixes it, and a rank that sets it gets its address. Control: on one
    host the loopback address is the rank's."""
    real = wire_zmq.reachable_address
    monkeypatch.delenv(wire_zmq.ADDR_VAR, raising=False)
    monkeypatch.setattr(wire_zmq, "reachable_address", lambda toward=None: "127.0.0.1")
    for names, loopback_ok in ((["a", "b"], False), (["a", "a"], True)):
        on = _hosts(monkeypatch, names)

        def rank(g):
            on(g.rank)
            return formation.peer_host(g)
        got = ThreadGroup(2).run(rank)
        if loopback_ok:
            assert got == ["127.0.0.1", "127.0.0.1"], got
        else:
            assert all(isinstance(e, ConfigError) and wire_zmq.ADDR_VAR in str(e) for e in got), got
    monkeypatch.setattr(wire_zmq, "reachable_address", real)   # (the variable is taken as it is)
    monkeypatch.setenv(wire_zmq.ADDR_VAR, "10.1.2.3")   # what the advice says: followed, it works
    on = _hosts(monkeypatch, ["a", "b"])

    def rank(g):
        on(g.rank)
        return formation.peer_host(g)
    assert ThreadGroup(2).run(rank) == ["10.1.2.3", "10.1.2.3"]


def test_the_route_toward_the_rendezvous_or_another_host_is_taken(monkeypatch):
    """peer_host on two hosts: with no MASTER_ADDR (an MPI launch) the route toward the other
    rank's host; with a MASTER_ADDR that routes to loopback here (a name for this host), the same.
    Control: with MASTER_ADDR set to a routed address, its route is taken and no host is asked."""
    monkeypatch.delenv(wire_zmq.ADDR_VAR, raising=False)
    asked = []

    def route(toward=None):
        asked.append(toward)
        return {None: "127.0.1.1", "a": "10.0.0.1", "b": "10.0.0.2", "10.0.0.9": "10.0.0.7",
                "localhost": "127.0.0.1"}[toward]
    monkeypatch.setattr(wire_zmq, "reachable_address", route)
    on = _hosts(monkeypatch, ["a", "b"])

    def rank(g):
        on(g.rank)
        return formation.peer_host(g)
    for master in (None, "localhost"):
        if master is None:
            monkeypatch.delenv("MASTER_ADDR", raising=False)
        else:
            monkeypatch.setenv("MASTER_ADDR", master)
        assert ThreadGroup(2).run(rank) == ["10.0.0.2", "10.0.0.1"], master   # each toward the other's host
    asked.clear()
    monkeypatch.setenv("MASTER_ADDR", "10.0.0.9")
    assert ThreadGroup(2).run(rank) == ["10.0.0.7", "10.0.0.7"] and set(asked) == {"10.0.0.9"}


def test_a_node_whose_link_cannot_start_fails_every_node_at_once(monkeypatch):
    """ServiceLink.of_group: node 0's address lookup fails (an OSError: its host name does not
    resolve): every node raises within seconds, by the one rule of the exchange (as the Loader's
    ranks do): node 0 its own error, node 1 a ConfigError naming node 0; every group is closed.
    Control: the lookup works: both links start."""
    ServiceLink = _job_links(monkeypatch)
    real = formation.peer_host
    for fail in (True, False):
        def host(g):
            if fail and g.rank == 0:
                g.allgather(socket.gethostname().encode(), "the exchange of the nodes' hosts")   # (then the error)
                raise OSError("Name or service not known")
            return real(g)
        monkeypatch.setattr(formation, "peer_host", host)
        group = ThreadGroup(2)

        def rank(g):
            link = ServiceLink.of_group(g)
            link.close()
            return "started"
        got = group.run(rank)
        assert group.closed == {0, 1}
        if fail:
            assert isinstance(got[0], OSError) and "Name or service not known" in str(got[0]), got
            assert isinstance(got[1], ConfigError) and "rank(s) [0]" in str(got[1]), got
        else:
            assert got == ["started", "started"]


def test_a_rank_whose_service_did_not_start_fails_every_rank_at_the_exchange():
    """exchange_addresses: rank 0 could not start its service (its error given): it raises its own
    error, rank 1 a ConfigError naming rank 0; neither waits. Control: both started: the
    addresses, by rank, on both."""
    boom = OSError("address in use")
    got = ThreadGroup(2).run(lambda g: formation.exchange_addresses(g, None if g.rank == 0 else "tcp://b:1",
                                                              boom if g.rank == 0 else None))
    assert got[0] is boom
    assert isinstance(got[1], ConfigError) and "rank(s) [0]" in str(got[1]), got
    got = ThreadGroup(2).run(lambda g: formation.exchange_addresses(g, f"tcp://h{g.rank}:1"))
    assert got == [["tcp://h0:1", "tcp://h1:1"]] * 2


def _job_links(monkeypatch):
    """ServiceLink, with the job's secret set and the peers on the loopback address."""
    from clairvoyant.cluster.secret import SECRET_VAR
    from clairvoyant.mount.cluster.links import ServiceLink
    monkeypatch.setenv(SECRET_VAR, "a test job's secret, long enough")
    monkeypatch.setenv(wire_zmq.ADDR_VAR, "127.0.0.1")
    return ServiceLink


def _started(g, serve, state=None):
    """Node ``g.rank``'s link formed over ``g`` (the files agreed), serving ``serve`` (and ``state``)."""
    from clairvoyant.mount.cluster.links import ServiceLink
    link = ServiceLink.of_group(g)
    try:
        link.agree(bytes(32), "the files")
        link.start(serve, state)
    except BaseException:
        link.close()
        raise
    return link


def test_the_ranks_of_a_job_form_a_cluster_of_mounts_and_read_from_each_other(monkeypatch):
    """ServiceLink.of_group: two ranks (one host) form their links over the group: the nodes'
    fingerprints agree, the addresses are exchanged, and node 1 reads a file of node 0's over
    ZeroMQ, authenticated with the job's secret; closing the link closes the group. Control: the
    fingerprints differ: a ConfigError on both nodes, and nothing was formed."""
    ServiceLink = _job_links(monkeypatch)
    for differ in (False, True):
        group = ThreadGroup(2)

        def rank(g):
            link = ServiceLink.of_group(g)
            try:
                link.agree(bytes([g.rank if differ else 7]) * 32, "the files")
                link.start(lambda n: b"file %d of node %d" % (n, link.node))
                g.allgather(b"", "both serve")   # (a barrier)
                out = link.fetch(1 - link.node, 5, len(b"file 5 of node 0"), 10.0) if link.node == 1 else None
                g.allgather(b"", "both read")
                return link.joins, out
            finally:
                link.close()
        got = group.run(rank)
        assert group.closed == {0, 1}
        if differ:
            assert all(isinstance(e, ConfigError) and "the files differs" in str(e) for e in got), got
        else:
            assert got == [(1, None), (1, b"file 5 of node 0")], got


def test_the_ranks_mounts_find_a_lost_node_the_one_way(monkeypatch):
    """Mounts formed by a job's ranks probe their peers as a mount service does (ServiceLink.probe,
    the one decision that a node is lost): with both nodes serving, node 0's probe finds none
    silent; once node 1's link is closed, node 0's probe names it, and marked lost it is not asked
    again (a fetch returns None at once). Control: the first probe."""
    import time

    _job_links(monkeypatch)
    barrier = threading.Barrier(2)

    def rank(g):
        link = _started(g, lambda n: b"x")
        try:
            barrier.wait(10)
            before = link.probe([1], timeout=1.0) if link.node == 0 else None
            barrier.wait(30)
            if link.node == 1:
                return None
            barrier.wait(30)   # node 1's link is closed now
            after = link.probe([1], timeout=0.5)
            link.mark_lost(after[0])
            t = time.monotonic()
            fetched = link.fetch(1, 0, 1, 5.0)
            return before, after, fetched, time.monotonic() - t, link.lost
        finally:
            link.close()
            if link.node == 1:
                barrier.wait(30)
    got = ThreadGroup(2).run(rank)
    before, after, fetched, took, lost = got[0]
    assert before == ([], [], []), got   # control: both serving
    assert after == ([1], [], []) and fetched is None and took < 0.5 and lost == frozenset({1}), got


def test_a_draining_node_serves_on_but_its_peers_plan_without_it(monkeypatch):
    """A node told to drain (ServiceLink.drain: its node is to be taken back) still serves its
    files, but offers no state (orders, homes) and answers a probe ``DRAINING``: its peer's probe
    counts it lost, and says why. Control: before the drain, the same probe finds nothing and the
    state is offered."""
    _job_links(monkeypatch)
    barrier = threading.Barrier(2)

    def rank(g):
        link = _started(g, lambda n: b"file", lambda n: b"orders")
        try:
            seen = []
            for step in ("before", "after"):
                barrier.wait(30)
                if link.node == 1 and step == "after":
                    link.drain()
                barrier.wait(30)
                if link.node == 0:
                    seen.append((link.probe([1], timeout=1.0), link.fetch(1, 3, 6, 5.0, state=True),
                                 link.fetch(1, 3, 4, 5.0)))
            barrier.wait(30)
            return seen
        finally:
            link.close()
    got = ThreadGroup(2).run(rank)
    (before, state_before, file_before), (after, state_after, file_after) = got[0]
    assert before == ([], [], []) and state_before == b"orders" and file_before == b"file", got   # control
    assert after == ([1], [], [1]) and state_after is None and file_after == b"file", got
    from clairvoyant.plan.membership import why_absent
    assert "draining" in why_absent([1], after) and "answer no probe" not in why_absent([1], after)
