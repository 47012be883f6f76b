"""MECHANISM: with samplers but without every node's orders, a cluster node fetches its coming reads ahead.

The fallback of mount/cluster/plan.py, for an epoch whose orders did not come from every node.

The node's samplers publish their orders (mount/orders.py); merged into the node's sequence as
the Loader merges its ranks' batches (plan/sequence.py ``interleave``), they say which files the
node reads next. A window of ``WINDOW`` files ahead of the readers' progress, each file is made
ready where the cluster keeps it (``MountCluster.ahead``): one of this node's own files absent from
its tier is staged by the mount's file engine (if the home's policy keeps it, plan/unplanned.py),
as far as staging slots are free; another
node's file is fetched from its home into the handoff directory, where the daemon's ask then finds
it at once. So the store is read once per file across the cluster while the homes have room, and
the readers wait neither for the store nor for a peer. (The homes are the hashed ones of a cluster
without samplers, or the plan's once the nodes planned together; files are kept by recency.)
"""

from __future__ import annotations

from ...plan.cluster_walk import WINDOW
from ...plan.sequence import interleave
from ..numbering import Numbered
from ..orders import WATCH_EVERY
from ..walk import Following, Parts


class ClusterAhead(Following):
    """The published orders ``cur`` (``key``: their plan key; ``numbers``: each rank's, ranks in
    order) fetched ahead by ``cluster`` (``run``)."""

    def __init__(self, cluster, cur: dict, key: tuple, numbers: list[Numbered], parts: Parts) -> None:
        super().__init__(cur, key, parts)
        self._cluster = cluster
        self._seq = interleave([n.files for n in numbers], [n.counts for n in numbers]).samples

    def run(self) -> None:
        p, seq, done = self._p, self._seq, 0
        while not self._moved():
            upto = min(len(seq), self._progress().together + WINDOW)   # (how far the readers are along it)
            while done < upto and self._cluster.ahead(int(seq[done])):   # False: no staging slot free now
                done += 1
            p.counters.set(frontier=done)
            p.counters.maybe_publish()
            p.stop.wait(WATCH_EVERY)
