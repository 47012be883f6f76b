"""POLICY, pure: one residency plan for the whole cluster, so that its tiers together hold the data set once.

Planned node by node (plan/residency.py), each node keeps what *its* ranks will
read soonest, and with N nodes each holding a fraction f of the data set every
later epoch still reads 1 - f of it from the shared store. Here every sample
has one **home** node, the only node that keeps it; any other node that needs
it fetches it from the home's tier (a peer read) while the home holds it.

- **The cluster sequence** of an epoch: step by step, rank 0 .. W-1, each
  rank's batch in order (plan/sequence.py). Restricted to the ranks of one
  node it is that node's ``node_sequence``.
- **The home** of a sample is the node that reads it first in the job's first
  epoch (``home_nodes``): stable over epochs, balanced because the order is
  random, and the home reads every sample of its own in that epoch, so it can
  fill its tier with them.
- **Each home runs farthest-next-use** (plan/residency.py) over the accesses
  to its samples, whoever makes them, with its own capacity, next uses looked
  up in the next epoch too, starting from its residents. A miss can be admitted
  only where the home itself reads the sample (``admit``): a node that misses
  a sample of another home reads it from the store and keeps it nowhere.

The result is stated per access: ``served_by`` (the node whose tier serves it,
-1 the store) and ``keep`` (the home keeps the sample after it), plus per node
the residents to drop at the start, the residents at the end, and the **late
drops**: samples the home held for a peer's read at step s and must delete
once that read is done (the caller waits for the peer's progress, or adds a lag,
before it deletes). Every node computes the same plan from the same arguments.

The plan counts a sample cut after a peer's read as gone right after that read;
until the home carries out the late drop it holds those bytes on top, so a home
that stages ahead of its peers' progress needs headroom for the late drops of
that many steps (as a node staging ahead of its own reads does for its cuts).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Mapping, Sequence

import numpy as np

from ..errors import ConfigError
from .layout import NodeLayout
from .order import epoch_order
from . import residency
from .residency import EpochResidency, first_positions, group_positions, next_use_positions, simulate_from
from .residents import ClusterResidents, Residents
from .sequence import Interleaved, epoch_sequence

__all__ = ["home_nodes", "first_readers", "plan_cluster_epoch", "plan_cluster_sequence", "ClusterEpoch", "NodeView", "ClusterSummary"]


def home_nodes(num_samples: int, *, seed: int, batch_size: int, layout: NodeLayout, shuffle: bool = True,
               drop_last: bool = False, first_epoch: int = 0) -> np.ndarray:
    """int32 per sample: the node that reads it first in the job's first epoch (from its start).

    From the start of an epoch every sample at place j of the order is read by rank j mod W, and
    that read is its first (a padded repeat of it comes in the epoch's last step), so the home is
    the node of that rank; a sample the epoch leaves out (``drop_last``) goes to the same node."""
    if batch_size < 1:
        raise ConfigError(f"batch_size must be >= 1, got {batch_size}")
    order = epoch_order(num_samples, seed, first_epoch, shuffle)
    node_of = layout.node_of_rank()
    home = np.empty(num_samples, np.int32)
    home[order] = np.tile(node_of, -(-num_samples // len(node_of)))[:num_samples]
    return home


NEEDY = 0.5          # keep_held: a node holding less than this part of its share takes files from holders
SHARE_SLACK = 0.05   # keep_held: a node taking files this far below its share (a part of it) is near enough


def homes_held(num_samples: int, *, seed: int, batch_size: int, layout: NodeLayout,
               residents: Sequence[Mapping[int, int]], sizes: np.ndarray, capacities: int | Sequence[int],
               shuffle: bool = True, drop_last: bool = False, first_epoch: int = 0) -> np.ndarray:
    """The homes of a run that starts from tiers filled before it (a job restarted on fewer nodes,
    or another layout): a sample a node's tier holds stays there, any other goes to its first
    reader (``home_nodes``), and a node holding less than half its fair share takes the samples it
    reads first from the others (``keep_held``). Where the tiers hold only what their homes kept,
    these are the job's homes as they were; after a restart on other nodes, the survivors' tiers
    are reused instead of dropped, and a node new to the job homes its share. Every rank
    computes the same from the exchanged residents."""
    return keep_held(np.array(_homes(num_samples, layout.nodes, first_epoch, seed, batch_size, shuffle, drop_last)),
                     residents, sizes, capacities)


def keep_held(home: np.ndarray, residents: Sequence[Mapping[int, int]], sizes: np.ndarray,
              capacities: int | Sequence[int]) -> np.ndarray:
    """``home`` (changed in place and returned: per sample, the node that reads it first in the
    epoch planned, which can keep it at that read) with what the tiers hold (``residents[n]``)
    kept where it is, and each node brought to its **fair share** of the data set's bytes (its
    capacity's part of every tier's; equal parts where no tier has any) where the holdings allow:

    - a sample held by its first reader stays there; one no tier holds goes to its first reader
      (it is read from the store once either way);
    - a sample held elsewhere stays with its holder (the lower node, where two hold it), except
      that a node holding less than ``NEEDY`` of its share takes the samples it reads first from
      the holders over theirs, those most over first, down to their shares; then, still more
      than ``SHARE_SLACK`` below (its share is whole samples, spread over holders not all over
      theirs), from any holder, until it reaches its share. Each sample moved costs a store read
      (at the read that keeps it there), so a node near its share takes none; a node whose tier
      is empty (one back after a loss, while the others kept its files; one new to a restarted
      job) homes its share rather than nothing.

    The Loader's run (``homes_held``) and the mounts' first plan together (plan/cluster_walk.py
    ``plan_homes``) both keep what is held by this rule; every node computes the same."""
    nodes = len(residents)
    n = len(home)
    if nodes == 0 or n == 0:
        return home
    sizes = np.asarray(sizes, np.int64)
    caps = np.maximum(np.broadcast_to(np.asarray(capacities, np.float64), (nodes,)), 0.0)
    share = (caps / caps.sum() if caps.sum() > 0 else np.full(nodes, 1.0 / nodes)) * float(sizes.sum())
    holder = np.full(n, -1, np.int64)   # the lowest node whose tier holds the sample
    at_reader = np.zeros(n, bool)       # held by its first reader
    for node in range(nodes - 1, -1, -1):
        held = np.fromiter(residents[node], np.int64, len(residents[node]))
        held = held[(held >= 0) & (held < n)]
        holder[held] = node
        at_reader[held[home[held] == node]] = True
    cand = np.flatnonzero(~at_reader & (holder >= 0))   # held, not by its first reader
    if not len(cand):
        return home
    cand = cand[np.lexsort((cand, home[cand], holder[cand]))]
    key = holder[cand] * nodes + home[cand]          # (holder, first reader), grouped in that order
    load = np.bincount(home, weights=sizes, minlength=nodes)
    load += np.bincount(holder[cand], weights=sizes[cand], minlength=nodes)
    load -= np.bincount(home[cand], weights=sizes[cand], minlength=nodes)
    home[cand] = holder[cand]                        # kept by their holders, unless taken below
    slack = SHARE_SLACK * share
    needy = load < NEEDY * share   # (each file moved costs a store read: a node near its share takes none)
    for bounded in (True, False):   # from holders over their shares, down to them; then from any
        for f in np.argsort(share - load)[::-1]:     # the node furthest below its share first
            if not needy[f] or share[f] - load[f] <= (0.0 if bounded else slack[f]):
                continue
            for h in np.argsort(load - share)[::-1]:   # from the holders furthest over theirs
                want = min(share[f] - load[f], load[h] - share[h]) if bounded else share[f] - load[f]
                if want <= 0:
                    break
                lo, hi = np.searchsorted(key, [h * nodes + f, h * nodes + f + 1])
                group = cand[lo:hi][home[cand[lo:hi]] == h]   # (not taken already)
                run = sizes[group]
                take = group[np.cumsum(run) - run / 2 < want]   # (whole samples: the last, if half fits)
                home[take] = f
                moved = float(sizes[take].sum())
                load[f] += moved
                load[h] -= moved
    return home


@functools.lru_cache(maxsize=2)
def _homes(num_samples: int, nodes: tuple[tuple[int, ...], ...], first_epoch: int, seed: int, batch_size: int,
           shuffle: bool, drop_last: bool) -> np.ndarray:
    """``home_nodes``, kept: every epoch's plan of a job asks for the same (read-only) answer (by
    the layout's nodes, whichever rank asks); int16 below 32,768 nodes (half the memory per sample)."""
    home = home_nodes(num_samples, seed=seed, batch_size=batch_size, layout=NodeLayout(nodes), shuffle=shuffle,
                      drop_last=drop_last, first_epoch=first_epoch)
    if len(nodes) < 2**15:
        home = home.astype(np.int16)
    home.setflags(write=False)
    return home


