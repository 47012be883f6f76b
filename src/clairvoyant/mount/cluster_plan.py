"""MECHANISM: with samplers, a cluster of mounts runs the Loader's cluster plan (plan/cluster.py).

Each node's samplers publish their orders of an epoch in its local directory; the node offers them
to the others (mount/cluster_orders.py) and gathers theirs, so that every node holds every rank's
order of the epoch, every tier's capacity and residents, and plans the whole cluster alike:

- **the cluster sequence**: every rank's indices interleaved index by index, ranks by their global
  number (plan/sequence.py ``interleave``; a node's own part is the sequence its walk follows);
- **the homes**: a file's home is the node that reads it first in the first epoch the nodes plan
  together (``first_readers``; a file that epoch leaves out keeps its hashed home), or the node
  whose tier holds it then (read before that plan: the samplers of the nodes start at different
  times), fixed for the job: a node that joins later takes them from a peer (``HOMES``). The
  daemon learns them from the homes file it maps;
- **each home keeps its files by farthest next use** over every node's reads, looking into the
  next epoch, a miss kept only where the home itself reads it (``plan_cluster_sequence``).

This node then carries out its part (``NodeView``), ahead of its ranks' reported progress:

- at the start, the residents the plan lets go are deleted; at the first plan, its own files that
  its readers read before it (kept then by their hashed homes) are fetched from there and kept;
- its own files that the plan keeps at their read are read from the store and kept, ``WINDOW``
  files ahead, within the tier's capacity (staging waits for room the readers free); none within
  ``MARGIN`` of the reported progress (its reader may be reading it: both would read the store),
  whose copy is kept from the reader's read instead;
- the files it will read from a peer's tier are fetched from there ahead, into the handoff
  directory, where the daemon's ask finds them; an ask for a file the plan reads from the store
  is answered at once (no round trip to a home that does not hold it);
- a file of its own that the plan cuts after a read is deleted once the daemon reported that read
  and the readers were handed past it (or ``LAG`` indices past it, unreported); one cut after a
  peer's read goes once served, if that read is the epoch's only one, else ``LAG`` indices after
  it. A file staged again for a later read meanwhile stays.

Where the nodes' orders do not all come within ``GATHER_WAIT`` (a node without samplers, one that
is gone, samplers on different epochs; ``QUICK_WAIT`` for nodes that offered nothing the epoch
before either), the node runs the epoch as a cluster without a sampler's plan: hashed or planned
homes with recency, its coming reads fetched ahead (mount/cluster_ahead.py).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

import numpy as np

from ..cache.entry import entry_size
from ..cache.node import residents
from ..plan.cluster import ClusterEpoch, first_readers, plan_cluster_sequence
from ..plan.layout import NodeLayout
from ..plan.sequence import Interleaved, interleave
from .cluster_orders import GATHER_WAIT, NodeOrders, gather
from .numbering import Numbered
from .orders import PROGRESS_EVERY, WATCH_EVERY, read_progress
from .walk import Parts

log = logging.getLogger("clairvoyant")
WINDOW = 256   # files ahead of the readers (staged from the store, or fetched from a peer)
MARGIN = PROGRESS_EVERY   # indices past the reported progress that may be handed out already: not staged
LAG = 256      # indices the readers are past a read of one of its files before it is deleted unheard
               # (the daemon's report of the read lets it go as soon as the readers are past it)


@dataclass
class Duty:
    """What the cluster (mount/cluster.py) consults in this node's part of the plan: ``keep``, its
    own files it reads this epoch -> kept after the read; ``store``, other homes' files it reads
    from the store; ``cut_on_serve``, its files to delete once a peer has them."""

    keep: dict[int, bool]
    store: frozenset[int]
    cut_on_serve: set[int] = field(default_factory=set)


def _cluster_sequence(orders: list[NodeOrders]) -> tuple[dict, list[int], NodeLayout, Interleaved]:
    """The nodes' ranks (global rank -> its order), in order, their layout, and the epoch's cluster
    sequence: every rank's indices interleaved index by index, ranks by their global number."""
    ranks = {r: x for o in orders for r, x in o.ranks.items()}
    world = sorted(ranks)
    layout = NodeLayout(tuple(tuple(sorted(o.ranks)) for o in orders))
    return ranks, world, layout, interleave([ranks[r].files for r in world], [ranks[r].counts for r in world])


