"""POLICY, pure: everything one rank does in one epoch, decided up front.

``plan_rank_epoch`` is the one place where an epoch is planned for a rank: the
batches it yields (plan/partition.py), and for each sample of each batch
whether the node's local tier holds it (hit) and keeps it afterwards (keep),
the residents this rank evicts when the epoch starts, and what the tier holds
at the epoch's end (the next epoch starts from it). The loader hands the result
to the epoch's run and carries it out; it decides nothing itself.

All ranks of a node compute the node's residency plan (plan/residency.py) from
the same inputs and take their own rank's slice of it, so they agree without
talking.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

import numpy as np

from .cluster import NodeLayout, plan_cluster_epoch
from .order import epoch_order
from .partition import cut_batches, rank_indices
from .ranges import DEFAULT_REQUEST_BYTES, Ranges, whole_reads
from .residency import node_sequence, simulate_epoch
from .residents import Residents


@dataclass(frozen=True)
class PlanConfig:
    """What every rank of the job must agree on to plan alike."""

    num_samples: int
    batch_size: int
    seed: int = 0
    shuffle: bool = True
    drop_last: bool = False


@dataclass(frozen=True)
class Layout:
    """Where this rank sits: its rank, the job's world size and the ranks of its node (which share
    the node's tiers)."""

    rank: int
    world_size: int
    node: range

    def __post_init__(self) -> None:
        if self.rank not in self.node or not 0 <= self.node.start <= self.node.stop - 1 < self.world_size:
            raise ValueError(f"rank {self.rank} and node ranks {self.node} do not fit a world of {self.world_size}")


@dataclass(frozen=True)
class ClusterSpec:
    """The job's nodes as one cache: the ranks of each node, which one is this rank's, each node's
    local-tier capacity, and what each node's tier holds now."""

    nodes: tuple[range, ...]
    node: int
    capacities: tuple[int, ...]
    residents: tuple[Mapping[int, int], ...] = field(default=())


@dataclass(frozen=True)
class RankEpochPlan:
    """One rank's epoch: batches of manifest indices from global ``position`` on, and per batch the
    residency actions on each of its samples."""

    epoch: int
    rank: int
    position: int                        # global position of the epoch at batch 0 (plan/partition.py)
    first_batch: int                     # index of batch 0 within the whole epoch at this layout
    batches: tuple[np.ndarray, ...]
    hit: tuple[np.ndarray, ...]          # bool per sample: read it from the local tier
    keep: tuple[np.ndarray, ...]         # bool per sample: the local tier keeps it after this access
    drops: tuple[int, ...]               # residents this rank evicts when the epoch starts
    residents_after: Mapping[int, int]   # sample -> entry bytes in the node's tier at the epoch's end
    # the cluster cache (plan/cluster.py), else None / empty:
    peer: tuple[np.ndarray, ...] | None = None     # int per sample: the node whose tier serves it, -1 none
    late_drops: tuple[tuple[int, int], ...] = ()   # (batch, sample): delete once this rank is past batch
    late_on_serve: frozenset[int] = frozenset()    # late drops read once this epoch: delete once served
    cluster_residents: tuple[Mapping[int, int], ...] | None = None   # every node's, at the epoch's end
    # shard-granular reads (plan/ranges.py), else None: per sample, read its range whole here
    whole: tuple[np.ndarray, ...] | None = None

    def __len__(self) -> int:
        return len(self.batches)


def plan_rank_epoch(entry_sizes: np.ndarray, config: PlanConfig, layout: Layout, *, epoch: int, capacity: int,
                    residents: Mapping[int, int], position: int = 0,
                    cluster: ClusterSpec | None = None, ranges: Ranges | None = None,
                    request_bytes: int = DEFAULT_REQUEST_BYTES) -> RankEpochPlan:
    """Plan ``epoch`` for ``layout.rank`` from global ``position`` on, for a node whose local tier
    holds ``capacity`` bytes and ``residents`` (sample -> entry bytes) now; ``entry_sizes`` are the
    bytes each sample takes in a tier. With ``cluster``, the nodes of the job are planned as one
    cache (plan/cluster.py) and ``capacity`` and ``residents`` come from it. With ``ranges`` (a source
    that packs samples together), the node reads whole the ranges plan/ranges.py says pay."""
    c, t = config, layout
    if cluster is not None:
        return _plan_in_cluster(entry_sizes, c, t, epoch, position, cluster)
    kw = dict(seed=c.seed, world_size=t.world_size, ranks=t.node, batch_size=c.batch_size, shuffle=c.shuffle,
              drop_last=c.drop_last)
    seq = node_sequence(c.num_samples, epoch=epoch, position=position, **kw)
    following = node_sequence(c.num_samples, epoch=epoch + 1, **kw)
    res = simulate_epoch(seq, following, entry_sizes, capacity, residents)
    reads = None if ranges is None else whole_reads(seq, res.hit, entry_sizes, capacity, Residents.of(residents),
                                                    res.residents_after, ranges, request_bytes=request_bytes)
    if reads is None:
        return _for_rank(c, t, epoch, position, seq, res.hit, res.keep, res.drop_at_start, res.residents_after)
    return _for_rank(c, t, epoch, position, seq, reads.hit, res.keep, res.drop_at_start, reads.residents_after,
                     whole_at=reads.whole)