@dataclass(frozen=True, eq=False)
class NodeView:
    """What node ``node`` does in the epoch, per access of its own ranks in node order (as
    ``node_sequence`` over its ranks): read it from its own tier (``hit``), from peer ``peer[i]``
    (-1: no peer), else from the store; ``keep[i]``: its own tier keeps the sample after access
    i (only ever for its home samples). ``late_drops``: rows (step, sample), by step, of its
    home samples to delete once the peer that reads them at that step is past it."""

    node: int
    samples: np.ndarray
    rank: np.ndarray
    step: np.ndarray
    hit: np.ndarray
    peer: np.ndarray
    keep: np.ndarray
    drop_at_start: np.ndarray
    late_drops: np.ndarray
    late_once: np.ndarray = field(default_factory=lambda: np.zeros(0, bool))
    residents_after: Residents = field(default_factory=Residents)
    sequence: Interleaved | None = None   # the node's ranks' interleaving (where each rank's batches lie)

    @property
    def store(self) -> np.ndarray:
        """bool per access: read from the shared store."""
        return ~self.hit & (self.peer < 0)


@dataclass(frozen=True)
class ClusterSummary:
    """Samples and bytes each node reads from its own tier, from peers' tiers and from the store,
    and sends to peers from its tier; one entry per node."""

    own_samples: tuple[int, ...]
    own_bytes: tuple[int, ...]
    peer_samples: tuple[int, ...]
    peer_bytes: tuple[int, ...]
    store_samples: tuple[int, ...]
    store_bytes: tuple[int, ...]
    sent_samples: tuple[int, ...]
    sent_bytes: tuple[int, ...]

    def totals(self) -> dict[str, int]:
        return {k: sum(v) for k, v in self.as_dict().items()}

    def as_dict(self) -> dict[str, list[int]]:
        return {k: list(getattr(self, k)) for k in self.__dataclass_fields__}