def cluster_plan(orders: list[NodeOrders], homes: np.ndarray, sizes: np.ndarray) -> ClusterEpoch:
    """The plan of the epoch the nodes' ``orders`` are of (one per node, in node order): the cluster
    sequence, the next epoch's where every rank sent one, every tier's capacity and residents."""
    ranks, world, layout, seq = _cluster_sequence(orders)
    following = (interleave([ranks[r].next_files for r in world], [ranks[r].next_counts for r in world]).samples
                 if all(len(ranks[r].next_counts) for r in world) else np.zeros(0, np.int64))
    return plan_cluster_sequence(seq, following, home=homes, layout=layout, capacities=[o.capacity for o in orders],
                                 sizes=sizes, residents=[o.residents for o in orders], epoch=orders[0].epoch)


def plan_homes(orders: list[NodeOrders], fallback: np.ndarray) -> np.ndarray:
    """The homes the nodes fix from these orders: a file a tier holds already stays there (read
    before the nodes first planned together: kept by its hashed home, or read by the node itself);
    any other, its first reader in the epoch; ``fallback`` for the rest."""
    _, _, layout, seq = _cluster_sequence(orders)
    homes = first_readers(seq, layout, fallback)
    for o in reversed(orders):   # (a file two tiers hold: the lower node's)
        held = np.fromiter(o.residents, np.int64, len(o.residents))
        homes[held[(held >= 0) & (held < len(homes))]] = o.node
    return homes