def _for_rank(c: PlanConfig, t: Layout, epoch: int, position: int, seq: np.ndarray, hit: np.ndarray,
              keep: np.ndarray, drop_at_start, residents_after: Mapping[int, int], peer: np.ndarray | None = None,
              whole_at: np.ndarray | None = None, **cluster) -> RankEpochPlan:
    """This rank's share of its node's plan (per access of the node sequence ``seq``): its batches,
    their slices of the per-access arrays, and the residents it evicts at the start."""
    order = epoch_order(c.num_samples, c.seed, epoch, c.shuffle)
    mine = cut_batches(rank_indices(order, t.rank, t.world_size, position), c.batch_size, c.drop_last)
    ri, R = t.node.index(t.rank), len(t.node)
    spans = _rank_spans(len(seq), R, c.batch_size, ri, len(mine))
    drop = np.asarray(drop_at_start, dtype=np.int64)
    first = np.full(len(drop), -1, np.int64)   # each dropped sample's first access in the node sequence
    if len(seq) and len(drop):
        seen, at = np.unique(seq, return_index=True)
        j = np.minimum(np.searchsorted(seen, drop), len(seen) - 1)
        found = seen[j] == drop
        first[found] = at[j[found]]
    drops = tuple(int(s) for s, f in zip(drop.tolist(), first.tolist())
                  if _reader_of(int(f), len(seq), R, c.batch_size) == ri)
    return RankEpochPlan(epoch=epoch, rank=t.rank, position=position,
                         first_batch=position // (c.batch_size * t.world_size), batches=tuple(mine),
                         hit=tuple(hit[a:b] for a, b in spans), keep=tuple(keep[a:b] for a, b in spans),
                         drops=drops, residents_after=residents_after,
                         peer=None if peer is None else tuple(peer[a:b] for a, b in spans),
                         whole=None if whole_at is None else tuple(whole_at[a:b] for a, b in spans), **cluster)


def _step_length(n: int, R: int, B: int, step: int) -> int:
    """Samples of each rank's batch in ``step`` of a node sequence of ``n`` accesses by ``R`` ranks
    (all ranks' batches of a step are equally long; the last step's may be shorter)."""
    return min(B, (n - step * R * B) // R)


def _rank_spans(n: int, R: int, B: int, ri: int, steps: int) -> list[tuple[int, int]]:
    """Where the ``ri``-th rank of the node finds its batch of each step in the node sequence."""
    out = []
    for b in range(steps):
        length = _step_length(n, R, B, b)
        out.append((b * R * B + ri * length, b * R * B + (ri + 1) * length))
    return out


def _reader_of(access: int, n: int, R: int, B: int) -> int:
    """Which rank of the node (its index) makes access ``access`` of the node sequence; the node's
    first rank for a sample it does not read at all (-1): that rank evicts it."""
    if access < 0:
        return 0
    b = access // (R * B)
    return (access - b * R * B) // _step_length(n, R, B, b)


def _plan_in_cluster(entry_sizes: np.ndarray, c: PlanConfig, t: Layout, epoch: int, position: int,
                     cluster: ClusterSpec) -> RankEpochPlan:
    nodes = NodeLayout(tuple(tuple(g) for g in cluster.nodes))
    if t.node != cluster.nodes[cluster.node]:
        raise ValueError(f"rank {t.rank}'s node {t.node} is not node {cluster.node} of the cluster, "
                         f"{cluster.nodes[cluster.node]}")
    plan = plan_cluster_epoch(c.num_samples, seed=c.seed, epoch=epoch, batch_size=c.batch_size, layout=nodes,
                              capacities=cluster.capacities, sizes=entry_sizes, shuffle=c.shuffle,
                              drop_last=c.drop_last, position=position,
                              residents=list(cluster.residents) or None)
    view = plan.for_node(cluster.node)
    R, me = len(t.node), t.node.index(t.rank)
    mine = (view.late_drops[:, 1] % R) == me if len(view.late_drops) else np.zeros(0, bool)
    late = tuple((int(k), int(s)) for k, s in view.late_drops[mine])
    # a late drop whose sample the epoch reads once can go as soon as its peer has been served (the
    # step lag is then only the fallback for a peer that never asks); a padded twin waits for it
    once = view.late_drops[mine & view.late_once, 1] if len(view.late_drops) else np.zeros(0, np.int64)
    return _for_rank(c, t, epoch, position, view.samples, view.hit, view.keep, view.drop_at_start,
                     view.residents_after, view.peer, late_drops=late, late_on_serve=frozenset(once.tolist()),
                     cluster_residents=tuple(plan.residents_after))