@dataclass(frozen=True, eq=False)
class ClusterEpoch:
    """The cluster's plan for one epoch; arrays are per access in cluster order unless named per
    sample or per node. Only what the plan decides is stored (the sequence, hit and keep per
    access); who reads an access (``rank``, ``step``, ``node``) follows from its place in the
    sequence and is worked out when asked, and so is ``served_by``."""

    epoch: int
    position: int
    layout: NodeLayout
    batch_size: int
    sequence: Interleaved        # every rank's batches interleaved (plan/sequence.py)
    hit: np.ndarray              # bool per access: the sample's home holds it then (served from there)
    keep: np.ndarray             # bool per access: the sample's home keeps it after the access
    home: np.ndarray             # per sample (int16 below 32,768 nodes, else int32)
    sizes: np.ndarray            # bytes per sample
    drop_at_start: tuple[np.ndarray, ...]      # per node: int64 residents to delete at the start
    late_drops: tuple[np.ndarray, ...]         # per node: int64 rows (step, sample), by step
    late_once: tuple[np.ndarray, ...]          # per node: bool per late drop, the epoch's only read
    residents_after: ClusterResidents            # per node: sample -> bytes at the epoch's end

    def __len__(self) -> int:
        return len(self.samples)

    @property
    def samples(self) -> np.ndarray:
        """The sample of each access (int32 where the data set allows)."""
        return self.sequence.samples

    @functools.cached_property
    def _rank_step(self) -> tuple[np.ndarray, np.ndarray]:
        rank, step = self.sequence.rank_and_step()
        rank.setflags(write=False)
        step.setflags(write=False)
        return rank, step

    @property
    def rank(self) -> np.ndarray:
        """int32 per access: the rank that reads it."""
        return self._rank_step[0]

    @property
    def step(self) -> np.ndarray:
        """int32 per access, from ``position``."""
        return self._rank_step[1]

    @functools.cached_property
    def node(self) -> np.ndarray:
        """int32 per access: the node of the rank that reads it."""
        return self.layout.node_of_rank()[self.rank]

    @functools.cached_property
    def served_by(self) -> np.ndarray:
        """int32 per access: whose tier serves it (the sample's home), -1 the store."""
        return np.where(self.hit, self.home[self.samples], -1).astype(np.int32)

    def for_node(self, n: int) -> NodeView:
        if not 0 <= n < self.layout.num_nodes:
            raise ConfigError(f"node {n} is outside the layout's {self.layout.num_nodes} nodes")
        ranks = self.layout.nodes[n]
        idx, seq = self.sequence.only(ranks)   # the cluster's columns are the global ranks
        samples = seq.samples.astype(np.int64)
        local, step = seq.rank_and_step()
        mine = self.home[samples] == n
        hit = self.hit[idx]
        return NodeView(node=n, samples=samples, rank=np.asarray(ranks, np.int32)[local], step=step, hit=hit & mine,
                        peer=np.where(hit & ~mine, self.home[samples], -1).astype(np.int32),
                        keep=self.keep[idx] & mine, drop_at_start=self.drop_at_start[n],
                        late_drops=self.late_drops[n], late_once=self.late_once[n],
                        residents_after=self.residents_after[n], sequence=seq)

    def summary(self) -> ClusterSummary:
        nodes = self.layout.num_nodes
        nbytes = self.sizes[self.samples].astype(np.float64)   # exact: whole numbers below 2**53

        def count(where: np.ndarray, by: np.ndarray) -> tuple[tuple[int, ...], tuple[int, ...]]:
            k = np.bincount(by[where], minlength=nodes)
            b = np.bincount(by[where], weights=nbytes[where], minlength=nodes)
            return tuple(int(x) for x in k), tuple(int(x) for x in b)

        own = self.served_by == self.node
        store = self.served_by < 0
        peer = ~own & ~store
        (os_, ob), (ps, pb), (ss, sb) = (count(w, self.node) for w in (own, peer, store))
        sent_s, sent_b = count(peer, self.served_by)
        return ClusterSummary(os_, ob, ps, pb, ss, sb, sent_s, sent_b)


