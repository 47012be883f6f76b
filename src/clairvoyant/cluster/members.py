"""MECHANISM: the one membership object of a job's cluster, for both front doors: the Loader's ranks
(cluster/job.py ``Cluster``), the mounts formed inside a job's ranks and the node services of
``clairvoyant mount --cluster`` (mount/cluster/links.py ``ServiceLink``, which adds its control
socket, the mount service's own part).

A :class:`Members` is this member's number and the members' count; the group it was formed over
(None for a mount service: its member process forms the group and hands it the addresses); the
wire (an MPI communicator, or a ZeroMQ backend); the peer service on the wire (cluster/peers.py);
the members found lost (not asked until taken back or formed again); the one probe and the
decision from it (plan/membership.py ``probed``); and ``close``. It is formed one way
(:meth:`Members.form`, :meth:`Members.of_group`: the group by the launcher,
``rendezvous``; the wire bound and every address exchanged by ``bound_wire``, whose failure rule is
the one rule: where a member's wire cannot start, every member raises, that one its own error,
the others a ConfigError naming it). The MPI group's gathers that time out name the members that
did not enter them by this object's probe (``behind``).
"""

from __future__ import annotations

import importlib.util
import os
import socket
import threading
from typing import Any, Callable, Mapping

from ..errors import ConfigError
from ..plan.membership import Probed, probed
from .group import Group
from .mpi import available
from .peers import ALIVE, ENTERED, PeerService
from .timeouts import FIRST_PASS_CAP, GATHER_TIMEOUT, PROBE_WAIT


# -- the formation: the group by the launcher, the wire, every address -----------------------------------

def backend(env: Mapping[str, str] | None = None) -> str:
    """"mpi" (started by an MPI launcher, mpi4py there), "store" (torch.distributed initialised, or
    started by torchrun: its store, pyzmq there), or one line saying why neither is."""
    env = os.environ if env is None else env
    why_mpi = available()
    if why_mpi is None:
        return "mpi"
    why = _store_missing(env)
    if why is None:
        return "store"
    return f"{why_mpi}; and without MPI, {why}"


def _store_missing(env: Mapping[str, str]) -> str | None:
    if importlib.util.find_spec("zmq") is None:
        return "pyzmq is not installed (pip install pyzmq)"
    try:
        import torch.distributed as dist
    except ImportError:
        return "torch is not installed"
    if dist.is_available() and dist.is_initialized():
        return None
    if env.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() == "true" and "MASTER_ADDR" in env:
        return None
    return ("the process was not started by torchrun (or Lightning, Accelerate) and torch.distributed is not "
            "initialised: call torch.distributed.init_process_group() before making the Loader")


def rendezvous(comm: Any = None, timeout: float | None = None, store: bool = False) -> Group:
    """The job's ranks as a group, by the launcher (:func:`backend`; ``comm``: over this MPI
    communicator; ``store``: over the process group's store, whatever started the job): MPI's
    collectives, or torchrun's store; the one group constructor, for the cluster's members and the
    Loader's first pass alike. ``timeout``: a gather's (``GATHER_TIMEOUT``). (An MPI group learns
    who is dead and who did not enter a gather from its members: ``Members.form``.)"""
    got = "mpi" if comm is not None else "store" if store else backend()
    if got == "mpi":
        from mpi4py import MPI   # imported here: clairvoyant runs without it
        from .mpi import MPIGroup
        return MPIGroup(comm if comm is not None else MPI.COMM_WORLD, timeout=timeout)
    if got != "store":
        raise ConfigError(f"the cluster needs MPI or torchrun's rendezvous: {got}")
    from .store import StoreGroup, job_store
    found = job_store()
    if isinstance(found, str):
        raise ConfigError(f"the cluster cannot start: {found}")
    return StoreGroup(*found, timeout=timeout)


