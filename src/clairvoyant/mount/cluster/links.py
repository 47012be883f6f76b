"""MECHANISM: the links by which the mounts of a cluster's nodes reach each other (mount/cluster/node.py).

A link is a :class:`ClusterLink`: the node's number, the peers found lost, ``agree``, ``start``,
``fetch`` (a file, or a piece of a node's state: its orders, its homes), ``probe``, ``mark_lost``,
``readmit``, ``counters`` and ``close``. :class:`ServiceLink` is the mount's door on the job's one
membership object (cluster/members.py ``Members``: the wire, the peer service over ZeroMQ, the lost
set, the probe, close), formed the one way over a launcher's group (the nodes exchange their
services' addresses, cluster/members.py ``exchange_addresses``, and agree that they number the same
files alike, by their manifests' fingerprint, cluster/group.py ``agree``): in the member process a
launcher runs, for a node's mount service that outlives it (mount/cluster/member.py; the service's
control socket, by which its member hands it each formation, is the link's own part), or in the
ranks of a job that mount the data themselves (``ServiceLink.of_group``, ``node_leaders``).
:class:`clairvoyant.testing.LoopbackLink` joins mounts of one process (tests).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
import time
from typing import Any, Callable, Protocol

from ...errors import ConfigError
from ...nodeio.fileio import process_alive
from ...plan.membership import DRAIN, DRAINING, LEAVE, ORPHANED, SERVING, UNMOUNT, Probed
from ...cluster.timeouts import GATHER_TIMEOUT, PROBE_WAIT

log = logging.getLogger("clairvoyant")


class ClusterLink(Protocol):
    """What the cluster of mounts (mount/cluster/node.py) asks of the link between its nodes."""

    node: int
    nodes: int
    lost: frozenset[int]   # peers the cluster went on without (not asked until it forms again)
    was_lost: bool         # a node was lost since the homes were last planned with every node

    def agree(self, fingerprint: bytes, what: str) -> None: ...

    def start(self, serve: Callable[[int], bytes | None], state: Callable[[int], bytes | None] | None = None) -> None: ...

    def fetch(self, peer: int, number: int, size: int, timeout: float, state: bool = False) -> bytes | None: ...

    def probe(self, peers: list[int] | None = None, timeout: float = PROBE_WAIT) -> Probed:
        """plan/membership.py's decision from a probe of ``peers`` (default: every other node)."""

    def mark_lost(self, peers: list[int]) -> None: ...

    def readmit(self, peers: list[int]) -> None: ...

    def counters(self) -> dict: ...

    def close(self) -> None: ...