def plan_cluster_epoch(num_samples: int, *, seed: int, epoch: int, batch_size: int, layout: NodeLayout,
                       capacities: int | Sequence[int], sizes: np.ndarray, shuffle: bool = True,
                       drop_last: bool = False, position: int = 0,
                       residents: Sequence[Mapping[int, int]] | None = None, home: np.ndarray | None = None,
                       first_epoch: int = 0, final: bool = False, use_c: bool = True) -> ClusterEpoch:
    """The cluster plan of ``epoch`` from global ``position`` on.

    ``capacities``: bytes of each node's tier (one number: the same for all); ``sizes``: bytes per
    sample (int64, or int32); ``residents``: per node, sample -> bytes held when the epoch starts
    (the previous epoch's ``residents_after``; residents homed elsewhere are dropped at the start);
    ``home``: ``home_nodes(...)`` if already computed (else computed from ``first_epoch``);
    ``final``: no epoch follows, so nothing is kept for one.

    In C (``_belady.plan_homes``) every home runs at once in one pass over the epoch, with a few
    bytes per sample: at ImageNet-22k size (14.2 M samples) on 1,024 nodes the plan of an epoch
    takes a few seconds and well under 1 GiB (benchmarks/plan_scale.py). Without the helper, or
    past its limits, home by home in Python (the reference, same decisions)."""
    nodes = layout.num_nodes
    caps = [int(capacities)] * nodes if np.ndim(capacities) == 0 else [int(c) for c in capacities]
    sizes = np.asarray(sizes)
    if sizes.dtype not in (np.int32, np.int64):
        sizes = sizes.astype(np.int64)
    sizes = np.ascontiguousarray(sizes)
    if len(caps) != nodes or min(caps) < 0:
        raise ConfigError(f"give one capacity >= 0 per node ({nodes} nodes), got {capacities!r}")
    if sizes.shape != (num_samples,):
        raise ConfigError(f"sizes holds {sizes.shape} entries for {num_samples} samples: give one per sample")
    held = ClusterResidents.of([{}] * nodes if residents is None else residents)
    if len(held) != nodes:
        raise ConfigError(f"residents holds {len(held)} tiers for {nodes} nodes: give one dict per node")
    kw = dict(seed=seed, batch_size=batch_size, shuffle=shuffle, drop_last=drop_last)
    if home is None:
        home = _homes(num_samples, layout.nodes, first_epoch, seed, batch_size, shuffle, drop_last)
    home = np.ascontiguousarray(home, dtype=home.dtype if home.dtype in (np.int16, np.int32) else np.int32)
    if home.shape != (num_samples,) or (num_samples and (home.min() < 0 or home.max() >= nodes)):
        raise ConfigError(f"home must give each of the {num_samples} samples a node in [0, {nodes})")
    world = layout.world_size
    seq = epoch_sequence(num_samples, epoch=epoch, world_size=world, position=position, **kw)
    following = (np.zeros(0, np.int64) if final else
                 epoch_sequence(num_samples, epoch=epoch + 1, world_size=world, **kw).samples)
    hit, keep, late, drops, afters = _plan_homes(seq, following, home, sizes, caps, held, layout, use_c)
    del following
    return _epoch_of(epoch, position, layout, batch_size, seq, home, sizes, hit, keep, late, drops, afters)


