"""MECHANISM: with samplers, a cluster of mounts runs the Loader's cluster plan (plan/cluster.py).

Each node's samplers publish their orders of an epoch in its local directory; the node offers them
to the others (mount/cluster/orders.py) and gathers theirs, so that every node holds every rank's
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

This node then carries out its part ahead of its ranks' reported progress, as
plan/cluster_walk.py decides it (``node_duty``, ``WalkCursor``: pure, and tested there): at the
start, the residents the plan lets go are deleted; at the first plan, its own files that its
readers read before it (kept then by their hashed homes) are fetched from there and kept; then,
step by step, the cuts due, the fetches from peers' tiers into the handoff directory (where the
daemon's ask finds them) and the stagings of its own files from the store through the mount's
file engine, within the tier's capacity. An ask for a file the plan reads from the store is
answered at once (no round trip to a home that does not hold it).

Where the nodes' orders do not all come within ``GATHER_WAIT`` (a node without samplers, one that
is gone, samplers on different epochs; ``QUICK_WAIT`` for nodes that offered nothing the epoch
before either), the node runs the epoch as a cluster without a sampler's plan: hashed or planned
homes with recency, its coming reads fetched ahead (mount/cluster/ahead.py).
"""

from __future__ import annotations

import logging
import time

import numpy as np

from ...cache.entry import entry_size
from ...cache.node import residents
from ...plan.cluster import ClusterEpoch
from ...plan.cluster_walk import WalkCursor, cluster_plan, dense_homes, node_duty, plan_homes, survivors
from ...cluster.timeouts import GATHER_WAIT
from .orders import NodeOrders, gather
from ..numbering import Numbered
from ..orders import PROGRESS_EVERY, WATCH_EVERY
from ..walk import Following, Parts

log = logging.getLogger("clairvoyant")
MARGIN = PROGRESS_EVERY   # indices past the reported progress that may be handed out already: not staged