class ServiceLink:
    """A node of a cluster of mounts on the job's one membership object (``members``,
    cluster/members.py: the wire, the peer service, the lost set, the probe, close), with what a
    mount adds: the files agreed, the probe's answer (serving, orphaned, draining), and, for a
    node's mount service, its control socket. Formed one way (module docstring), in one of two
    places:

    - a mount service's (``control``: the path of its control socket): the member process a
      launcher runs (mount/cluster/member.py, pid ``member_pid``) forms the cluster and gives the
      peers' addresses over that socket, each time a launcher forms it; nothing of the launcher's
      is used here, so the mount goes on serving when its launcher, or a peer, is gone;
    - a job's own ranks' (``members.group``: the launcher's group of one rank per node,
      :meth:`of_group`, :meth:`node_leaders`): formed over that group in process (the wire started
      and the addresses exchanged by ``Members.of_group``, the files agreed in ``agree``).
    """

    def __init__(self, members, *, secret_id: str | None = None, control: str | None = None,
                 member_pid: int | None = None) -> None:
        self.members = members
        self.node, self.nodes = members.rank, members.size
        self.member = os.getpid() if member_pid is None else int(member_pid)
        self._secret_id = secret_id   # (the member checks it is its job's: cluster/secret.py ``key_id``)
        self._fingerprint: bytes | None = None
        self._joined = threading.Event()
        self._join_error: str | None = None
        self.joins = 0
        self.asked: str | None = None    # what the member last asked: "leave" (its launcher ends it) or "unmount"
        self.asked_event = threading.Event()
        self.described: dict = {}         # the mount's description, once mounted (the member's hello)
        self.serving_on = False           # it went on serving after its launcher ended it (a node was lost)
        self.draining = False            # told to drain: serving until it goes, planned without by its peers
        self._state_lock = threading.Lock()   # what the member asked, the joins: the control thread and the
                                              # service's loop both change them
        self.control = control
        self.info = {"control": control} if control else {}   # (in the mount's description: a member
        self._stop = threading.Event()                           # started later finds it)
        self._thread: threading.Thread | None = None
        if control is None:
            return
        import zmq
        self._ctx = zmq.Context(io_threads=1)
        self._rep = self._ctx.socket(zmq.REP)
        self._rep.setsockopt(zmq.LINGER, 0)
        try:
            self._rep.bind(f"ipc://{control}")
            os.chmod(control, 0o600)   # the control socket: this user's alone (it hands the service joins)
        except BaseException:
            self._ctx.destroy(linger=0)
            self.members.close()
            raise
        self._thread = threading.Thread(target=self._answer, name="clairvoyant-member", daemon=True)
        self._thread.start()

    @property
    def lost(self) -> frozenset[int]:
        return self.members.lost

    @property
    def was_lost(self) -> bool:
        return self.members.was_lost

    @was_lost.setter
    def was_lost(self, value: bool) -> None:
        self.members.was_lost = bool(value)

    @classmethod
    def of_group(cls, group) -> "ServiceLink":
        """The link of a job's ranks that are one node each (collective over ``group``: the
        launcher's, cluster/members.py ``rendezvous``): the members formed now, the Loader's way
        (cluster/members.py ``Members.of_group``: where a node's wire cannot start, every node raises,
        none waits), the files agreed by the mount's ``agree``. The link closes ``group``."""
        from ...cluster.members import Members
        return cls(Members.of_group(group))   # (no control socket: nothing fails)

    @classmethod
    def node_leaders(cls, comm: Any = None) -> "ServiceLink | None":
        """For the ranks of an MPI training job that mount the data themselves (collective over
        ``comm``, COMM_WORLD by default): the link of the nodes' first ranks, each to mount for its
        node (``Mount(..., cluster=link)``), or None on every other rank (it reads through its
        node's mount). Nodes are told apart by ``CLAIRVOYANT_NODE`` or the host name."""
        from mpi4py import MPI

        from ...cluster.group import node_groups
        from ...cluster.members import rendezvous
        from ...cluster.topology import node_name
        comm = comm if comm is not None else MPI.COMM_WORLD
        rank = comm.Get_rank()
        leader = any(g[0] == rank for g in node_groups(comm, node_name()))
        sub = comm.Split(0 if leader else MPI.UNDEFINED, rank)
        if not leader:
            return None
        group = rendezvous(sub)   # (the one group constructor: MPI's, on its own duplicate of ``sub``)
        sub.Free()
        return cls.of_group(group)

    # -- the member's requests (JSON over the control socket; never pickled) ------------------

    def _answer(self) -> None:
        import zmq
        while not self._stop.is_set():
            if not self._rep.poll(100):
                continue
            try:
                msg = json.loads(self._rep.recv())
                reply = self._handle(msg if isinstance(msg, dict) else {})
            except Exception as e:   # noqa: BLE001 - a bad request is answered, never the end of the thread
                reply = {"error": f"{type(e).__name__}: {e}"}
            try:
                self._rep.send(json.dumps(reply).encode())
            except zmq.ZMQError:
                pass

    def _handle(self, msg: dict) -> dict:
        op = msg.get("op")
        if op == "hello":
            return {"node": self.node, "nodes": self.nodes, "pid": os.getpid(), "address": self.members.wire.address,
                    "fingerprint": self._fingerprint.hex() if self._fingerprint else None,
                    "mounted": self.described or None, "joins": self.joins, "serving_on": self.serving_on,
                    "member": self.member, "secret": self._secret_id}
        if op == "join":
            addresses, error = msg.get("addresses"), msg.get("error")
            if error is not None:   # the formation failed: ``agree`` raises it
                self._join_error = str(error)
                self._joined.set()
            elif isinstance(addresses, list) and len(addresses) == self.nodes and all(isinstance(a, str)
                                                                                     for a in addresses):
                self._join(addresses, int(msg.get("member", self.member)))
            else:
                return {"error": f"a join gives {self.nodes} addresses"}
            return {"ok": True, "joins": self.joins}
        if op == DRAIN:
            self.drain()
            return {"ok": True}
        if op in (LEAVE, UNMOUNT):
            with self._state_lock:
                if self.asked != UNMOUNT:   # (an unmount asked is never taken back)
                    self.asked = op
            self.asked_event.set()
            return {"ok": True}
        return {"error": f"unknown request {op!r}"}

    def _join(self, addresses: list[str], member: int) -> None:
        """The cluster formed (again): connect to the peers at ``addresses``; nothing is lost now."""
        with self._state_lock:
            self.member = member
            changed = self.members.join(addresses)
            self.joins += 1
            if self.asked != UNMOUNT:
                self.asked = None
            self.serving_on = False
            if self.joins > 1:
                print(f"clairvoyant: node {self.node} rejoined a cluster of {self.nodes} mounts (formed again "
                      f"by a launcher; {len(changed)} node(s) at new addresses)", flush=True)
        self._joined.set()

    def member_alive(self) -> bool:
        return process_alive(self.member)   # (a zombie its launcher has not reaped yet is gone)

    def leave_asked(self) -> int | None:
        """The joins so far if the member asked to leave (and nothing since), else None."""
        with self._state_lock:
            return self.joins if self.asked == LEAVE else None

    def still_leaving(self, joins: int) -> bool:
        """Whether no join came since the leave taken at ``joins`` (nor was the leave taken back)."""
        with self._state_lock:
            return self.joins == joins and self.asked in (LEAVE, UNMOUNT)

    def serve_on(self, joins: int, lost: list[int]) -> bool:
        """After a leave taken at ``joins``: serve on without ``lost``, unless a join came meanwhile
        (the cluster formed again: nothing lost) or an unmount was asked. Whether it did."""
        with self._state_lock:
            if self.joins != joins or self.asked == UNMOUNT:
                return False
            self.asked, self.serving_on = None, True
            self.members.mark_lost(lost)
            return True

    def mark_lost(self, peers: list[int]) -> None:
        """``peers`` found lost by the cluster itself (no orders, no answer to two probes)."""
        self.members.mark_lost(peers)

    def readmit(self, peers: list[int]) -> None:
        """``peers`` found lost answer a probe again (mount/cluster/node.py ``recheck_lost``): asked
        again from now on, and planned with (``was_lost`` stays: the homes of the whole cluster
        are taken again)."""
        self.members.readmit(peers)

    def drain(self) -> None:
        """This node is to be taken back (a preemption notice): it serves on until it goes, but
        offers no orders and answers a probe ``DRAINING``, so its peers plan without it from the
        next epoch (plan/membership.py)."""
        self.draining = True
        log.warning("clairvoyant: node %d drains: it serves its peers until it goes; they plan without it", self.node)

    def _alive_answer(self) -> bytes:
        """The answer to a probe: ``DRAINING`` once told to drain; ``SERVING`` with its member (or
        told by it to leave: the job's end), ``ORPHANED`` after its member ended without a word (a
        member lost, its node's mount not)."""
        with self._state_lock:
            leaving = self.asked is not None
        if self.draining:
            return DRAINING
        return SERVING if leaving or self.member_alive() else ORPHANED

    # -- the link ---------------------------------------------------------------------------------

    def agree(self, fingerprint: bytes, what: str) -> None:
        """Agree over the job's group (the addresses were exchanged: ``of_group``), or tell the member
        ``fingerprint`` and wait for its word: every node's was the same (the peers' addresses), or
        not (a ConfigError on every node saying which differ)."""
        self._fingerprint = bytes(fingerprint)
        group = self.members.group
        if group is not None:
            from ...cluster.group import agree
            agree(group, self._fingerprint, what)
            self._join(self.members.peers, self.member)
            return
        deadline = time.monotonic() + GATHER_TIMEOUT
        while not self._joined.wait(0.2):
            if not self.member_alive():
                raise ConfigError(f"node {self.node}'s launcher process ended before the nodes agreed on {what}")
            if time.monotonic() > deadline:
                raise ConfigError(f"the nodes did not agree on {what} within {GATHER_TIMEOUT:.0f} s")
        if self._join_error is not None:
            raise ConfigError(self._join_error)

    def start(self, serve: Callable[[int], bytes | None], state: Callable[[int], bytes | None] | None = None) -> None:
        offered = None if state is None else (lambda n: None if self.draining else state(n))   # (none draining)
        self.members.start(serve, state=offered, serve_threads=8, idle_max=2e-4, alive=self._alive_answer)

    def fetch(self, peer: int, number: int, size: int, timeout: float, state: bool = False) -> bytes | None:
        got = self.members.fetch(peer, number, size, timeout, state=state)
        return got if got is not None and len(got) == size else None

    def probe(self, peers: list[int] | None = None, timeout: float = PROBE_WAIT) -> Probed:
        """plan/membership.py's decision from the one probe of ``peers`` (default: every other node,
        lost ones too: cluster/peers.py ``PeerService.probe``): those lost, those whose member ended
        without a word while their mount serves on, those draining."""
        return self.members.probe(peers, timeout)

    def counters(self) -> dict:
        return self.members.counters()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
        self.members.close()
        if self.control is None:
            return
        self._rep.close(0)
        self._ctx.term()
        with contextlib.suppress(OSError):
            os.unlink(self.control)