def first_readers(sequence: Interleaved, layout: NodeLayout, fallback: np.ndarray) -> np.ndarray:
    """int32 per sample: the node whose rank makes the first access to it in ``sequence`` (an
    epoch's cluster sequence, ranks placed by their global number), ``fallback[s]`` for a sample
    it leaves out: the homes of ``home_nodes`` for a sequence given by its accesses (the mount's
    published orders) rather than by seed and epoch."""
    home = np.asarray(fallback, np.int32).copy()
    samples = np.asarray(sequence.samples, np.int64)
    if len(samples):
        first = np.unique(samples, return_index=True)[1]
        rank, _ = sequence.rank_and_step(first)
        home[samples[first]] = layout.node_of_rank()[rank]
    return home


def plan_cluster_sequence(sequence: Interleaved, following: np.ndarray, *, home: np.ndarray, layout: NodeLayout,
                          capacities: int | Sequence[int], sizes: np.ndarray,
                          residents: Sequence[Mapping[int, int]] | None = None, epoch: int = 0,
                          batch_size: int = 1, use_c: bool = True) -> ClusterEpoch:
    """The cluster plan of one epoch given by its accesses: ``sequence``, every rank's batches
    interleaved (ranks placed by their global number in ``layout``), ``following`` the next
    epoch's cluster sequence (its samples; empty: unknown or none). The same decisions as
    ``plan_cluster_epoch`` (each home's farthest next use over every node's accesses, a miss
    admitted only at the home's own read), for orders that are not clairvoyant's arithmetic ones
    (the mount's, published by its samplers and exchanged between the nodes), on the same C
    kernel. ``batch_size``: accesses per step of a rank as ``sequence`` counts them (its steps, for
    the late drops)."""
    nodes = layout.num_nodes
    caps = [int(capacities)] * nodes if np.ndim(capacities) == 0 else [int(c) for c in capacities]
    sizes = np.ascontiguousarray(np.asarray(sizes, np.int64))
    n = len(sizes)
    if len(caps) != nodes or min(caps) < 0:
        raise ConfigError(f"give one capacity >= 0 per node ({nodes} nodes), got {capacities!r}")
    if sequence.lengths.shape[1] != layout.world_size:
        raise ConfigError(f"the sequence interleaves {sequence.lengths.shape[1]} ranks, the layout has "
                          f"{layout.world_size}: give every rank's accesses")
    home = np.ascontiguousarray(home, dtype=home.dtype if home.dtype in (np.int16, np.int32) else np.int32)
    if home.shape != (n,) or (n and (home.min() < 0 or home.max() >= nodes)):
        raise ConfigError(f"home must give each of the {n} samples a node in [0, {nodes})")
    following = np.asarray(following, np.int64)
    for name, a in (("sequence", np.asarray(sequence.samples)), ("following", following)):
        if len(a) and (int(a.min()) < 0 or int(a.max()) >= n):
            raise ConfigError(f"the {name} names samples outside [0, {n})")
    held = ClusterResidents.of([{}] * nodes if residents is None else residents)
    if len(held) != nodes:
        raise ConfigError(f"residents holds {len(held)} tiers for {nodes} nodes: give one dict per node")
    hit, keep, late, drops, afters = _plan_homes(sequence, following, home, sizes, caps, held, layout, use_c)
    return _epoch_of(epoch, 0, layout, batch_size, sequence, home, sizes, hit, keep, late, drops, afters)


