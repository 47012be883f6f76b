"""MECHANISM: the job's ranks gathering what each knows, over whichever backend the launcher gives.

A group is any object with ``rank``, ``size``, ``name``, ``entered`` (the gathers this rank has
entered) and ``allgather(blob, what)`` (every rank's bytes, by rank: collective, each rank calls
the same gathers in the same order, bounded by ``GATHER_TIMEOUT``), and ``close()``:
:class:`~clairvoyant.cluster.mpi.MPIGroup` over an MPI communicator (``mpirun``,
``srun``), :class:`~clairvoyant.cluster.store.StoreGroup` over torch.distributed's key-value store
(torchrun, Lightning, Accelerate, a Kubernetes PyTorchJob). Both raise ``PeerLost`` naming
``what`` when a rank can no longer take part. What the cluster exchanges is built on it here:
an agreement on a fingerprint, the ranks of each node, int64 arrays. Raw bytes only: nothing
pickled.
"""

from __future__ import annotations

from collections import Counter
from typing import Any, Protocol

import numpy as np

from ..errors import ConfigError


class Group(Protocol):
    rank: int
    size: int
    name: str
    entered: int

    def allgather(self, blob: bytes, what: str) -> list[bytes]: ...

    def close(self) -> None: ...


def as_group(comm: Any) -> Group:
    """``comm`` as a group: a group as it is, an MPI communicator wrapped (cluster/mpi.py)."""
    if hasattr(comm, "allgather") and hasattr(comm, "name") and not hasattr(comm, "Get_rank"):
        return comm
    from .mpi import MPIGroup
    return MPIGroup(comm, dup=False)


def agree(comm: Any, fingerprint: bytes, what: str) -> None:
    """Collective: ConfigError on every rank, naming the ranks that differ from the majority
    (a tie goes to the lowest rank's side), if the ranks' 32-byte fingerprints of ``what`` differ."""
    if len(fingerprint) != 32:
        raise ConfigError(f"a fingerprint is 32 bytes, got {len(fingerprint)}")
    group = as_group(comm)
    prints = group.allgather(bytes(fingerprint), f"the check that every rank agrees on {what}")
    counts = Counter(prints)
    if len(counts) == 1:
        return
    common = max(counts, key=counts.__getitem__)   # the first of the most frequent: the same on every rank
    odd = [r for r, p in enumerate(prints) if p != common]
    ranks = ", ".join(map(str, odd))
    raise ConfigError(f"{what} differs across ranks: rank{'s' if len(odd) > 1 else ''} {ranks} "
                      f"disagree{'' if len(odd) > 1 else 's'} with the other {group.size - len(odd)}; "
                      "start every rank with the same settings and data")


def node_names(comm: Any, name: str) -> list[bytes]:
    """Every rank's node name, by rank (collective: every rank passes its node's name); the layout
    is ``NodeLayout.from_names`` of them (plan/layout.py)."""
    return as_group(comm).allgather(name.encode(), "the exchange of the nodes' names")


def node_groups(comm: Any, name: str) -> list[list[int]]:
    """The ranks of each node, in any placement, nodes in the order of their lowest rank
    (collective): for picking one rank per node (a mount's node leaders)."""
    groups: dict[bytes, list[int]] = {}
    for r, blob in enumerate(node_names(comm, name)):
        groups.setdefault(blob, []).append(r)
    return list(groups.values())


def allgather_int64(group: Group, values: np.ndarray, what: str) -> list[np.ndarray]:
    """Every rank's int64 array (any length), by rank."""
    blob = np.ascontiguousarray(values, "<i8").tobytes()
    return [np.frombuffer(b, "<i8") if len(b) % 8 == 0 else _bad(what) for b in group.allgather(blob, what)]


def _bad(what: str) -> np.ndarray:
    raise ConfigError(f"{what}: a rank sent a length that is not a whole number of int64s")

