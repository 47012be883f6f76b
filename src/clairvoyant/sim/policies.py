"""POLICY, by delegation: where each access of a simulated epoch is served from.

Each policy states, for every step of an epoch and every node, how many samples
and bytes its ranks read from their own tier, from peers' tiers (and how many
each node sends) and from the shared store: an ``EpochTraffic``. The decisions
are the loader's own, taken by the same pure functions the runtime calls, so
the simulator cannot drift from it:

- ``store-only``: every access from the store, at need (a plain DataLoader:
  one batch prefetched, ``loader_workers`` readers per GPU);
- ``staging``: every access from the store, staged ahead of the loop within
  the RAM window (no cache; ``stage_threads`` readers per node);
- ``node``: per-node tiers, today's runtime without the cluster cache: each
  node runs farthest-next-use over its ranks' interleaved sequence
  (``plan.sequence.interleave`` and ``plan.residency.simulate_epoch``), carrying its tier
  from epoch to epoch;
- ``cluster``: the cluster cache (``plan.cluster.plan_cluster_epoch``): each
  sample's home keeps it, peers read it over the interconnect;
- ``read-through``: ``clairvoyant mount`` without a sampler (the program shuffles on its own),
  node by node: a file read from the store is kept while the node's tier has room
  (``plan.unplanned.ReadThrough``). The mount also reads ahead where the opens follow the
  listing's or an earlier pass's order (``plan/readahead.py``), which this does not model: in a
  shuffled order it does not apply. With a sampler the mount runs ``node``'s plan;
- ``cluster-lru``: ``clairvoyant mount --cluster`` without a sampler: each file's home keeps it,
  read from the store by the home, least recently read across the cluster evicted first
  (``plan.unplanned.HomesLRU``). With samplers the cluster of mounts runs ``cluster``'s plan
  (the nodes exchange their orders: mount/cluster/plan.py), with a step per index: checked
  against 4 mounts in ``benchmarks/mount_capacity.py --cluster`` (docs/benchmarks.md);
- ``no-io``: nothing is read: the lower bound.

Only the public signatures of ``plan/`` are used; ``node_tier_epoch`` runs
``simulate_epoch`` over a node's own samples renumbered densely (as the
cluster plan does per home), which takes the same decisions and keeps the cost
per node proportional to the node's accesses rather than to the data set.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, Mapping

import numpy as np

from ..errors import ConfigError
from ..plan.cluster import homes_held, plan_cluster_epoch
from ..plan.order import epoch_order
from ..plan.partition import batch_lengths, rank_rows
from ..plan.residency import EpochResidency, simulate_epoch
from ..plan.residents import Residents
from ..plan.sequence import interleave
from ..plan.unplanned import HomesLRU, ReadThrough, hash_homes
from .model import Hardware, Job

POLICIES = ("store-only", "staging", "node", "cluster", "read-through", "cluster-lru", "no-io")
COUNTS = ("local_n", "local_b", "peer_n", "peer_b", "sent_n", "sent_b", "store_n", "store_b")


@dataclass(eq=False)
class EpochTraffic:
    """One epoch of one policy: int64 arrays of shape (steps, nodes). ``samples``: accesses of the
    node's ranks at that step; ``local``: served by the node's own tier; ``peer``: by another
    node's tier (``sent``: what the node's tier sends to others); ``store``: by the shared store.
    ``*_n`` count samples, ``*_b`` bytes (the samples' own bytes, not the tier's entry bytes).
    ``lookahead``: batches the policy stages ahead of the loop; ``readers``: store readers per node."""

    policy: str
    epoch: int
    samples: np.ndarray
    local_n: np.ndarray
    local_b: np.ndarray
    peer_n: np.ndarray
    peer_b: np.ndarray
    sent_n: np.ndarray
    sent_b: np.ndarray
    store_n: np.ndarray
    store_b: np.ndarray
    bytes: np.ndarray          # (steps, nodes): bytes of every access, whoever serves it
    lookahead: int
    readers: int
    write_n: np.ndarray | None = None   # (steps, nodes): store reads the node's tier keeps (entries written)
    write_b: np.ndarray | None = None

    def __post_init__(self) -> None:
        if self.write_n is None:
            self.write_n = np.zeros_like(self.samples)
        if self.write_b is None:
            self.write_b = np.zeros_like(self.samples)

    @property
    def steps(self) -> int:
        return self.samples.shape[0]

    @property
    def nodes(self) -> int:
        return self.samples.shape[1]

    def totals(self) -> dict[str, int]:
        out = {k: int(getattr(self, k).sum()) for k in COUNTS}
        out.update(samples=int(self.samples.sum()), bytes=int(self.bytes.sum()))
        return out

    def check(self) -> None:
        """Conservation: every access is served exactly once (own tier, a peer or the store), the
        bytes add up, and every byte a node receives from a peer is a byte another node sends.
        Raises AssertionError naming what does not add up (a broken policy)."""
        served = self.local_n + self.peer_n + self.store_n
        if not np.array_equal(served, self.samples):
            bad = np.argwhere(served != self.samples)[0]
            raise AssertionError(f"{self.policy} epoch {self.epoch}: step {bad[0]} node {bad[1]} serves "
                                 f"{int(served[tuple(bad)])} of {int(self.samples[tuple(bad)])} accesses")
        got = self.local_b + self.peer_b + self.store_b
        if not np.array_equal(got, self.bytes):
            raise AssertionError(f"{self.policy} epoch {self.epoch}: {int(got.sum())} bytes served for "
                                 f"{int(self.bytes.sum())} bytes asked")
        if int(self.peer_n.sum()) != int(self.sent_n.sum()) or int(self.peer_b.sum()) != int(self.sent_b.sum()):
            raise AssertionError(f"{self.policy} epoch {self.epoch}: peers received {int(self.peer_b.sum())} bytes "
                                 f"but sent {int(self.sent_b.sum())}")
        for k in COUNTS + ("write_n", "write_b"):
            if (getattr(self, k) < 0).any():
                raise AssertionError(f"{self.policy} epoch {self.epoch}: negative {k}")
        if (self.write_n > self.store_n).any() or (self.write_b > self.store_b).any():
            raise AssertionError(f"{self.policy} epoch {self.epoch}: a tier writes entries it did not read from "
                                 "the store")


def _grid(step: np.ndarray, node: np.ndarray | int, steps: int, nodes: int,
          weights: np.ndarray | None = None) -> np.ndarray:
    """Counts (or sums of ``weights``) per (step, node)."""
    key = np.asarray(step, np.int64) * nodes + np.asarray(node, np.int64)
    out = np.bincount(key, weights=None if weights is None else np.asarray(weights, np.float64),
                      minlength=steps * nodes)
    return np.rint(out).astype(np.int64).reshape(steps, nodes)


@dataclass(frozen=True, eq=False)
class NodeSequences:
    """Every node's access sequence of one epoch at once: ``seq[n]`` is node n's
    ``plan.sequence.node_sequence`` (its ranks' batches step by step), ``step`` the step of
    each access. Built from one padded order for all nodes (``node_sequence`` pads the order
    once per node: at 1,024 nodes that is 1,024 copies of it per epoch)."""

    seq: np.ndarray     # (nodes, accesses per node) int64
    step: np.ndarray    # (accesses per node,) int64: the same for every node


def node_sequences(num_samples: int, job: Job, epoch: int) -> NodeSequences:
    """``node_sequence`` of every node of ``job`` (``job.layout``: ranks in node blocks of
    ``job.gpus``) for ``epoch`` from its start; tests/sim/test_simulate.py holds it equal to
    ``node_sequence`` node by node."""
    rows = rank_rows(epoch_order(num_samples, job.seed, epoch, job.shuffle), job.world_size)   # a view
    lengths = batch_lengths(rows.shape[1], job.batch_size, job.drop_last)
    nodes = job.layout.nodes
    seq = np.empty((len(nodes), len(nodes[0]) * int(lengths.sum())), np.int64)
    for n, ranks in enumerate(nodes):
        merged = interleave(rows[ranks[0]:ranks[-1] + 1], lengths)   # a block of rows: a view
        seq[n] = merged.samples
    step = merged.rank_and_step()[1].astype(np.int64) if nodes else np.zeros(0, np.int64)
    return NodeSequences(seq, step)


class Policy:
    """A placement policy: ``epochs`` yields one ``EpochTraffic`` per epoch, in order."""

    name = "policy"

    def __init__(self, job: Job, sizes: np.ndarray, hw: Hardware, *, overhead: int = 32) -> None:
        self.job, self.hw = job, hw
        self.sizes = np.ascontiguousarray(sizes, dtype=np.int64)   # the samples' bytes
        self.entry_sizes = self.sizes + int(overhead)               # what a tier counts (cache/entry.py)
        self.num_samples = len(self.sizes)

    def _kw(self) -> dict:
        j = self.job
        return dict(seed=j.seed, batch_size=j.batch_size, shuffle=j.shuffle, drop_last=j.drop_last)

    def _empty(self, epoch: int, lookahead: int, readers: int) -> EpochTraffic:
        j = self.job.at(epoch)   # (one node fewer after a node's loss: Job.lost_at)
        z = np.zeros((j.steps(self.num_samples), j.nodes), np.int64)
        return EpochTraffic(self.name, epoch, z.copy(), *(z.copy() for _ in COUNTS), z.copy(), lookahead, readers)

    def staging_lookahead(self) -> int:
        """Batches the stager may run ahead: the RAM window over a step's bytes, within the
        loader's ``lookahead``, at least one."""
        j = self.job
        step_bytes = j.gpus * j.batch_size * float(self.entry_sizes.mean())
        return int(max(1, min(self.hw.lookahead, self.hw.window // max(step_bytes, 1.0))))

    def epochs(self) -> Iterator[EpochTraffic]:
        raise NotImplementedError

    def _count_arrays(self, t: EpochTraffic, samples: np.ndarray, step: np.ndarray, node: np.ndarray,
                      served_by: np.ndarray, write: np.ndarray, add: bool = False) -> None:
        S, N = t.steps, t.nodes
        z = self.sizes[samples].astype(np.float64)
        own = served_by == node
        store = served_by < 0
        peer = ~own & ~store
        parts = {
            "samples": _grid(step, node, S, N), "bytes": _grid(step, node, S, N, z),
            "local_n": _grid(step[own], node[own], S, N), "local_b": _grid(step[own], node[own], S, N, z[own]),
            "peer_n": _grid(step[peer], node[peer], S, N), "peer_b": _grid(step[peer], node[peer], S, N, z[peer]),
            "sent_n": _grid(step[peer], served_by[peer], S, N),
            "sent_b": _grid(step[peer], served_by[peer], S, N, z[peer]),
            "store_n": _grid(step[store], node[store], S, N),
            "store_b": _grid(step[store], node[store], S, N, z[store]),
            "write_n": _grid(step[write], node[write], S, N),
            "write_b": _grid(step[write], node[write], S, N, z[write]),
        }
        for k, v in parts.items():
            if add:
                getattr(t, k)[:] += v
            else:
                setattr(t, k, v)


class StorePolicy(Policy):
    """Every access from the store: ``store-only`` (one batch ahead, the DataLoader's readers) or
    ``staging`` (the RAM window ahead, the stager's threads)."""

    def __init__(self, job: Job, sizes: np.ndarray, hw: Hardware, *, staged: bool, overhead: int = 32) -> None:
        super().__init__(job, sizes, hw, overhead=overhead)
        self.name = "staging" if staged else "store-only"
        self.staged = staged

    def epochs(self) -> Iterator[EpochTraffic]:
        j, hw = self.job, self.hw
        look = self.staging_lookahead() if self.staged else 1
        readers = hw.stage_threads if self.staged else hw.loader_workers * j.gpus
        for e in range(j.epochs):
            t = self._empty(e, look, readers)
            ns = node_sequences(self.num_samples, j.at(e), e)
            t.samples[:] = np.bincount(ns.step, minlength=t.steps)[:, None]
            t.bytes[:] = _per_step(self.sizes[ns.seq], ns.step, t.steps)
            t.store_n[:], t.store_b[:] = t.samples, t.bytes
            yield t


def _per_step(values: np.ndarray, step: np.ndarray, steps: int) -> np.ndarray:
    """(steps, nodes) sums of ``values`` (nodes, accesses), whose accesses fall in contiguous
    runs of ``step`` (ascending)."""
    if values.shape[1] == 0:
        return np.zeros((steps, values.shape[0]), np.int64)
    starts = np.searchsorted(step, np.arange(steps))
    return np.add.reduceat(values.astype(np.int64, copy=False), starts, axis=1).T


class NoIOPolicy(Policy):
    """Nothing is read: every access served at no cost (the lower bound). Its accesses are all
    counted as local so that conservation holds; the engine charges them nothing."""

    name = "no-io"

    def epochs(self) -> Iterator[EpochTraffic]:
        for t in StorePolicy(self.job, self.sizes, self.hw, staged=True, overhead=0).epochs():
            t.policy = self.name
            t.local_n, t.local_b = t.store_n, t.store_b
            t.store_n, t.store_b = np.zeros_like(t.samples), np.zeros_like(t.samples)
            yield t


def node_tier_epoch(seq: np.ndarray, following: np.ndarray, entry_sizes: np.ndarray, capacity: int,
                    residents: Mapping[int, int]) -> tuple[EpochResidency, Residents]:
    """``plan.residency.simulate_epoch`` for one node, over its own samples renumbered densely
    (ascending, so ties fall as with global indices). Returns the result (per access of ``seq``)
    and the residents at the epoch's end in global indices."""
    held = Residents.of(residents)
    n = len(entry_sizes)
    if 16 * (len(seq) + len(following) + len(held)) < n:   # a small share of the data set: sort it
        universe = np.unique(np.concatenate([seq, following, held.samples]))
        local = lambda a: np.searchsorted(universe, a)   # noqa: E731
    else:                                               # a large share: one pass over a mask
        mask = np.zeros(n, bool)
        mask[seq] = mask[following] = mask[held.samples] = True
        universe = np.flatnonzero(mask)
        index = np.empty(n, np.int64)
        index[universe] = np.arange(len(universe))
        local = lambda a: index[a]   # noqa: E731
    res = simulate_epoch(local(seq), local(following), entry_sizes[universe], int(capacity),
                         Residents(local(held.samples), held.sizes))
    after = res.residents_after
    return res, Residents(universe[after.samples], after.sizes)


class NodeTierPolicy(Policy):
    """Per-node tiers (the runtime with ``cluster=False``): farthest-next-use per node."""

    name = "node"

    def epochs(self) -> Iterator[EpochTraffic]:
        j, hw = self.job, self.hw
        held: list[Residents] = [Residents() for _ in range(j.nodes)]
        look = self.staging_lookahead()
        following = node_sequences(self.num_samples, j, 0)
        for e in range(j.epochs):
            t = self._empty(e, look, hw.stage_threads)
            held = held[:t.nodes]   # (a node lost: the survivors' tiers go on)
            this = following if following.seq.shape[0] == t.nodes else node_sequences(self.num_samples, j.at(e), e)
            following = node_sequences(self.num_samples, j.at(e), e + 1)   # (a restart is not foreseen)
            step = this.step
            z = self.sizes[this.seq]
            hits = np.zeros(this.seq.shape, bool)
            writes = np.zeros(this.seq.shape, bool)
            for n in range(t.nodes):
                res, held[n] = node_tier_epoch(this.seq[n], following.seq[n], self.entry_sizes,
                                               hw.local_capacity, held[n])
                hits[n] = res.hit
                writes[n] = res.keep & ~res.hit   # a miss the tier keeps: an entry written
            t.samples[:] = np.bincount(step, minlength=t.steps)[:, None]
            t.bytes[:] = _per_step(z, step, t.steps)
            t.local_n[:] = _per_step(hits, step, t.steps)
            t.local_b[:] = _per_step(np.where(hits, z, 0), step, t.steps)
            t.store_n[:] = t.samples - t.local_n
            t.store_b[:] = t.bytes - t.local_b
            t.write_n[:] = _per_step(writes, step, t.steps)
            t.write_b[:] = _per_step(np.where(writes, z, 0), step, t.steps)
            yield t


class ClusterPolicy(Policy):
    """The cluster cache (the runtime with ``cluster=True``): ``plan_cluster_epoch`` over the job's
    nodes, every node's tier carried to the next epoch."""

    name = "cluster"

    def __init__(self, job: Job, sizes: np.ndarray, hw: Hardware, *, overhead: int = 32,
                 per_node_views: bool = False) -> None:
        super().__init__(job, sizes, hw, overhead=overhead)
        self.per_node_views = per_node_views   # count through for_node (the stable API) only

    def epochs(self) -> Iterator[EpochTraffic]:
        j, hw = self.job, self.hw
        residents, home = None, None
        look = self.staging_lookahead()
        for e in range(j.epochs):
            t = self._empty(e, look, hw.stage_threads)
            layout = j.at(e).layout
            if residents is not None and len(residents) > t.nodes:   # a node lost: the job restarted on the others,
                residents = residents[:t.nodes]                       # whose tiers stay as they are (the Loader's
                home = homes_held(self.num_samples, layout=layout, residents=residents, sizes=self.entry_sizes,
                                  capacities=hw.local_capacity, **self._kw())   # run)
            plan = plan_cluster_epoch(self.num_samples, epoch=e, layout=layout, capacities=hw.local_capacity,
                                      sizes=self.entry_sizes, residents=residents, home=home, **self._kw())
            residents, home = list(plan.residents_after), plan.home
            fast = not self.per_node_views and all(hasattr(plan, a) for a in
                                                   ("samples", "node", "step", "served_by", "keep", "home"))
            if fast:   # the plan's per-access arrays, where it has them: one pass for every node
                node = np.asarray(plan.node)
                write = np.asarray(plan.keep) & (np.asarray(plan.served_by) < 0) & (plan.home[plan.samples] == node)
                self._count_arrays(t, plan.samples, plan.step, node, plan.served_by, write)
            else:      # the stable API: each node's view
                for n in range(t.nodes):
                    v = plan.for_node(n)
                    by = np.where(v.hit, n, v.peer).astype(np.int64)
                    write = v.keep & ~v.hit & (v.peer < 0)
                    self._count_arrays(t, v.samples, v.step, np.full(len(v.samples), n, np.int64), by, write,
                                       add=True)
            yield t

class UnplannedPolicy(Policy):
    """The mount's policies without a sampler (``plan/unplanned.py``), asked read by read in the
    order the reads come: step by step, node by node within a step, each node's reads in order.
    Nothing looks ahead; the tiers carry over from epoch to epoch."""

    def __init__(self, job: Job, sizes: np.ndarray, hw: Hardware, *, cluster: bool, overhead: int = 32) -> None:
        super().__init__(job, sizes, hw, overhead=overhead)
        self.name = "cluster-lru" if cluster else "read-through"
        if job.lost_at is not None:
            raise ConfigError(f"{self.name} (the mount without a sampler) does not model a node's loss; "
                              "choose among store-only, staging, node and cluster")
        n = job.nodes
        if cluster:
            self._homes = HomesLRU(hash_homes(self.num_samples, n), [hw.local_capacity] * n, self.entry_sizes)
            self._asks = [self._homes] * n
        else:
            self._asks = [ReadThrough(hw.local_capacity, self.entry_sizes) for _ in range(n)]

    def epochs(self) -> Iterator[EpochTraffic]:
        j, hw = self.job, self.hw
        look = self.staging_lookahead()
        for e in range(j.epochs):
            ns = node_sequences(self.num_samples, j, e)
            nodes, per = ns.seq.shape
            samples = ns.seq.reshape(-1)
            node = np.repeat(np.arange(nodes, dtype=np.int64), per)
            step = np.tile(ns.step, nodes)
            order = np.lexsort((np.tile(np.arange(per), nodes), node, step))
            served = np.empty(len(samples), np.int64)
            write = np.zeros(len(samples), bool)
            asks = self._asks
            for k, f, n in zip(order.tolist(), samples[order].tolist(), node[order].tolist()):
                got = asks[n].read(n, f)
                served[k] = got.by
                write[k] = got.kept
            t = self._empty(e, look, hw.stage_threads)
            self._count_arrays(t, samples, step, node, served, write)
            yield t


def make_policy(name: str, job: Job, sizes: np.ndarray, hw: Hardware, *, overhead: int = 32) -> Policy:
    if name == "store-only":
        return StorePolicy(job, sizes, hw, staged=False, overhead=overhead)
    if name == "staging":
        return StorePolicy(job, sizes, hw, staged=True, overhead=overhead)
    if name == "node":
        return NodeTierPolicy(job, sizes, hw, overhead=overhead)
    if name == "cluster":
        return ClusterPolicy(job, sizes, hw, overhead=overhead)
    if name in ("read-through", "cluster-lru"):
        return UnplannedPolicy(job, sizes, hw, cluster=name == "cluster-lru", overhead=overhead)
    if name == "no-io":
        return NoIOPolicy(job, sizes, hw, overhead=overhead)
    raise ConfigError(f"unknown policy {name!r}: choose from {', '.join(POLICIES)}")