def _epoch_of(epoch, position, layout, batch_size, seq, home, sizes, hit, keep, late, drops, afters) -> ClusterEpoch:
    """The ``ClusterEpoch`` of the homes' decisions: the late drops gathered per home, by step."""
    nodes, samples = layout.num_nodes, seq.samples
    late_pos = np.flatnonzero(late & 1)
    late_samples = samples[late_pos].astype(np.int64)
    owner = home[late_samples]
    by = np.argsort(owner, kind="stable")          # per home; positions, so steps, ascend within each
    _, step = seq.rank_and_step(late_pos[by])
    rows = np.stack([step.astype(np.int64), late_samples[by]], axis=1)
    once = (late[late_pos[by]] & 2) != 0
    late_cuts = np.searchsorted(owner[by], np.arange(nodes + 1))
    lates = tuple(rows[late_cuts[n]:late_cuts[n + 1]] for n in range(nodes))
    onces = tuple(once[late_cuts[n]:late_cuts[n + 1]] for n in range(nodes))
    for a in (samples, hit, keep):
        a.setflags(write=False)
    return ClusterEpoch(epoch=epoch, position=position, layout=layout, batch_size=batch_size, sequence=seq,
                        hit=hit, keep=keep, home=home, sizes=sizes, drop_at_start=tuple(drops), late_drops=lates,
                        late_once=onces, residents_after=afters)