class ClusterWalk(Following):
    """This node's part of the cluster plan of the published orders ``cur`` (``key``: their plan
    key; ``numbers``: each rank's, ranks in order): ``plan`` gathers and plans (False: the nodes'
    orders did not all come), ``run`` carries it out until newer orders are published."""

    def __init__(self, cluster, cur: dict, key: tuple, numbers: list[Numbered], parts: Parts) -> None:
        super().__init__(cur, key, parts)
        self._cl = cluster
        self.epoch = self._epoch
        self._world = int(cur[self._ranks[0]].world_size)
        self._numbers = dict(zip(self._ranks, numbers))
        self._cur = cur
        self._snapshot: dict[int, int] = {}
        self.plan: ClusterEpoch | None = None
        self._me = 0      # this node's index in the plan (its number, unless a node was lost before it)
        self.handed = 0   # the slowest rank's progress at the last look
        self.missing: set[int] = set()   # the nodes whose orders did not come (make_plan False)
        self.why = ""   # why make_plan gave False with every node's orders there

    def make_plan(self, wait: float | None = None) -> bool:
        """Offer this node's orders, gather every node's, fix the homes if none are, and plan."""
        cl = self._cl
        m = cl.mount
        sizes = cl.entry_sizes
        stamps = {r: int(self._cur[r].stamp) for r in self._ranks}
        cl.whole_again()    # (every node back: the whole cluster's homes again)
        cl.recheck_lost()   # (a node found lost that answers again is taken back at the next plan)
        held = cl.residents_for(self._epoch, stamps, lambda: residents(m.manifest, m.tiers.local.entries(), sizes))
        self._snapshot = held
        mine = NodeOrders(cl.node, self._epoch, self._world, int(m.tiers.local_capacity), self._numbers, held,
                          cl.basis, cl.homes_digest() if cl.basis >= 0 else 0)
        cl.offer(mine)
        cl.between_plans()
        t0 = time.monotonic()
        missing = self.missing
        orders = gather(cl.fetch_control, cl.node, cl.nodes, self._epoch, mine, self._moved, len(sizes),
                        GATHER_WAIT if wait is None else wait, silent=cl.silent, missing=missing,
                        lost=lambda: cl.link.lost, ranks_of=cl.node_ranks, on_absent=cl.check_lost)
        cl.count(gather_seconds=time.monotonic() - t0)
        if orders is None:
            if self.current and not self._p.stop.is_set():
                cl.silent = missing   # (the next epoch waits less for them, if they still offer nothing)
            return False
        cl.silent = set()
        if cl.link.was_lost and not cl.link.lost:   # a node came back during the gather: the orders offered
            self.why = ("a node came back while its orders were gathered (they offered the homes of the nodes "
                        "that were there); the next epoch is planned with every node")
            return False
        if len(orders) == cl.nodes:
            cl.node_ranks = {o.node: len(o.ranks) for o in orders}
        # a node lost: the plan is of the nodes there, numbered densely, the lost one's files homed
        # among them (plan/cluster_walk.py survivors, dense_homes); else the nodes as they are
        dense, nodes_of = survivors(orders)
        homes = cl.settle_homes(orders, lambda: nodes_of[plan_homes(dense, dense_homes(
            cl.hashed_homes, nodes_of, cl.nodes, dense), sizes)])
        if homes is None:
            self.why = "the cluster's homes could not be had from the peer that planned them"
            return False
        home = dense_homes(homes[0], nodes_of, cl.nodes, dense)
        self.plan = cluster_plan(dense, home, sizes)   # (a ConfigError leaves the homes as they were)
        self._me = int(np.flatnonzero(nodes_of == cl.node)[0])
        if len(nodes_of) < cl.nodes:
            log.warning("clairvoyant: node %d plans epoch %d with the %d nodes there (node(s) %s lost): their files "
                        "homed among these", cl.node, self._epoch, len(nodes_of),
                        sorted(set(range(cl.nodes)) - set(nodes_of.tolist())))
            cl.use_homes(nodes_of[home], homes[1], whole=False)
        else:
            cl.use_homes(*homes)
        return True

    # -- carried out ----------------------------------------------------------------------------

    def _handed(self) -> int:
        """The index the slowest of this node's ranks was handed (its progress file)."""
        return self._progress().slowest

    def run(self) -> None:
        try:
            self._run()
        finally:
            self.handed = 1 << 62   # stagings still queued from this walk are too late now

    def _run(self) -> None:
        assert self.plan is not None
        cl, p = self._cl, self._p
        d = node_duty(self.plan.for_node(self._me), self.plan.home, self._me)
        cl.follow_plan(d.duty)
        p.counters.new_plan(epoch=self._epoch, ranks=len(self._ranks), sequence=len(d.files), following=0)
        for g in d.drop_at_start.tolist():
            cl.evict(int(g))
        if cl.basis != self._epoch:   # kept since the snapshot the plan started from: the plan does not
            wanted = set(d.files[d.stage].tolist())   # count them; they go unless it stages them this epoch
            m = cl.mount
            now = residents(m.manifest, m.tiers.local.entries(), cl.entry_sizes)
            for g in now.keys() - self._snapshot.keys() - wanted:
                cl.evict(int(g))
        else:   # the first plan: files read before it were kept by their hashed homes
            for g in d.take_over(self._handed()).tolist():
                cl.take_over(int(g), int(cl.hashed_homes[g]))
        walk = WalkCursor(d, len(self._ranks), MARGIN)
        capacity = int(cl.mount.tiers.local_capacity)

        def stage(g: int) -> bool:   # room in the tier, and a staging slot free
            return cl.used() + entry_size(int(cl.sizes[g])) <= capacity and cl.stage_own(g)
        while not self._moved():
            handed = self.handed = self._handed()
            walk.advance(handed, cl.was_read, cl.evict, lambda g: cl.ask(g, ahead=True), stage)
            p.counters.set(frontier=walk.frontier(), consumed=int(min(handed, 1 << 40)))
            p.counters.maybe_publish()
            p.stop.wait(WATCH_EVERY)