def gather_over_group(values: list[int], timeout: float | None = None) -> list[list[int]]:
    """Every rank's ``values`` (int64s), by rank, over the default process group (:func:`rendezvous`:
    its store, cluster/store.py, or MPI's communicator under torch's MPI backend, whose store does
    nothing; nothing pickled, no device tensors under NCCL), for the Loader's first pass.
    Waited for at most ``timeout`` seconds (``GATHER_TIMEOUT``, at most ``FIRST_PASS_CAP``): a rank
    that never joins is a ``ConfigError`` saying so, not a hang."""
    import numpy as np
    import torch.distributed as dist

    from .group import allgather_int64

    timeout = min(GATHER_TIMEOUT, FIRST_PASS_CAP) if timeout is None else timeout
    rank, size = dist.get_rank(), dist.get_world_size()
    group = None
    try:
        comm = None
        if dist.get_backend() == "mpi":   # (its store does nothing)
            from mpi4py import MPI
            comm = MPI.COMM_WORLD
        # the process group's own ranks: its store (a library may have started MPI in each rank as a
        # world of one: Lightning's MPI detection does)
        group = rendezvous(comm, timeout=timeout, store=comm is None)
        rows = allgather_int64(group, np.asarray(values, np.int64), "the exchange of node names and manifests")
    except ConfigError as e:
        raise ConfigError(f"the Loader's first pass cannot exchange the ranks' node names: {e}") from None
    except Exception as e:   # a PeerLost (a rank that never came), or the store itself gone
        raise ConfigError(
            f"rank {rank} of {size} did not hear from every other rank at the Loader's first pass (they exchange "
            f"node names and manifests once; waited up to {timeout:.0f} s): make the Loader and iterate it on "
            f"every rank, or pass rank= and world_size= to a Loader used on some ranks only ({e})") from e
    finally:
        if group is not None:
            group.close()
    return [r.tolist() for r in rows]


def peer_host(group: Group) -> str:
    """The address the other ranks of ``group`` reach this rank's peer service by, the one rule for
    the Loader's cluster and the mounts' (collective: the ranks' host names are gathered):
    ``CLAIRVOYANT_PEER_ADDR`` if set, else that of the interface routing toward the rendezvous host
    (``MASTER_ADDR``, torchrun's) or another rank's host, the first that is not a loopback
    address. A loopback address while the ranks are on several hosts is a ConfigError (raised
    after the gather: every rank takes part in it)."""
    from .wire_zmq import ADDR_VAR, reachable_address
    hosts = [b.decode() for b in group.allgather(socket.gethostname().encode(), "the exchange of the nodes' hosts")]
    others = [h for h in hosts if h != hosts[group.rank]]
    master = os.environ.get("MASTER_ADDR")
    host = reachable_address(master or (others[0] if others else None))
    if master and others and host.startswith("127."):   # (a loopback name, or unresolvable here)
        host = reachable_address(others[0])
    if others and host.startswith("127."):
        raise ConfigError(f"the address the other nodes would reach this one's peer service by is {host}, a "
                          f"loopback address, while the ranks are on several hosts: set {ADDR_VAR} to this node's "
                          "address on the network the nodes share")
    return host


def exchange_addresses(group: Group, address: str | None, error: BaseException | None = None) -> list[str]:
    """Every rank's peer-service address, by rank (collective). A rank whose service could not
    start gives None with its ``error``: every rank then raises (that rank its own error), so that
    none waits for it."""
    got = group.allgather(b"" if address is None else address.encode(), "the exchange of the peer services' addresses")
    failed = [r for r, b in enumerate(got) if not b]
    if failed:
        if error is not None:
            raise error
        raise ConfigError(f"rank(s) {failed} could not start their peer service (their error says why)")
    return [b.decode() for b in got]


def bound_wire(group: Group) -> tuple[Any, list[str]]:
    """A ZeroMQ backend of rank ``group.rank`` bound on :func:`peer_host`'s address, its peers
    authenticated with the job's secret (cluster/secret.py), and every rank's address, by rank
    (collective: where one rank's cannot start, every rank raises, :func:`exchange_addresses`).
    The one start of a wire, for the Loader's peers and for a job's own mounts."""
    from .secret import job_secret
    from .wire_zmq import ZmqWire
    secret = job_secret(group)
    try:
        wire, error = ZmqWire(group.rank, group.size, peer_host(group), secret=secret), None
    except Exception as e:   # said on every rank after the exchange: none waits for this one
        wire, error = None, e
    try:
        return wire, exchange_addresses(group, None if wire is None else wire.address, error)
    except BaseException:
        if wire is not None:
            wire.shut_down(0.0, set())
        raise