def _plan_homes(seq: Interleaved, following: np.ndarray, home, sizes, caps, held, layout, use_c):
    """Every home's farthest-next-use over ``seq`` then ``following`` (the next epoch's cluster
    sequence): in C where the helper is built and the sizes fit its int32 positions (the Loader's
    arithmetic orders and the mount's published ones alike), else home by home in Python."""
    n, samples = len(home), seq.samples
    fits = (len(samples) + len(following) + n < 2**31 - 2 and layout.num_nodes <= 65536
            and (not n or int(sizes.max()) < 2**31) and int(held.sizes.max(initial=0)) < 2**31
            and int(held.samples.max(initial=0)) < 2**31 and int(held.samples.min(initial=0)) >= 0)
    if use_c and residency._c_plan_homes is not None and fits:
        return _plan_homes_c(seq, following, home, sizes, caps, held, layout)
    return _plan_homes_py(seq, following, home, sizes, caps, held, layout, use_c)


def _readers(seq: Interleaved, layout: NodeLayout) -> np.ndarray:
    """int16 (int32 past 32,767 nodes) per access of ``seq``: the node that makes it."""
    steps, ranks = seq.lengths.shape
    nor = layout.node_of_rank().astype(np.int16 if layout.num_nodes < 2**15 else np.int32)
    if not ranks:
        return np.zeros(0, nor.dtype)
    return np.repeat(np.tile(nor[:ranks], steps), seq.lengths.reshape(-1))


def _plan_homes_c(seq: Interleaved, following: np.ndarray, home, sizes, caps, held, layout):
    """Every home's farthest-next-use in one C pass (``_belady.plan_homes``) over the interleaved
    accesses, each with the node that makes it; residents homed elsewhere are dropped first. The
    next epoch is looked ahead into from its first access to each sample."""
    n, nodes, L = len(home), layout.num_nodes, len(seq)
    hit, keep, late = np.empty(L, np.uint8), np.empty(L, np.uint8), np.empty(L, np.uint8)
    out = residency._c_plan_homes(np.ascontiguousarray(seq.samples, np.int32), n,
                                  np.ascontiguousarray(following, np.int32),
                                  home if home.dtype in (np.int16, np.int32) else home.astype(np.int32), sizes,
                                  np.asarray(caps, np.int64), np.ascontiguousarray(held.samples, np.int32),
                                  np.ascontiguousarray(held.sizes, np.int32), held.cuts,
                                  np.ascontiguousarray(_readers(seq, layout)), hit, keep, late)
    d, dc, a, az, ac = (np.frombuffer(b, t) for b, t in zip(out, (np.int32, np.int64, np.int32, np.int32, np.int64)))
    drops = [d[dc[h]:dc[h + 1]].astype(np.int64) for h in range(nodes)]
    return hit.view(bool), keep.view(bool), late, drops, ClusterResidents(a, az, ac)


def _plan_homes_py(seq, following, home, sizes, caps, held, layout, use_c):
    """Home by home: the accesses to each home's samples (this epoch's ``seq``, then the next
    epoch's), in the home's local indices, through ``residency.simulate_from`` with a miss admitted
    only where the home itself reads. The reference for ``_plan_homes_c``."""
    nodes, L = layout.num_nodes, len(seq)
    samples = seq.samples.astype(np.int64)
    members_order, member_cuts, local = group_positions(home, nodes, use_c)   # a sample's index at its home
    order, cuts, this_cuts, lseq = _group_accesses(samples, following, home, local, nodes, use_c)
    this_pos = order[order < L].astype(np.int64)   # this epoch's accesses (each home's first), home by home
    rank, _ = seq.rank_and_step(this_pos)
    reader = layout.node_of_rank()[rank]           # the node that makes each of those accesses
    hits, keeps, drops, afters = [], [], [], []
    for n in range(nodes):
        a, b = int(this_cuts[n]), int(this_cuts[n + 1])
        mine = members_order[member_cuts[n]:member_cuts[n + 1]].astype(np.int64)
        r, drop = _simulate_home(n, lseq[cuts[n]:cuts[n + 1]], b - a, reader[a:b] == n, mine, local, home, sizes,
                                 caps[n], held[n], use_c)
        hits.append(r.hit)
        keeps.append(r.keep)
        drops.append(drop)
        afters.append(Residents(mine[r.residents_after.samples], r.residents_after.sizes))
    afters = ClusterResidents.of(afters)
    owner = np.repeat(np.arange(nodes, dtype=np.int32), np.diff(this_cuts))   # the home of each access
    hit, keep = np.zeros(L, bool), np.zeros(L, bool)
    hit[this_pos] = np.concatenate(hits) if hits else np.zeros(0, bool)
    keep[this_pos] = np.concatenate(keeps) if keeps else np.zeros(0, bool)
    late = np.zeros(L, np.uint8)
    cut = hit[this_pos] & ~keep[this_pos] & (reader != owner)   # held for a peer's read, then cut
    late[this_pos[cut]] = 1
    once = np.bincount(samples, minlength=len(home))[samples] == 1
    late[(late == 1) & once] |= 2
    return hit, keep, late, drops, afters


