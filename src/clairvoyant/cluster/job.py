"""MECHANISM: the job's nodes as one cache: who is on which node, what each node can hold, and
the peer service through which a node's tier serves the others (cluster/peers.py).

Every rank of the job plans the whole cluster alike (plan/cluster.py) from what
is exchanged here once, at start-up: the ranks of each node, each node's
local-tier capacity and, at the start of a run, the samples each node's tier
holds. A fingerprint of everything else the plan depends on (manifest, seed,
batch size, ...) is compared first, so that ranks that would plan differently
stop with a clear error instead of serving each other wrong samples.

One transport, two backends, chosen by what the launcher gives (:func:`backend`): under an
MPI launcher (``mpirun``, ``srun --mpi=pmix``) the exchanges are MPI collectives and the peer
service runs over MPI; under torchrun and its kin (Lightning, Accelerate, a Kubernetes
PyTorchJob) the exchanges go through torch.distributed's key-value store (cluster/store.py) and
the peer service over ZeroMQ (cluster/wire_zmq.py), beside a training that uses NCCL. Whether to
run as a cluster: ``cluster="auto"`` turns it on where the launcher says the job spans more than
one node (or ``CLAIRVOYANT_NODE`` names nodes) and a backend is there; without one the loader
logs once that it runs node by node, and why.
"""

from __future__ import annotations

import hashlib
import importlib.util
import logging
import os
from typing import Callable, Mapping

import numpy as np

from ..errors import ConfigError, PeerLost
from ..plan import membership
from ..plan.layout import NodeLayout
from .group import agree, allgather_int64, node_names
from .members import Members, backend
from .topology import node_name, spans_nodes
from .timeouts import PEER_TIMEOUT

log = logging.getLogger("clairvoyant")
_warned: list[str] = []


def multi_node(env: Mapping[str, str] | None = None) -> bool:
    """Whether the launcher says the job spans more than one node (or nodes are named by hand)."""
    env = os.environ if env is None else env
    if env.get("CLAIRVOYANT_NODE"):
        return True
    spans = spans_nodes(env)   # the launchers' variables, written down once (cluster/topology.py)
    if spans is not None:
        return spans
    try:
        return int(env.get("SLURM_NNODES", "1")) > 1
    except ValueError:
        return False


def _torch_later() -> bool:
    """Whether a process group may still come (torch.distributed and pyzmq are there)."""
    if importlib.util.find_spec("zmq") is None or importlib.util.find_spec("torch") is None:
        return False
    import torch.distributed as dist
    return dist.is_available() and not dist.is_initialized()


def formed_late(fingerprint: bytes, insist: bool = False) -> "Cluster | None":
    """At the first pass of a Loader whose cluster was put off (``wanted`` said "later"): the
    cluster, joined through the process group's store now there (collective: every rank iterates),
    or None with a warning (no group was started: the job runs node by node; ``insist``, for
    ``cluster=True``: a ConfigError instead)."""
    if backend() != "store":
        if insist:
            raise ConfigError("cluster=True: no torch.distributed process group was started by the Loader's first "
                              "pass and no MPI launcher started the job; start the group first (e.g. Trainer.fit, "
                              "init_process_group()), launch with torchrun or mpirun, or pass cluster=False")
        log.warning("clairvoyant: the job spans several nodes but runs node by node: no torch.distributed process "
                    "group was started by the first pass (start it first, e.g. Trainer.fit or "
                    "init_process_group(), or launch with torchrun), or pass cluster=False to silence this")
        return None
    return Cluster(plan_fingerprint=fingerprint)


def wanted(cluster: bool | str) -> bool | str:
    """Resolve the Loader's ``cluster=`` argument (True, False or "auto"): True, False, or "later":
    the job spans several nodes and torch.distributed will have a process group to join through,
    but not yet (Lightning starts it in ``Trainer.fit``, after the Loader is made): the cluster
    forms at the first pass, where every rank iterates (:func:`formed_late`)."""
    if cluster not in (True, False, "auto"):
        raise ConfigError(f"cluster={cluster!r}: choose True, False or 'auto'")
    if cluster is False:
        return False
    if cluster == "auto" and not multi_node():
        return False
    got = backend()
    if got in ("mpi", "store"):
        return True
    if _torch_later():
        return "later"
    if cluster is True:
        raise ConfigError(f"cluster=True needs MPI or torchrun's rendezvous: {got}; or pass cluster=False")
    if not _warned:
        _warned.append(got)
        log.warning("clairvoyant: the job spans several nodes but runs node by node (each node reads what it "
                    "does not hold from the shared store): %s; or pass cluster=False to silence this", got)
    return False


