"""POLICY, pure: which ranks are on which node, and which rank this process is.

One frozen type, ``NodeLayout``, says it for every part of the runtime: the
plan (a node's ranks share its tiers and interleave their batches), the Loader
and the mount, the cluster cache and the simulator. Finding the numbers (the
launcher's variables, ``torch.distributed``, an exchange of node names, MPI)
is cluster/'s mechanism; what they mean is decided here.

Ranks on a node need not be numbered in one block for the plan; the launchers
that only give a node's size (``LOCAL_WORLD_SIZE``) place them in blocks, and
``NodeLayout.blocks`` is that placement. A rank's place on its node (its local
rank) follows from the layout, never from a separate number.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field, replace
from typing import Iterable, Sequence

import numpy as np

from ..errors import ConfigError

__all__ = ["NodeLayout", "rank_on_node", "block_ranks"]


@dataclass(frozen=True)
class NodeLayout:
    """The job's nodes and this process's rank: ``nodes[n]`` are node n's global ranks (kept in
    ascending order); together they are ``range(world_size)``, each rank on one node. ``origin``
    says where the numbers came from (not compared)."""

    nodes: tuple[tuple[int, ...], ...]
    rank: int = 0
    origin: str = field(default="given", compare=False)

    def __post_init__(self) -> None:
        nodes = tuple(tuple(sorted(int(r) for r in ranks)) for ranks in self.nodes)
        if not nodes or any(not ranks for ranks in nodes):
            raise ConfigError(f"every node needs at least one rank; got the layout {nodes}")
        flat = sorted(r for ranks in nodes for r in ranks)
        if flat != list(range(len(flat))):
            raise ConfigError(f"the nodes' ranks must be 0 .. world_size - 1, each on one node; got {nodes}")
        if not 0 <= int(self.rank) < len(flat):
            raise ConfigError(f"rank must be in [0, {len(flat)}), got {self.rank}")
        object.__setattr__(self, "nodes", nodes)
        object.__setattr__(self, "rank", int(self.rank))

    @classmethod
    def blocks(cls, world_size: int, local_world_size: int, *, rank: int = 0, origin: str = "given") -> NodeLayout:
        """Ranks in node blocks of ``local_world_size``, as launchers place them (the last may be short)."""
        if world_size < 1 or local_world_size < 1:
            raise ConfigError(f"world_size and local_world_size must be >= 1, got {world_size}, {local_world_size}")
        return cls(tuple(tuple(range(a, min(a + local_world_size, world_size)))
                         for a in range(0, world_size, local_world_size)), rank, origin)

    @classmethod
    def from_names(cls, names: Sequence[object], *, rank: int = 0, origin: str = "given",
                   advice: str = "set LOCAL_RANK and LOCAL_WORLD_SIZE, or pass local_world_size= to the Loader"
                   ) -> NodeLayout:
        """The layout of every rank's node name (by rank: any equal-comparable value, a name or its
        digest). A node's ranks must be numbered in one block, as torchrun, Lightning, Accelerate
        and Open MPI's default mapping place them: otherwise a ConfigError naming them and
        ``advice``, alike on every rank (each computes it from the same names), so that none goes
        on alone. The one place the job's nodes are found from their names."""
        groups: list[list[int]] = []
        seen: set = set()
        for r, name in enumerate(names):
            if r and names[r - 1] == name:
                groups[-1].append(r)
                continue
            if name in seen:
                apart = [q for q, n in enumerate(names) if n == name]
                raise ConfigError(f"ranks {apart} share a node but are not consecutive (numbered in one block): "
                                  f"{advice}")
            seen.add(name)
            groups.append([r])
        return cls(tuple(tuple(g) for g in groups), rank, origin)

    def with_rank(self, rank: int) -> NodeLayout:
        """The same nodes, seen from ``rank``."""
        return replace(self, rank=rank)

    @functools.cached_property
    def world_size(self) -> int:
        return sum(len(ranks) for ranks in self.nodes)

    @property
    def num_nodes(self) -> int:
        return len(self.nodes)

    @functools.cached_property
    def node(self) -> int:
        """The index of this rank's node."""
        return self.node_of(self.rank)

    @property
    def ranks(self) -> tuple[int, ...]:
        """The global ranks on this rank's node (which share its tiers), ascending."""
        return self.nodes[self.node]

    @property
    def local_rank(self) -> int:
        """This rank's place among its node's ranks."""
        return self.ranks.index(self.rank)

    @property
    def local_world_size(self) -> int:
        """Ranks on this rank's node."""
        return len(self.ranks)

    def node_of(self, rank: int) -> int:
        """The index of the node holding ``rank``."""
        for n, ranks in enumerate(self.nodes):
            if rank in ranks:
                return n
        raise ConfigError(f"rank {rank} is outside the layout's {self.world_size} ranks")

    def node_of_rank(self) -> np.ndarray:
        """int32 per global rank: the node holding it."""
        out = np.empty(self.world_size, np.int32)
        for n, ranks in enumerate(self.nodes):
            out[list(ranks)] = n
        return out


def rank_on_node(rank: int, world_size: int, node: Iterable[int]) -> NodeLayout:
    """The layout seen from ``rank`` when only its node's ranks (``node``) are known: the job's
    other ranks in nodes of as many, in rank order."""
    mine = tuple(sorted(int(r) for r in node))
    if rank not in mine:
        raise ConfigError(f"rank {rank} is not among its node's ranks {mine}")
    rest = [r for r in range(world_size) if r not in set(mine)]
    k = len(mine)
    others = [tuple(rest[a:a + k]) for a in range(0, len(rest), k)]
    return NodeLayout(tuple(sorted([mine, *others], key=min)), rank)


def block_ranks(rank: int, world_size: int, local_world_size: int) -> Sequence[int]:
    """The global ranks on ``rank``'s node when ranks are placed in node blocks."""
    return NodeLayout.blocks(world_size, local_world_size, rank=rank).ranks