class ClusterWalk:
    """This node's part of the cluster plan of the published orders ``cur`` (``key``: their plan
    key; ``numbers``: each rank's, ranks in order): ``plan`` gathers and plans (False: the nodes'
    orders did not all come), ``run`` carries it out until newer orders are published."""

    def __init__(self, cluster, cur: dict, key: tuple, numbers: list[Numbered], parts: Parts) -> None:
        self._cl, self._p, self.key, self.current = cluster, parts, key, True
        self._ranks = sorted(cur)
        self.epoch = self._epoch = int(cur[self._ranks[0]].epoch)
        self._world = int(cur[self._ranks[0]].world_size)
        self._numbers = dict(zip(self._ranks, numbers))
        self._cur = cur
        self._snapshot: dict[int, int] = {}
        self.plan: ClusterEpoch | None = None
        self.handed = 0   # the slowest rank's progress at the last look

    def _moved(self) -> bool:
        p = self._p
        if p.stop.is_set():
            return True
        if p.changed() and p.current_key() != self.key:
            self.current = False
            return True
        return False

    def make_plan(self, wait: float | None = None) -> bool:
        """Offer this node's orders, gather every node's, fix the homes if none are, and plan."""
        cl = self._cl
        m = cl.mount
        sizes = cl.entry_sizes
        stamps = {r: int(self._cur[r].stamp) for r in self._ranks}
        held = cl.residents_for(self._epoch, stamps, lambda: residents(m.manifest, m.tiers.local.entries(), sizes))
        self._snapshot = held
        mine = NodeOrders(cl.node, self._epoch, self._world, int(m.tiers.local_capacity), self._numbers, held,
                          cl.basis, cl.homes_digest() if cl.basis >= 0 else 0)
        cl.offer(mine)
        cl.between_plans()
        t0 = time.monotonic()
        missing: set[int] = set()
        orders = gather(cl.fetch_control, cl.node, cl.nodes, self._epoch, mine, self._moved, len(sizes),
                        GATHER_WAIT if wait is None else wait, silent=cl.silent, missing=missing)
        cl.count(gather_seconds=time.monotonic() - t0)
        if orders is None:
            if self.current and not self._p.stop.is_set():
                cl.silent = missing   # (the next epoch waits less for them, if they still offer nothing)
            return False
        cl.silent = set()
        homes = cl.settle_homes(orders, lambda: plan_homes(orders, cl.hashed_homes))
        if homes is None:
            return False
        self.plan = cluster_plan(orders, homes[0], sizes)   # (a ConfigError leaves the homes as they were)
        cl.use_homes(*homes)
        return True

    # -- carried out ----------------------------------------------------------------------------

    def _handed(self) -> int:
        """The index the slowest of this node's ranks was handed (its progress file)."""
        at = []
        for r in self._ranks:
            epoch, pos = read_progress(self._p.orders_dir, r)
            at.append(pos if epoch == self._epoch else (1 << 62 if epoch > self._epoch else 0))
        return min(at) if at else 0

    def run(self) -> None:
        try:
            self._run()
        finally:
            self.handed = 1 << 62   # stagings still queued from this walk are too late now

    def _run(self) -> None:
        assert self.plan is not None
        cl, p = self._cl, self._p
        v = self.plan.for_node(cl.node)
        f = v.samples
        own = self.plan.home[f] == cl.node
        keep: dict[int, bool] = {}
        for i in np.flatnonzero(own).tolist():   # (a file read twice by the node: kept if either read keeps it)
            keep[int(f[i])] = keep.get(int(f[i]), False) or bool(v.keep[i])
        store = frozenset(f[~own & (v.peer < 0)].tolist())
        once = v.late_drops[v.late_once, 1] if len(v.late_drops) else np.zeros(0, np.int64)   # (also by LAG)
        cl.follow_plan(Duty(keep, store, set(once.tolist())))
        p.counters.new_plan(epoch=self._epoch, ranks=len(self._ranks), sequence=len(f), following=0)
        for g in v.drop_at_start.tolist():
            cl.evict(int(g))
        stage = np.flatnonzero(own & v.keep & ~v.hit)  # read from the store and kept here
        if cl.basis != self._epoch:   # kept since the snapshot the plan started from: the plan does not
            wanted = set(f[stage].tolist())   # count them; they go unless it stages them this epoch
            m = cl.mount
            now = residents(m.manifest, m.tiers.local.entries(), cl.entry_sizes)
            for g in now.keys() - self._snapshot.keys() - wanted:
                cl.evict(int(g))
        steps = v.step.astype(np.int64)               # per own access: its index among its rank's
        fetch = np.flatnonzero(v.peer >= 0)            # read from a peer's tier
        cuts = np.flatnonzero(own & v.hit & ~v.keep)   # deleted after this node's read
        late = v.late_drops if len(v.late_drops) else np.zeros((0, 2), np.int64)
        if cl.basis == self._epoch:   # the first plan: files read before it were kept by their hashed homes
            handed = self._handed()
            for i in stage[steps[stage] < handed].tolist():
                cl.take_over(int(f[i]), int(cl.hashed_homes[f[i]]))
        staged_at: dict[int, int] = {}   # file -> the step of its latest staging issued
        s = fe = c = lt = 0
        capacity = int(cl.mount.tiers.local_capacity)
        while not self._moved():
            handed = self.handed = self._handed()
            # deletions first: what the readers are LAG past (unless staged again for a later read)
            while c < len(cuts) and steps[cuts[c]] < handed:
                g = int(f[cuts[c]])
                if steps[cuts[c]] + LAG >= handed and not cl.was_read(g):
                    break   # its read may not have come yet (the DataLoader reads behind the sampler)
                if staged_at.get(g, -1) <= steps[cuts[c]]:
                    cl.evict(g)
                c += 1
            while lt < len(late) and late[lt, 0] + LAG < handed:
                g = int(late[lt, 1])
                if staged_at.get(g, -1) <= late[lt, 0]:
                    cl.evict(g)
                lt += 1
            ahead = np.searchsorted(steps, handed + WINDOW // max(1, len(self._ranks)), side="left")
            while fe < len(fetch) and fetch[fe] < ahead:
                if steps[fetch[fe]] >= handed:   # (one handed out already: its reader asks for it now)
                    cl.ask(int(f[fetch[fe]]), ahead=True)
                fe += 1
            while s < len(stage) and stage[s] < ahead:
                g = int(f[stage[s]])
                if steps[stage[s]] < handed + MARGIN:   # handed out already, or may be (progress comes every
                    s += 1                              # PROGRESS_EVERY): its reader reads it from the store
                    continue                            # now, and its copy is kept from there (read_own)
                if cl.used() + entry_size(int(cl.sizes[g])) > capacity:
                    break   # the readers free room as they go (the plan fits the tier at each read)
                if not cl.stage_own(g):
                    break   # no staging slot free: the copies under way go first
                staged_at[g] = int(steps[stage[s]])
                s += 1
            p.counters.set(frontier=int(max(stage[s - 1] if s else 0, fetch[fe - 1] if fe else 0)),
                           consumed=int(min(handed, 1 << 40)))
            p.counters.maybe_publish()
            p.stop.wait(WATCH_EVERY)
