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
from typing import Mapping, Sequence

import numpy as np

from .cluster import homes_held, plan_cluster_epoch
from .layout import NodeLayout
from .order import epoch_order
from .partition import cut_batches, rank_indices
from .ranges import DEFAULT_REQUEST_BYTES, Ranges, whole_reads
from .residency import simulate_epoch
from .residents import Residents
from .sequence import Interleaved, epoch_sequence


@dataclass(frozen=True)
class PlanConfig:
    """What every rank of the job must agree on to plan alike."""

    num_samples: int
    batch_size: int
    seed: int = 0
    shuffle: bool = True
    drop_last: bool = False


@dataclass(frozen=True)
class ClusterTiers:
    """The job's nodes as one cache (plan/cluster.py): their layout, each node's local-tier
    capacity (bytes) and what each node's tier holds now (sample -> entry bytes; empty: nothing)."""

    layout: NodeLayout
    capacities: tuple[int, ...]
    residents: tuple[Mapping[int, int], ...] = field(default=())
    home: np.ndarray | None = None   # the run's homes (carried from its first plan), else worked out now

    @property
    def nodes(self) -> tuple[tuple[int, ...], ...]:
        return self.layout.nodes


def cluster_tiers(nodes: Sequence[Sequence[int]], node: int, capacities: Sequence[int],
                  residents: Sequence[Mapping[int, int]] = ()) -> ClusterTiers:
    """``ClusterTiers`` from each node's ranks and the index of the planning rank's node (the
    layout is seen from that node's first rank)."""
    layout = NodeLayout(tuple(tuple(g) for g in nodes))
    return ClusterTiers(layout.with_rank(layout.nodes[node][0]), tuple(capacities), tuple(residents))


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
    cluster_home: np.ndarray | None = None   # each sample's home node in this run (carried to the next epoch)
    # shard-granular reads (plan/ranges.py), else None: per sample, read its range whole here
    whole: tuple[np.ndarray, ...] | None = None

    def __len__(self) -> int:
        return len(self.batches)


def plan_rank_epoch(entry_sizes: np.ndarray, config: PlanConfig, layout: NodeLayout, *, epoch: int, capacity: int,
                    residents: Mapping[int, int], position: int = 0,
                    cluster: ClusterTiers | None = None, ranges: Ranges | None = None,
                    request_bytes: int = DEFAULT_REQUEST_BYTES) -> RankEpochPlan:
    """Plan ``epoch`` for ``layout.rank`` from global ``position`` on, for a node whose local tier
    holds ``capacity`` bytes and ``residents`` (sample -> entry bytes) now; ``entry_sizes`` are the
    bytes each sample takes in a tier. With ``cluster``, the nodes of the job are planned as one
    cache (plan/cluster.py) and ``capacity`` and ``residents`` come from it. With ``ranges`` (a source
    that packs samples together), the node reads whole the ranges plan/ranges.py says pay."""
    c, t = config, layout
    if cluster is not None:
        return _plan_in_cluster(entry_sizes, c, t, epoch, position, cluster)
    kw = dict(seed=c.seed, world_size=t.world_size, ranks=t.ranks, batch_size=c.batch_size, shuffle=c.shuffle,
              drop_last=c.drop_last)
    seq = epoch_sequence(c.num_samples, epoch=epoch, position=position, **kw)
    following = epoch_sequence(c.num_samples, epoch=epoch + 1, **kw).samples
    res = simulate_epoch(seq.samples, following, entry_sizes, capacity, residents)
    reads = None if ranges is None else whole_reads(seq.samples, res.hit, entry_sizes, capacity,
                                                    Residents.of(residents), res.residents_after, ranges,
                                                    request_bytes=request_bytes)
    hit, after, whole = (res.hit, res.residents_after, None) if reads is None else \
        (reads.hit, reads.residents_after, reads.whole)
    return _for_rank(c, t, epoch, position, seq, hit, res.keep, res.drop_at_start, after, whole_at=whole)