class Joining:
    """How a Loader joins the job's cluster, decided once from its ``cluster=`` (:func:`wanted`):
    ``now`` (at construction), at its first pass (``pending``: a process group still to come), or
    never; the cluster checked against the place the Loader holds (``topology``: rank and size).
    ``fingerprint()``: the plan's (:func:`fingerprint`), computed only where a cluster is wanted."""

    def __init__(self, cluster: bool | str, fingerprint: Callable[[], bytes]) -> None:
        self._want = wanted(cluster)
        self._insist = cluster is True
        self._fingerprint = fingerprint() if self._want else b""
        self.pending = self._want == "later"

    def now(self, topology) -> "Cluster | None":
        """The cluster joined at construction (collective), or None (never, or at the first pass)."""
        return self._checked(Cluster(plan_fingerprint=self._fingerprint), topology) if self._want is True else None

    def at_first_pass(self, topology) -> "Cluster | None":
        """The cluster put off at construction, joined through the process group's store now there
        (collective: every rank iterates), or None (:func:`formed_late`); asked once."""
        if not self.pending:
            return None
        self.pending = False
        c = formed_late(self._fingerprint, self._insist)
        return None if c is None else self._checked(c, topology)

    @staticmethod
    def _checked(c: "Cluster", t) -> "Cluster":
        if (c.rank, c.world_size) != (t.rank, t.world_size):
            c.close()
            raise ConfigError(f"the cluster says rank {c.rank} of {c.world_size} but the loader has rank {t.rank} "
                              f"of {t.world_size}: pass the launcher's rank and size, or cluster=False")
        return c


def fingerprint(**fields: object) -> bytes:
    """32 bytes that differ when anything the cluster plan depends on differs."""
    text = "\n".join(f"{k}={fields[k]!r}" for k in sorted(fields))
    return hashlib.sha256(text.encode()).digest()


class Cluster:
    """The Loader's ranks in the job's cluster: node layout (``layout``), capacities, and the one
    membership object (``members``, cluster/members.py: group, wire, peer service, probe, close)."""

    def __init__(self, *, plan_fingerprint: bytes, timeout: float = PEER_TIMEOUT) -> None:
        """Join the job's cluster (collective: every rank of the job makes its Loader alike)."""
        try:
            self.members = Members.form()
        except ConfigError as e:
            raise ConfigError(f"{e}; or pass cluster=False") from None
        self.group = self.members.group
        self.rank, self.world_size = self.members.rank, self.members.size
        self.timeout = timeout
        self.capacities: tuple[int, ...] = ()
        try:
            self._join(plan_fingerprint)
        except BaseException:
            self.close()
            raise

    def _join(self, plan_fingerprint: bytes) -> None:
        g = self.group
        agree(g, plan_fingerprint, "the data, seed, batch size, shuffle, drop_last or compression (compress=, "
              "its codec and measured ratio: install the same zstandard on every node)")
        self.layout = NodeLayout.from_names(
            node_names(g, node_name()), rank=self.rank, origin="MPI" if g.name == "MPI" else "torchrun",
            advice="launch with the ranks of each node numbered consecutively (Open MPI's default --map-by slot, "
                   "not --map-by node), or pass cluster=False")

    def start(self, capacity: int, serve: Callable[[int], bytes | None]) -> None:
        """Exchange the nodes' local-tier capacities (collective) and start serving this node's tier."""
        caps = self._allgather_int(int(capacity), "the exchange of tier capacities")
        self.capacities = tuple(int(caps[g[0]]) for g in self.layout.nodes)
        self.members.start(serve, entered=lambda: self.group.entered)

    def _allgather_int(self, value: int, what: str = "the start of an epoch") -> np.ndarray:
        return np.concatenate(self._exchange(np.array([value], np.int64), what))

    def _exchange(self, values: np.ndarray, what: str) -> list[np.ndarray]:
        """Every rank's ``values`` (collective); a ``PeerLost`` naming ranks that did not take part
        says why, from the one probe of them (cluster/members.py): lost, or alive and stuck
        (plan/membership.py decides, as it decides for the mounts)."""
        try:
            return allgather_int64(self.group, values, what)
        except PeerLost as e:
            if self.members.service is None or not e.ranks:
                raise
            missing = list(e.ranks)
            found = self.members.probe(missing)
            raise PeerLost(f"{e}. A probe of them: {membership.why_absent(missing, found)}.", e.ranks) from e

    def all_true(self, flag: bool) -> bool:
        """Whether ``flag`` holds on every rank (collective)."""
        return bool(self._allgather_int(int(bool(flag))).all())

    def residents(self, mine: Mapping[int, int]) -> list[dict[int, int]]:
        """Every node's residents (sample -> entry bytes), from each node's first rank's ``mine``."""
        first = self.layout.local_rank == 0
        pairs = np.zeros((len(mine) if first else 0, 2), np.int64)
        if first and mine:
            pairs[:, 0] = np.fromiter(mine.keys(), np.int64, len(mine))
            pairs[:, 1] = np.fromiter(mine.values(), np.int64, len(mine))
        every = self._exchange(pairs.ravel(), "the exchange of every node's residents")
        out = []
        for g in self.layout.nodes:
            p = every[g[0]].reshape(-1, 2)
            out.append(dict(zip(p[:, 0].tolist(), p[:, 1].tolist())))
        return out

    def fetch(self, node: int, index: int, size: int) -> bytes | None:
        """Sample ``index`` from node ``node``'s tier (verified), or None: ask the rank of that node
        with this rank's position within its own node, so the node's ranks share the serving."""
        g = self.layout.nodes[node]
        return self.members.fetch(g[self.layout.local_rank % len(g)], index, size, self.timeout)

    def counters(self) -> dict:
        return dict(self.members.counters(),
                    transport=f"{self.group.name}, peers over {getattr(self.members.wire, 'name', 'MPI')}")

    def close(self) -> None:
        self.members.close()
