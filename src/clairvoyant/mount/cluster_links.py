"""MECHANISM: the links by which the mounts of a cluster's nodes reach each other (mount/cluster.py).

A link has ``node``, ``nodes``, ``agree(fingerprint, what)``, ``start(serve, state)``, ``fetch(peer,
number, size, timeout, state=False)`` (a file, or a piece of a node's state: its orders, its
homes), ``counters()`` and ``close()``. :class:`PeerLink` joins one mount per node over the
cluster's one transport (dist/cluster.py: MPI under ``mpirun``, torchrun's store and ZeroMQ under
``torchrun --no-python clairvoyant mount``); :class:`LoopbackLink` joins mounts of one process
(tests). Before anything is mounted the nodes check that they number the same files alike
(:func:`files_fingerprint`).
"""

from __future__ import annotations

import hashlib
from typing import Any, Callable

from ..errors import ConfigError
from ..tune.counters import Counters


def files_fingerprint(manifest) -> bytes:
    """32 bytes that differ when two nodes' manifests number files differently (a file is asked for
    by its number): every key and size, in order."""
    digest = hashlib.sha256()
    for i in range(len(manifest)):
        digest.update(manifest.keys[i].encode() + b"\0" + int(manifest.sizes[i]).to_bytes(8, "little"))
    return digest.digest()


class PeerLink:
    """The mounts of a job's nodes, one per node, over the cluster's one transport (dist/cluster.py
    ``transport``): MPI under ``mpirun --map-by ppr:1:node`` (or over ``comm``), torchrun's store
    and ZeroMQ under ``torchrun --nproc-per-node 1 ... --no-python clairvoyant mount``."""

    def __init__(self, comm: Any = None) -> None:
        from ..dist import cluster, peers
        self._peers, self._cluster = peers, cluster
        try:
            self._group, self._on = cluster.transport(comm)
        except ConfigError as e:
            raise ConfigError(f"clairvoyant mount --cluster: {e}; start one mount per node with mpirun --map-by "
                              "ppr:1:node, or torchrun --nnodes N --nproc-per-node 1 ... --no-python clairvoyant "
                              "mount (docs/mount.md)") from None
        self.node, self.nodes = self._group.rank, self._group.size
        self._service = None

    @classmethod
    def node_leaders(cls, comm: Any = None) -> "PeerLink | None":
        """For the ranks of an MPI training job that mount the data themselves (collective over
        ``comm``, COMM_WORLD by default): the link of the nodes' first ranks, each to mount for its
        node (``Mount(..., cluster=link)``), or None on every other rank (it reads through its
        node's mount). Nodes are told apart by ``CLAIRVOYANT_NODE`` or the host name."""
        from mpi4py import MPI

        from ..dist.group import node_groups
        from ..dist.topology import node_name
        comm = comm if comm is not None else MPI.COMM_WORLD
        groups = node_groups(comm, node_name())
        rank = comm.Get_rank()
        leader = any(g[0] == rank for g in groups)
        sub = comm.Split(0 if leader else MPI.UNDEFINED, rank)
        return cls(sub) if leader else None

    def agree(self, fingerprint: bytes, what: str) -> None:
        """Collective: a ConfigError on every node unless all nodes' fingerprints are the same."""
        from ..dist.group import agree
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


class LoopbackLink:
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