def _group_accesses(samples: np.ndarray, following: np.ndarray, home: np.ndarray, local: np.ndarray, nodes: int,
                    use_c: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """This epoch's accesses then the next epoch's, grouped by the sample's home (ascending within
    each home): ``(order, cuts, this_cuts, lseq)``: ``order[cuts[n]:cuts[n + 1]]`` are the
    positions of home n's accesses, the first ``this_cuts[n + 1] - this_cuts[n]`` of them this
    epoch's; ``lseq`` is the sample of each as its ``local`` index (among its home's samples). In
    C, two passes with one lookup per access each."""
    L, n = len(samples), len(samples) + len(following)
    if use_c and residency._c_group_accesses is not None and n < 2**31 and len(home) < 2**31:
        full = np.empty(n, np.int32)
        full[:L], full[L:] = samples, following
        packed = (home.astype(np.int64) << 32) | local
        order, lseq = np.empty(n, np.int32), np.empty(n, np.int32)
        cuts, this_cuts = np.empty(nodes + 1, np.int64), np.empty(nodes + 1, np.int64)
        residency._c_group_accesses(full, packed, nodes, L, order, lseq, cuts, this_cuts)
        return order, cuts, this_cuts, lseq
    full = np.concatenate([samples, following])
    order, cuts, _ = group_positions(home[full], nodes, use_c, place=False)
    this_cuts = np.zeros(nodes + 1, np.int64)
    np.cumsum(np.bincount(home[samples], minlength=nodes), out=this_cuts[1:])
    return order, cuts, this_cuts, local[full[order]]


def _simulate_home(n: int, both: np.ndarray, m: int, own: np.ndarray, mine: np.ndarray, local: np.ndarray,
                   home: np.ndarray, sizes: np.ndarray, capacity: int, residents: Residents,
                   use_c: bool) -> tuple[EpochResidency, np.ndarray]:
    """Farthest-next-use for home ``n`` over the accesses to its samples (``both``: this epoch's
    first ``m``, then the next epoch's), in local indices (a sample's place among ``mine``, its
    home's samples, ascending: ties fall the same way as in global indices); a miss admitted only
    at the home's ``own`` accesses. Returns the result and the residents to drop at the start
    (global indices), those homed elsewhere first."""
    ks, zs = residents.samples, residents.sizes
    ok = (ks >= 0) & (ks < len(home))
    ok[ok] = home[ks[ok]] == n
    held = Residents(local[ks[ok]], zs[ok])   # ascending: local indices keep the global order
    both = np.ascontiguousarray(both, dtype=np.int64)
    nxt = next_use_positions(both, len(mine), use_c)[:m]
    first = first_positions(both, len(mine))[held.samples]
    r = simulate_from(both[:m], nxt, sizes[mine], capacity, held, first, admit=own, use_c=use_c)
    return r, np.concatenate([ks[~ok], mine[np.asarray(r.drop_at_start, np.int64)]])
