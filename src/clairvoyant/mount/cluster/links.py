"""MECHANISM: the links by which the mounts of a cluster's nodes reach each other (mount/cluster/node.py).

A link is a :class:`ClusterLink`: the node's number, the peers found lost, ``agree``, ``start``,
``fetch`` (a file, or a piece of a node's state: its orders, its homes), ``probe``, ``mark_lost``,
``counters`` and ``close``. :class:`ServiceLink` is a node's mount service's, started
by the process a launcher runs (mount/cluster/member.py): peers over ZeroMQ, their addresses given each time
a launcher forms the cluster, so that the mount outlives its launcher; :class:`PeerLink` joins
mounts that live in the ranks of an MPI job (``PeerLink.node_leaders``) over the cluster's one
transport (cluster/job.py); :class:`LoopbackLink` joins mounts of one process (tests). Before
anything is mounted the nodes check that they number the same files alike
(:func:`files_fingerprint`).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import threading
import time
from typing import Any, Callable, Protocol

from ...errors import ConfigError
from ...nodeio.fileio import process_alive
from ...plan.membership import LEAVE, UNMOUNT
from ...tune.counters import Counters
from ...cluster.timeouts import GATHER_TIMEOUT, PROBE_WAIT

log = logging.getLogger("clairvoyant")
ALIVE = 1 << 62   # the piece of a node's state that says it serves (a probe; orders and homes are below)


class ClusterLink(Protocol):
    """What the cluster of mounts (mount/cluster/node.py) asks of the link between its nodes."""

    node: int
    nodes: int
    lost: frozenset[int]   # peers the cluster went on without (not asked until it forms again)
    was_lost: bool         # a node was lost since the homes were last planned with every node

    def agree(self, fingerprint: bytes, what: str) -> None: ...

    def start(self, serve: Callable[[int], bytes | None], state: Callable[[int], bytes | None] | None = None) -> None: ...

    def fetch(self, peer: int, number: int, size: int, timeout: float, state: bool = False) -> bytes | None: ...

    def probe(self, peers: list[int] | None = None, timeout: float = PROBE_WAIT) -> tuple[list[int], list[int]]:
        """(the peers that did not answer, those whose member ended without a word)."""

    def mark_lost(self, peers: list[int]) -> None: ...

    def counters(self) -> dict: ...

    def close(self) -> None: ...


class _NoProbe:
    """A link whose lost peers its transport reports (MPI's faults) or that has none (one process):
    no probe of its own, nothing marked lost."""

    lost: frozenset[int] = frozenset()
    was_lost = False

    def probe(self, peers: list[int] | None = None, timeout: float = PROBE_WAIT) -> tuple[list[int], list[int]]:
        return [], []

    def mark_lost(self, peers: list[int]) -> None:
        pass


def files_fingerprint(manifest) -> bytes:
    """32 bytes that differ when two nodes' manifests number files differently (a file is asked for
    by its number): every key and size, in order."""
    digest = hashlib.sha256()
    for i in range(len(manifest)):
        digest.update(manifest.keys[i].encode() + b"\0" + int(manifest.sizes[i]).to_bytes(8, "little"))
    return digest.digest()


class ServiceLink:
    """Node ``node`` of ``nodes``: the link of a mount service (mount/cluster/member.py) whose peers'
    addresses the member process gives, over its control socket (``control``: a path), each time
    a launcher forms the cluster. The peer reads go over ZeroMQ (cluster/wire_zmq.py) bound on
    ``host``; nothing of the launcher's (MPI, torchrun's store) is used here, so the mount goes on
    serving when its launcher, or a peer, is gone. ``member_pid``: the member that started it."""

    def __init__(self, node: int, nodes: int, host: str, control: str, member_pid: int, secret) -> None:
        import zmq

        from ...cluster.wire_zmq import ZmqWire
        from ...cluster.secret import key_id
        self.node, self.nodes = int(node), int(nodes)
        self.member = int(member_pid)
        self._wire = ZmqWire(self.node, self.nodes, host, secret=secret)
        self._secret_id = key_id(secret)
        self._service = None
        self._fingerprint: bytes | None = None
        self._addresses: list[str] = []
        self._joined = threading.Event()
        self._join_error: str | None = None
        self.joins = 0
        self.asked: str | None = None    # what the member last asked: "leave" (its launcher ends it) or "unmount"
        self.asked_event = threading.Event()
        self.described: dict = {}         # the mount's description, once mounted (the member's hello)
        self.serving_on = False           # it went on serving after its launcher ended it (a node was lost)
        self.lost: frozenset[int] = frozenset()   # peers found lost (not asked until the cluster forms again)
        self.was_lost = False            # a node was lost since the homes were last planned whole
        self._state_lock = threading.Lock()   # what the member asked, the joins, the lost: the control
                                              # thread and the service's loop both change them
        self.control = control
        self.info = {"control": control}  # (in the mount's description: a member started later finds it)
        self._ctx = zmq.Context(io_threads=1)
        self._rep = self._ctx.socket(zmq.REP)
        self._rep.setsockopt(zmq.LINGER, 0)
        try:
            self._rep.bind(f"ipc://{control}")
            os.chmod(control, 0o600)   # the control socket: this user's alone (it hands the service joins)
        except BaseException:
            self._ctx.destroy(linger=0)
            self._wire.shut_down(0.0, set())
            raise
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._answer, name="clairvoyant-member", daemon=True)
        self._thread.start()

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
            return {"node": self.node, "nodes": self.nodes, "pid": os.getpid(), "address": self._wire.address,
                    "fingerprint": self._fingerprint.hex() if self._fingerprint else None,
                    "mounted": self.described or None, "joins": self.joins, "serving_on": self.serving_on,
                    "member": self.member, "secret": self._secret_id}
        if op == "join":
            addresses = msg.get("addresses")
            error = msg.get("error")
            if error is None and (not isinstance(addresses, list) or len(addresses) != self.nodes
                                  or not all(isinstance(a, str) for a in addresses)):
                return {"error": f"a join gives {self.nodes} addresses"}
            if error is not None:
                self._join_error = str(error)
                self._joined.set()
                return {"ok": True, "joins": self.joins}
            changed = {p for p, a in enumerate(addresses) if p < len(self._addresses) and a != self._addresses[p]}
            with self._state_lock:
                self.member = int(msg.get("member", self.member))
                self._addresses = list(addresses)
                self._wire.connect(self._addresses)
                if self._service is not None:
                    self._service.forgive(changed)
                self.joins += 1
                if self.asked != UNMOUNT:
                    self.asked = None
                self.serving_on, self.lost = False, frozenset()
                if self.joins > 1:
                    print(f"clairvoyant: node {self.node} rejoined a cluster of {self.nodes} mounts (formed again "
                          f"by a launcher; {len(changed)} node(s) at new addresses)", flush=True)
            self._joined.set()
            return {"ok": True, "joins": self.joins}
        if op in (LEAVE, UNMOUNT):
            with self._state_lock:
                if self.asked != UNMOUNT:   # (an unmount asked is never taken back)
                    self.asked = op
            self.asked_event.set()
            return {"ok": True}
        return {"error": f"unknown request {op!r}"}

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
            self.lost = self.lost | frozenset(lost)
            self.was_lost = self.was_lost or bool(lost)
            return True

    def mark_lost(self, peers: list[int]) -> None:
        """``peers`` found lost by the cluster itself (no orders, no answer to two probes)."""
        with self._state_lock:
            self.lost = self.lost | frozenset(peers)
            self.was_lost = True

    def _alive_answer(self) -> bytes:
        """The answer to a probe: 1, serving with its member (or told by it to leave: the job's end),
        2, serving after its member ended without a word (a member lost, its node's mount not)."""
        with self._state_lock:
            leaving = self.asked is not None
        return b"\x01" if leaving or self.member_alive() else b"\x02"

    # -- the link ---------------------------------------------------------------------------------

    def agree(self, fingerprint: bytes, what: str) -> None:
        """Tell the member ``fingerprint`` and wait for its word: every node's was the same (the
        peers' addresses), or not (a ConfigError saying which differ)."""
        self._fingerprint = bytes(fingerprint)
        deadline = time.monotonic() + GATHER_TIMEOUT
        while not self._joined.wait(0.2):
            if not self.member_alive():
                raise ConfigError(f"node {self.node}'s launcher process ended before the nodes agreed on {what}")
            if time.monotonic() > deadline:
                raise ConfigError(f"the nodes did not agree on {what} within {GATHER_TIMEOUT:.0f} s")
        if self._join_error is not None:
            raise ConfigError(self._join_error)

    def start(self, serve: Callable[[int], bytes | None], state: Callable[[int], bytes | None] | None = None) -> None:
        from ...cluster.peers import PeerService

        def answer(number: int) -> bytes | None:
            if number == ALIVE:
                return self._alive_answer()
            return state(number) if state is not None else None
        self._service = PeerService(self._wire, serve, state=answer, serve_threads=8, idle_max=2e-4)
        self._service.start()

    def fetch(self, peer: int, number: int, size: int, timeout: float, state: bool = False) -> bytes | None:
        if self._service is None or peer in self.lost:
            return None
        got = self._service.fetch(peer, number, size, timeout, state=state)
        return got if got is not None and len(got) == size else None

    def probe(self, peers: list[int] | None = None, timeout: float = PROBE_WAIT) -> tuple[list[int], list[int]]:
        """Ask ``peers`` (default: every other node, lost ones too) at once, twice for those that do
        not answer the first time within ``timeout`` seconds: (those that never answered, those
        whose member ended without a word while their mount serves on)."""
        import concurrent.futures
        peers = [p for p in range(self.nodes) if p != self.node] if peers is None else list(peers)
        got: dict[int, bytes | None] = {}
        for _ in range(2):
            ask = [p for p in peers if got.get(p) is None]
            if not ask or self._service is None:
                break
            with concurrent.futures.ThreadPoolExecutor(len(ask)) as pool:
                for p, g in zip(ask, pool.map(lambda p: self._service.fetch(p, ALIVE, 1, timeout, state=True,
                                                                           urgent=True), ask)):
                    got[p] = g
        return ([p for p in peers if got.get(p) is None], [p for p in peers if got.get(p) == b"\x02"])

    def counters(self) -> dict:
        return {} if self._service is None else self._service.counters()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        if self._service is not None:
            self._service.close()
        else:
            self._wire.shut_down(0.0, set())
        self._rep.close(0)
        self._ctx.term()
        try:
            os.unlink(self.control)
        except OSError:
            pass


class PeerLink(_NoProbe):
    """The mounts of a job's nodes, one per node, living in the job's own processes, over the
    cluster's one transport (cluster/job.py ``transport``): MPI under an MPI launcher (or over
    ``comm``: ``node_leaders``), torchrun's store and ZeroMQ under torchrun. (``clairvoyant mount
    --cluster`` uses a ServiceLink instead, so that the mount outlives its launcher.)"""

    def __init__(self, comm: Any = None) -> None:
        from ...cluster import job as cluster, peers
        self._peers, self._cluster = peers, cluster
        try:
            self._group, self._on = cluster.transport(comm)
        except ConfigError as e:
            raise ConfigError(f"a cluster of mounts: {e}; start one process per node with mpirun --map-by "
                              "ppr:1:node, or torchrun --nnodes N --nproc-per-node 1 (docs/mount.md)") from None
        self.node, self.nodes = self._group.rank, self._group.size
        self._service = None

    @classmethod
    def node_leaders(cls, comm: Any = None) -> "PeerLink | None":
        """For the ranks of an MPI training job that mount the data themselves (collective over
        ``comm``, COMM_WORLD by default): the link of the nodes' first ranks, each to mount for its
        node (``Mount(..., cluster=link)``), or None on every other rank (it reads through its
        node's mount). Nodes are told apart by ``CLAIRVOYANT_NODE`` or the host name."""
        from mpi4py import MPI

        from ...cluster.group import node_groups
        from ...cluster.topology import node_name
        comm = comm if comm is not None else MPI.COMM_WORLD
        groups = node_groups(comm, node_name())
        rank = comm.Get_rank()
        leader = any(g[0] == rank for g in groups)
        sub = comm.Split(0 if leader else MPI.UNDEFINED, rank)
        return cls(sub) if leader else None

    def agree(self, fingerprint: bytes, what: str) -> None:
        """Collective: a ConfigError on every node unless all nodes' fingerprints are the same."""
        from ...cluster.group import agree
        agree(self._group, fingerprint, what)

    def abort(self, code: int) -> None:
        """End the job (a node that cannot start: the others would wait for it in the start's
        exchanges). Under MPI, MPI_Abort; under torchrun this process's error exit does it (the
        agent ends every node's workers)."""
        comm = getattr(self._group, "comm", None)
        if comm is not None:
            comm.Abort(code)

    def start(self, serve: Callable[[int], bytes | None], state: Callable[[int], bytes | None] | None = None) -> None:
        # a program waits on each peer read: the service looks for messages every 200 us when idle
        self._service = self._peers.PeerService(self._on, serve, state=state, serve_threads=8, idle_max=2e-4)
        self._service.start()

    def fetch(self, peer: int, number: int, size: int, timeout: float, state: bool = False) -> bytes | None:
        """``size`` bytes exactly from ``peer`` (the service's answer may be shorter), or None:
        file ``number``, or (``state``) piece ``number`` of the peer's state."""
        got = None if self._service is None else self._service.fetch(peer, number, size, timeout, state=state)
        return got if got is not None and len(got) == size else None

    def counters(self) -> dict:
        return {} if self._service is None else self._service.counters()

    def close(self) -> None:
        self._cluster.close_transport(self._group, self._on, self._service)


class LoopbackLink(_NoProbe):
    """Mounts of one process joined directly (tests and the benchmark's single-process runs): node
    ``node`` of a ``hub`` (a dict shared by the nodes' links, node -> serve)."""

    def __init__(self, hub: dict, node: int, nodes: int) -> None:
        self.hub, self.node, self.nodes = hub, node, nodes
        self._c = Counters(["peer"]).space("peer")   # tune/counters.py's peer.*

    def agree(self, fingerprint: bytes, what: str) -> None:
        """Mounts of one process list the same source: nothing to compare across processes."""
        self.hub.setdefault("fingerprints", {})[self.node] = fingerprint
        if len(set(self.hub["fingerprints"].values())) > 1:
            raise ConfigError(f"{what} differs across the nodes of this hub: mount the same source")

    def start(self, serve: Callable[[int], bytes | None], state: Callable[[int], bytes | None] | None = None) -> None:
        self.hub[self.node] = (serve, state)

    def fetch(self, peer: int, number: int, size: int, timeout: float, state: bool = False) -> bytes | None:
        answer = self.hub.get(peer, (None, None))[int(state)]
        self._c.add("fetches")
        got = answer(number) if answer is not None else None
        got = got if got is not None and len(got) == size else None
        self._c.add("hits" if got is not None else "misses")
        return got

    def counters(self) -> dict:
        return self._c.snapshot()

    def close(self) -> None:
        self.hub.pop(self.node, None)