class Members:
    """Member ``rank`` of ``size`` over ``wire`` (module docstring); ``group``: the launcher's, closed
    with this object (None: formed by another process). ``peers``: every member's address, where
    the wire is ZeroMQ's and they were exchanged."""

    def __init__(self, rank: int, size: int, wire: Any, group: Group | None = None,
                 peers: list[str] | None = None) -> None:
        self.rank, self.size = int(rank), int(size)
        self.group, self.wire = group, wire
        self.peers = list(peers or [])
        self.service: PeerService | None = None
        self.lost: frozenset[int] = frozenset()   # found lost: not asked until taken back or formed again
        self.was_lost = False                     # a member was lost since the cluster was last whole
        self._lock = threading.Lock()

    @classmethod
    def form(cls, comm: Any = None) -> "Members":
        """The job's members by its launcher (collective): MPI's group and communicator under an MPI
        launcher (``comm``: over this communicator), else torchrun's store and a ZeroMQ wire
        connected to every member (``rendezvous``, ``bound_wire``)."""
        group = rendezvous(comm)
        if group.name != "MPI":
            return cls.of_group(group)
        if comm is None:   # the service on the communicator itself, the gathers on their duplicate
            from mpi4py import MPI
            comm = MPI.COMM_WORLD
        members = cls(group.rank, group.size, comm, group)
        group.dead, group.behind = members.dead, members.behind   # (MPI's gathers ask these members)
        return members

    @classmethod
    def of_group(cls, group: Group) -> "Members":
        """The members of ``group`` (collective) over a ZeroMQ wire bound now, connected to every
        member's address (``bound_wire``: where one's cannot start, every member raises). Closes
        ``group`` if that fails."""
        try:
            wire, peers = bound_wire(group)
        except BaseException:
            group.close()
            raise
        wire.connect(peers)   # (ZeroMQ connects in the background: nothing here waits for a peer)
        return cls(group.rank, group.size, wire, group, peers)

    # -- the peer service -------------------------------------------------------------------------

    def start(self, serve: Callable[[int], bytes | None], **options: Any) -> PeerService:
        """Start serving ``serve`` (and what ``options`` give cluster/peers.py's ``PeerService``: a
        ``state`` callback, an ``alive`` answer, ``serve_threads``, ...) on the wire."""
        self.service = PeerService(self.wire, serve, **options)
        self.service.start()
        return self.service

    def fetch(self, peer: int, number: int, size: int, timeout: float, state: bool = False) -> bytes | None:
        """Piece ``number`` of ``peer``'s (a sample or file, or a piece of its state), verified; None
        from a member found lost, or before the service started."""
        if self.service is None or peer in self.lost:
            return None
        return self.service.fetch(peer, number, size, timeout, state=state)

    def counters(self) -> dict:
        return {} if self.service is None else self.service.counters()

    # -- who is in ---------------------------------------------------------------------------------

    def answers(self, peers: list[int], timeout: float = PROBE_WAIT, piece: int = ALIVE) -> dict[int, bytes | None]:
        """The one probe (cluster/peers.py ``PeerService.probe``): each peer's answer, None where none came."""
        return {} if self.service is None else self.service.probe(peers, timeout, piece)

    def probe(self, peers: list[int] | None = None, timeout: float = PROBE_WAIT) -> Probed:
        """plan/membership.py's decision from a probe of ``peers`` (default: every other member)."""
        peers = [p for p in range(self.size) if p != self.rank] if peers is None else list(peers)
        return probed(peers, self.answers(peers, timeout))

    def behind(self, entered: int) -> list[int]:
        """The members that did not enter this member's ``entered``-th gather (their count of gathers
        entered, asked by the probe; no answer: behind too); [] before the service starts (unknown)."""
        if self.service is None:
            return []
        peers = [p for p in range(self.size) if p != self.rank]
        got = self.answers(peers, piece=ENTERED)
        return [p for p in peers if got.get(p) is None or int.from_bytes(got[p], "little") < entered]

    def dead(self) -> set[int]:
        """The members the wire reported failed (MPI's ULFM)."""
        return set(self.counters().get("dead_peers", []))

    def mark_lost(self, peers: list[int]) -> None:
        """``peers`` lost: not asked from now on."""
        with self._lock:
            self.lost = self.lost | frozenset(peers)
            self.was_lost = self.was_lost or bool(peers)

    def readmit(self, peers: list[int]) -> None:
        """``peers`` found lost answer again: asked from now on (``was_lost`` stays until the cluster
        is whole again for its user)."""
        with self._lock:
            self.lost = self.lost - frozenset(peers)
            if self.service is not None:
                self.service.forgive(set(peers))

    def join(self, addresses: list[str]) -> set[int]:
        """Formed again around this running member (a launcher's new formation): every member's
        address; nothing is lost now. The members at new addresses (asked again at once)."""
        with self._lock:
            changed = {p for p, a in enumerate(addresses) if p < len(self.peers) and a != self.peers[p]}
            self.peers = list(addresses)
            self.wire.connect(self.peers)
            if self.service is not None:
                self.service.forgive(changed)
            self.lost = frozenset()
            return changed

    def close(self) -> None:
        """Stop the service (its thread, its wire) and close the group."""
        if self.service is not None:
            self.service.close()
        elif hasattr(self.wire, "shut_down"):   # a ZeroMQ wire no service took
            self.wire.shut_down(0.0, set())
        if self.group is not None:
            self.group.close()
