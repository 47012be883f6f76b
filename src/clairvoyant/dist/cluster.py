"""MECHANISM: the job's nodes as one cache: who is on which node, what each node can hold, and
the peer service through which a node's tier serves the others (dist/peers.py, over MPI).

Every rank of the job plans the whole cluster alike (plan/cluster.py) from what
is exchanged here once, at start-up: the ranks of each node, each node's
local-tier capacity and, at the start of a run, the samples each node's tier
holds. A fingerprint of everything else the plan depends on (manifest, seed,
batch size, ...) is compared first, so that ranks that would plan differently
stop with a clear error instead of serving each other wrong samples.

Whether to run as a cluster: ``cluster="auto"`` turns it on where the launcher
says the job spans more than one node (or ``CLAIRVOYANT_NODE`` names nodes)
and mpi4py can be imported; without mpi4py the loader logs once that it runs
node by node, and why.
"""

from __future__ import annotations

import hashlib
import logging
import os
import time
from typing import Callable, Mapping

import numpy as np

from ..errors import ConfigError, PeerLost
from ..plan.layout import NodeLayout
from .mpi import agree, available, node_groups
from .peers import PeerService
from .topology import node_name

log = logging.getLogger("clairvoyant")
PEER_TIMEOUT = 2.0   # seconds a staging thread waits for a peer before it reads the shared store
_warned: list[str] = []


def multi_node(env: Mapping[str, str] | None = None) -> bool:
    """Whether the launcher says the job spans more than one node (or nodes are named by hand)."""
    env = os.environ if env is None else env
    if env.get("CLAIRVOYANT_NODE"):
        return True
    for size, local in (("OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE"), ("PMI_SIZE", "MPI_LOCALNRANKS"),
                        ("WORLD_SIZE", "LOCAL_WORLD_SIZE")):
        if size in env and local in env:
            try:
                return int(env[size]) > int(env[local])
            except ValueError:
                return False
    try:
        return int(env.get("SLURM_NNODES", "1")) > 1
    except ValueError:
        return False


def wanted(cluster: bool | str) -> bool:
    """Resolve the Loader's ``cluster=`` argument: True, False or "auto"."""
    if cluster not in (True, False, "auto"):
        raise ConfigError(f"cluster={cluster!r}: choose True, False or 'auto'")
    if cluster is False:
        return False
    why = available()
    if cluster is True:
        if why is not None:
            raise ConfigError(f"cluster=True needs MPI: {why}; `pip install clairvoyant[mpi]`, or pass cluster=False")
        return True
    if not multi_node():
        return False
    if why is not None:
        if not _warned:
            _warned.append(why)
            log.warning("clairvoyant: the job spans several nodes but runs node by node (each node reads "
                        "what it does not hold from the shared store): %s; `pip install clairvoyant[mpi]` "
                        "for the cluster cache, or pass cluster=False to silence this", why)
        return False
    return True


def fingerprint(**fields: object) -> bytes:
    """32 bytes that differ when anything the cluster plan depends on differs."""
    text = "\n".join(f"{k}={fields[k]!r}" for k in sorted(fields))
    return hashlib.sha256(text.encode()).digest()