def _for_rank(c: PlanConfig, t: NodeLayout, epoch: int, position: int, seq: Interleaved, hit: np.ndarray,
              keep: np.ndarray, drop_at_start, residents_after: Mapping[int, int], peer: np.ndarray | None = None,
              whole_at: np.ndarray | None = None, **cluster) -> RankEpochPlan:
    """This rank's share of its node's plan (per access of the node's interleaving ``seq``): its
    batches, their slices of the per-access arrays, and the residents it evicts at the start."""
    order = epoch_order(c.num_samples, c.seed, epoch, c.shuffle)
    mine = cut_batches(rank_indices(order, t.rank, t.world_size, position), c.batch_size, c.drop_last)
    ri = t.local_rank
    spans = seq.spans(ri)[:len(mine)].tolist()
    drop = np.asarray(drop_at_start, dtype=np.int64)
    first = np.full(len(drop), -1, np.int64)   # each dropped sample's first access in the node sequence
    if len(seq) and len(drop):
        seen, at = np.unique(seq.samples, return_index=True)
        j = np.minimum(np.searchsorted(seen, drop), len(seen) - 1)
        found = seen[j] == drop
        first[found] = at[j[found]]
    # the rank that reads a dropped sample first evicts it; the node's first rank one it never reads
    reader = np.zeros(len(drop), np.int64)
    reader[first >= 0] = seq.rank_and_step(first[first >= 0])[0]
    drops = tuple(int(s) for s in drop[reader == ri].tolist())
    return RankEpochPlan(epoch=epoch, rank=t.rank, position=position,
                         first_batch=position // (c.batch_size * t.world_size), batches=tuple(mine),
                         hit=tuple(hit[a:b] for a, b in spans), keep=tuple(keep[a:b] for a, b in spans),
                         drops=drops, residents_after=residents_after,
                         peer=None if peer is None else tuple(peer[a:b] for a, b in spans),
                         whole=None if whole_at is None else tuple(whole_at[a:b] for a, b in spans), **cluster)


def _plan_in_cluster(entry_sizes: np.ndarray, c: PlanConfig, t: NodeLayout, epoch: int, position: int,
                     cluster: ClusterTiers) -> RankEpochPlan:
    if t.nodes != cluster.layout.nodes or t.node != cluster.layout.node:
        raise ValueError(f"rank {t.rank}'s node {t.ranks} is not node {cluster.layout.node} of the cluster, "
                         f"{cluster.layout.ranks}")
    home = cluster.home
    if home is None:   # a run's first plan: what the tiers hold stays where it is (a restarted job's too)
        home = homes_held(c.num_samples, seed=c.seed, batch_size=c.batch_size, layout=cluster.layout,
                          residents=cluster.residents, sizes=entry_sizes, capacities=cluster.capacities,
                          shuffle=c.shuffle, drop_last=c.drop_last)
    plan = plan_cluster_epoch(c.num_samples, seed=c.seed, epoch=epoch, batch_size=c.batch_size,
                              layout=cluster.layout, capacities=cluster.capacities, sizes=entry_sizes,
                              shuffle=c.shuffle, drop_last=c.drop_last, position=position,
                              residents=list(cluster.residents) or None, home=home)
    view = plan.for_node(t.node)
    R, me = t.local_world_size, t.local_rank
    mine = (view.late_drops[:, 1] % R) == me if len(view.late_drops) else np.zeros(0, bool)
    late = tuple((int(k), int(s)) for k, s in view.late_drops[mine])
    # a late drop whose sample the epoch reads once can go as soon as its peer has been served (the
    # step lag is then only the fallback for a peer that never asks); a padded twin waits for it
    once = view.late_drops[mine & view.late_once, 1] if len(view.late_drops) else np.zeros(0, np.int64)
    return _for_rank(c, t, epoch, position, view.sequence, view.hit, view.keep, view.drop_at_start,
                     view.residents_after, view.peer, late_drops=late, late_on_serve=frozenset(once.tolist()),
                     cluster_residents=tuple(plan.residents_after), cluster_home=plan.home)