class Cluster:
    """This rank in the job's cluster: node layout (``layout``), capacities, and the peer service."""

    def __init__(self, *, plan_fingerprint: bytes, timeout: float = PEER_TIMEOUT) -> None:
        """Join the job's cluster (collective: every rank of the job makes its Loader alike)."""
        from mpi4py import MPI   # imported here: clairvoyant runs without it
        self.comm = MPI.COMM_WORLD
        self.rank, self.world_size = self.comm.Get_rank(), self.comm.Get_size()
        agree(self.comm, plan_fingerprint, "the data, seed, batch size, shuffle, drop_last or compression (compress=, "
              "its codec and measured ratio: install the same zstandard on every node)")
        groups = node_groups(self.comm, node_name())
        for g in groups:
            if list(g) != list(range(g[0], g[0] + len(g))):
                raise ConfigError(
                    f"ranks {g} share a node but are not numbered in one block: launch with the ranks of "
                    "each node numbered consecutively (Open MPI's default --map-by slot, not --map-by node), "
                    "or pass cluster=False")
        self.layout = NodeLayout(tuple(tuple(g) for g in groups), self.rank, "MPI")
        self._coll = self.comm.Dup()   # the epochs' exchanges: revocable without touching the caller's
        self.timeout = timeout
        self.capacities: tuple[int, ...] = ()
        self._service: PeerService | None = None

    def start(self, capacity: int, serve: Callable[[int], bytes | None]) -> None:
        """Exchange the nodes' local-tier capacities (collective) and start serving this node's tier."""
        caps = self._allgather_int(int(capacity), "the exchange of tier capacities")
        self.capacities = tuple(int(caps[g[0]]) for g in self.layout.nodes)
        self._service = PeerService(self.comm, serve)
        self._service.start()

    def _allgather_int(self, value: int, what: str = "the start of an epoch") -> np.ndarray:
        out = np.zeros(self.world_size, dtype=np.int64)
        self._collective(what, "Iallgather", np.array([value], dtype=np.int64), out)
        return out

    def _collective(self, what: str, name: str, *args: object) -> None:
        """A non-blocking MPI collective over the whole job (on a communicator of its own), waited
        for while watching for lost ranks: a rank that knows of one (its peer service met the death,
        or MPI's failure detector did) revokes the communicator, so that every rank's collective ends
        at once instead of hanging (ULFM, ``mpirun --with-ft ulfm``; plain MPI ends the job), and each
        raises ``PeerLost`` saying what to do."""
        from mpi4py import MPI
        req, revoked_at = None, None
        dead = self._known_dead()
        if dead:   # known already (the peer service met it): start nothing that cannot finish
            raise self._lost(what, dead, "")
        try:
            req = getattr(self._coll, name)(*args)
            pause = 0.0005
            while not req.Test():
                if revoked_at is None and self._known_dead():
                    self._revoke()   # the others' collectives end too; this one ends with an error
                    revoked_at = time.monotonic()
                elif revoked_at is not None and time.monotonic() - revoked_at > 10.0:
                    break            # abandoned: MPI never ended it
                time.sleep(pause)
                pause = min(pause * 2, 0.02)
        except MPI.Exception as e:
            self._revoke()
            raise self._lost(what, self._known_dead(), e.Get_error_string().strip()) from e
        if revoked_at is not None:
            raise self._lost(what, self._known_dead(), "")

    def _known_dead(self) -> list[int]:
        """Ranks this rank knows are gone: those its peer service met, and MPI's own list (ULFM)."""
        dead = set(self._service.counters().get("dead_peers", [])) if self._service is not None else set()
        try:
            from mpi4py import MPI
            failed, mine = self._coll.Get_failed(), self._coll.Get_group()
            if failed.Get_size():
                ranks = MPI.Group.Translate_ranks(failed, list(range(failed.Get_size())), mine)
                dead |= {r for r in ranks if r != MPI.UNDEFINED}
            failed.Free()
            mine.Free()
        except Exception:   # noqa: BLE001 - no ULFM in this MPI: only the peer service's knowledge
            pass
        return sorted(dead)

    def _revoke(self) -> None:
        try:
            self._coll.Revoke()
        except Exception:   # noqa: BLE001 - no ULFM, or revoked already
            pass

    def _lost(self, what: str, dead: list[int], detail: str) -> PeerLost:
        who = f"rank(s) {dead}" if dead else "a rank"
        return PeerLost(
            f"{who} of this job's {self.world_size} can no longer take part in {what} on rank {self.rank}"
            f"{f' (MPI: {detail})' if detail else ''}: the cluster cache plans every epoch with every rank. "
            "Save the loader's state_dict() with your checkpoint and restart the job on the ranks that are "
            "left (the loader resumes elastically at its position), or pass cluster=False to run node by node. "
            "End this process with os._exit() or comm.Abort(): Open MPI's MPI_Finalize can wait forever for "
            "a dead rank")

    def all_true(self, flag: bool) -> bool:
        """Whether ``flag`` holds on every rank (collective)."""
        return bool(self._allgather_int(int(bool(flag))).all())

    def residents(self, mine: Mapping[int, int]) -> list[dict[int, int]]:
        """Every node's residents (sample -> entry bytes), from each node's first rank's ``mine``."""
        first = self.layout.local_rank == 0
        idx = np.fromiter(mine.keys(), dtype=np.int64, count=len(mine)) if first else np.zeros(0, np.int64)
        val = np.fromiter(mine.values(), dtype=np.int64, count=len(mine)) if first else np.zeros(0, np.int64)
        counts = self._allgather_int(len(idx), "the exchange of every node's residents")
        displs = np.concatenate([[0], np.cumsum(counts)[:-1]])
        all_idx = np.zeros(int(counts.sum()), dtype=np.int64)
        all_val = np.zeros(int(counts.sum()), dtype=np.int64)
        from mpi4py import MPI
        what = "the exchange of every node's residents"
        self._collective(what, "Iallgatherv", idx, [all_idx, counts, displs, MPI.INT64_T])
        self._collective(what, "Iallgatherv", val, [all_val, counts, displs, MPI.INT64_T])
        out = []
        for g in self.layout.nodes:
            a, n = int(displs[g[0]]), int(counts[g[0]])
            out.append(dict(zip(all_idx[a:a + n].tolist(), all_val[a:a + n].tolist())))
        return out

    def fetch(self, node: int, index: int, size: int) -> bytes | None:
        """Sample ``index`` from node ``node``'s tier (verified), or None: ask the rank of that node
        with this rank's position within its own node, so the node's ranks share the serving."""
        g = self.layout.nodes[node]
        if self._service is None:
            return None
        return self._service.fetch(g[self.layout.local_rank % len(g)], index, size, self.timeout)

    def counters(self) -> dict:
        return self._service.counters() if self._service is not None else {}

    def close(self) -> None:
        if self._service is not None:
            self._service.close()
        if self._coll is None:
            return
        try:
            if not self._known_dead():
                self._coll.Free()
        except Exception:   # noqa: BLE001 - MPI finalized, or the communicator revoked
            pass
        self._coll = None
