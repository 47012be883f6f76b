"""POLICY: the decisions of a cluster of mounts with samplers (pure: mount/cluster/plan.py gathers
the nodes' orders, asks these and carries out what they say).

The plan of the nodes' published orders (:func:`cluster_plan`: the cluster sequence is every
rank's order interleaved index by index, ranks by their global number; the next epoch's too where
every rank sent one; ``plan_cluster_sequence`` over it) and the homes the nodes fix at their first
plan together (:func:`plan_homes`: a file a tier holds already stays there within the node's fair
share, read before that plan because the nodes' samplers start at different times; any other, its
first reader; the fallback, hashed homes, for the rest). The orders are any objects with ``node``, ``epoch``, ``capacity``,
``residents`` and ``ranks`` (global rank -> its ``files``, ``counts``, ``next_files``,
``next_counts``), as mount/cluster/orders.py decodes them.

How a node carries out its part, step by step ahead of its readers:

From the plan's view of this node (``plan/cluster.NodeView``) and the homes, :func:`node_duty`
works out once what the node does in the epoch: which of its own files it keeps after its read
(``keep``), which others' files it reads from the store (``store``), which of its files go once a
peer has them (``cut_on_serve``), the residents to delete at the start, the files to take over
from their hashed homes at the first plan (read before the nodes planned together), and the
access indices to stage, to fetch from peers and to cut. Then :class:`WalkCursor` says, each time
the readers' progress (``handed``: the index the slowest of the node's ranks was handed) is
looked at, what to do now, in this order:

- **cuts first** (they free room): a file of its own that the plan deletes after the node's read
  goes once the readers are past it and the daemon reported the read, or ``LAG`` indices past it
  unreported (the DataLoader reads behind the sampler); one deleted after a peer's read, ``LAG``
  indices after that read. A file staged again for a later read meanwhile stays;
- **fetches from peers**, ``WINDOW // ranks`` indices ahead of the readers (one handed out
  already is asked for by its reader now);
- **stagings** of its own files from the store, in order, as far ahead, none within ``margin`` of
  the readers (its reader may be reading it: both would read the store; its copy is kept from
  that read), each only while the tier has room for it and the mount takes it (``stage`` says).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Callable, Sequence

import numpy as np

from .cluster import ClusterEpoch, first_readers, keep_held, plan_cluster_sequence
from .layout import NodeLayout
from .sequence import Interleaved, interleave

WINDOW = 256   # files ahead of the readers (staged from the store, or fetched from a peer)
LAG = 256      # indices the readers are past a read of one of its files before it is deleted unheard


def _cluster_sequence(orders: Sequence[Any]) -> tuple[dict, list[int], NodeLayout, Interleaved]:
    """The nodes' ranks (global rank -> its order), in order, their layout, and the epoch's cluster
    sequence: every rank's indices interleaved index by index, ranks by their global number."""
    ranks = {r: x for o in orders for r, x in o.ranks.items()}
    world = sorted(ranks)
    layout = NodeLayout(tuple(tuple(sorted(o.ranks)) for o in orders))
    return ranks, world, layout, interleave([ranks[r].files for r in world], [ranks[r].counts for r in world])


def cluster_plan(orders: Sequence[Any], homes: np.ndarray, sizes: np.ndarray) -> ClusterEpoch:
    """The plan of the epoch the nodes' ``orders`` are of (one per node, in node order): the cluster
    sequence, the next epoch's where every rank sent one, every tier's capacity and residents."""
    ranks, world, layout, seq = _cluster_sequence(orders)
    following = (interleave([ranks[r].next_files for r in world], [ranks[r].next_counts for r in world]).samples
                 if all(len(ranks[r].next_counts) for r in world) else np.zeros(0, np.int64))
    return plan_cluster_sequence(seq, following, home=homes, layout=layout, capacities=[o.capacity for o in orders],
                                 sizes=sizes, residents=[o.residents for o in orders], epoch=orders[0].epoch)


def plan_homes(orders: Sequence[Any], fallback: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    """The homes the nodes fix from these orders: a file a tier holds already stays there (read
    before the nodes first planned together: kept by its hashed home, or read by the node itself;
    kept by the others while a node was lost) within the node's fair share (``keep_held``); any
    other, its first reader in the epoch; ``fallback`` for the rest."""
    _, _, layout, seq = _cluster_sequence(orders)
    return keep_held(first_readers(seq, layout, fallback), [o.residents for o in orders], sizes,
                     [o.capacity for o in orders])   # (orders in node order)


def survivors(orders: Sequence[Any]) -> tuple[list[Any], np.ndarray]:
    """The orders of the nodes there (a node of the cluster lost: its orders never come), numbered
    densely for the plan: nodes 0..K-1 in node order, their ranks 0..W-1 in global order; and the
    node each stands for. With every node there, the orders as they are."""
    nodes_of = np.array([o.node for o in orders], np.int32)
    world = sorted(r for o in orders for r in o.ranks)
    if list(nodes_of) == list(range(len(orders))) and world == list(range(orders[0].world_size)):
        return list(orders), nodes_of
    new = {r: i for i, r in enumerate(world)}
    dense = [replace(o, node=i, world_size=len(world), ranks={new[r]: x for r, x in o.ranks.items()})
             for i, o in enumerate(orders)]
    return dense, nodes_of


def orders_complete(orders: Sequence[Any], partial: bool, ranks_of: dict[int, int]) -> bool:
    """Whether the nodes' ``orders`` gathered (mount/cluster/orders.py) are an epoch's: one world
    size, and every rank of it once; or (``partial``: a node lost, its ranks' orders never come)
    distinct ranks of it, each node with as many ranks as at the last gather of every node
    (``ranks_of``, node -> ranks: fewer means a sampler of its has not published yet)."""
    ranks = sorted(r for o in orders for r in o.ranks)
    worlds = {o.world_size for o in orders}
    if len(worlds) != 1:
        return False
    world = worlds.pop()
    if ranks == list(range(world)):
        return True
    return (partial and bool(ranks) and len(set(ranks)) == len(ranks) and 0 <= ranks[0] and ranks[-1] < world
            and all(len(o.ranks) >= ranks_of.get(o.node, 1) for o in orders))


def dense_homes(homes: np.ndarray, nodes_of: np.ndarray, total: int, dense: Sequence[Any]) -> np.ndarray:
    """``homes`` (node numbers of a cluster of ``total``) as the plan's node indices (``nodes_of``:
    :func:`survivors`): a file homed at a node lost goes to its first reader among the nodes there
    in this epoch (``dense``: their orders), else to one of them by its number; identical on every
    node that gathered the same orders."""
    pos = np.full(total, -1, np.int32)
    pos[nodes_of] = np.arange(len(nodes_of), dtype=np.int32)
    out = pos[np.asarray(homes, np.int64)]
    lost = out < 0
    if lost.any():
        _, _, layout, seq = _cluster_sequence(dense)
        spread = (np.arange(len(out)) % len(nodes_of)).astype(np.int32)
        out[lost] = first_readers(seq, layout, spread)[lost]
    return out


@dataclass
class Duty:
    """What a home consults of its part of the plan when it serves and keeps (mount/cluster/node.py):
    ``keep``, its own files it reads this epoch -> kept after the read; ``store``, other homes'
    files it reads from the store; ``cut_on_serve``, its files to delete once a peer has them."""

    keep: dict[int, bool]
    store: frozenset
    cut_on_serve: set[int] = field(default_factory=set)


@dataclass
class NodeDuty:
    """What one node does in an epoch of the cluster plan (module docstring)."""

    files: np.ndarray          # the file of each of the node's accesses, in node order
    steps: np.ndarray          # per access, its index among its rank's
    duty: Duty                 # what the home consults when it serves and keeps
    drop_at_start: np.ndarray  # residents deleted when the epoch starts
    stage: np.ndarray          # access indices: own files read from the store and kept
    fetch: np.ndarray          # access indices: read from a peer's tier
    cuts: np.ndarray           # access indices: own files deleted after this read
    late: np.ndarray           # rows (step, file): own files deleted after a peer's read at that step

    def take_over(self, handed: int) -> np.ndarray:
        """Files to stage whose readers were handed them before the plan came (the first plan:
        their copies are held by their hashed homes)."""
        return self.files[self.stage[self.steps[self.stage] < handed]]


def node_duty(view, home: np.ndarray, node: int) -> NodeDuty:
    """This node's duty from the plan's view of it and the homes (plan/cluster.py)."""
    f = view.samples
    own = home[f] == node
    keep: dict[int, bool] = {}
    for i in np.flatnonzero(own).tolist():   # (a file read twice by the node: kept if either read keeps it)
        keep[int(f[i])] = keep.get(int(f[i]), False) or bool(view.keep[i])
    late = view.late_drops if len(view.late_drops) else np.zeros((0, 2), np.int64)
    once = late[view.late_once, 1] if len(late) else np.zeros(0, np.int64)
    return NodeDuty(files=f, steps=view.step.astype(np.int64),
                    duty=Duty(keep, frozenset(f[~own & (view.peer < 0)].tolist()), set(once.tolist())),
                    drop_at_start=view.drop_at_start, stage=np.flatnonzero(own & view.keep & ~view.hit),
                    fetch=np.flatnonzero(view.peer >= 0), cuts=np.flatnonzero(own & view.hit & ~view.keep),
                    late=late)


@dataclass
class WalkCursor:
    """How far the walk of ``duty`` has got (module docstring); ``ranks``: the node's ranks;
    ``margin``: indices past the readers' reported progress that may be handed out already
    (progress comes every so many: nothing there is staged from the store)."""

    duty: NodeDuty
    ranks: int
    margin: int
    staged_at: dict[int, int] = field(default_factory=dict)   # file -> the step of its latest staging
    s: int = 0    # next in duty.stage
    fe: int = 0   # next in duty.fetch
    c: int = 0    # next in duty.cuts
    lt: int = 0   # next in duty.late

    def advance(self, handed: int, was_read: Callable[[int], bool], evict: Callable[[int], object],
                ask: Callable[[int], object], stage: Callable[[int], bool]) -> None:
        """What to do now the readers were handed index ``handed``: ``evict(file)`` the cuts due,
        ``ask(file)`` the fetches in the window, ``stage(file)`` the stagings in the window while
        it says True (False: no room, or the mount takes no more now: the rest wait)."""
        d, steps, f = self.duty, self.duty.steps, self.duty.files
        while self.c < len(d.cuts) and steps[d.cuts[self.c]] < handed:
            i = int(d.cuts[self.c])
            g = int(f[i])
            if steps[i] + LAG >= handed and not was_read(g):
                break   # its read may not have come yet (the DataLoader reads behind the sampler)
            if self.staged_at.get(g, -1) <= steps[i]:
                evict(g)
            self.c += 1
        while self.lt < len(d.late) and d.late[self.lt, 0] + LAG < handed:
            g = int(d.late[self.lt, 1])
            if self.staged_at.get(g, -1) <= d.late[self.lt, 0]:
                evict(g)
            self.lt += 1
        ahead = np.searchsorted(steps, handed + WINDOW // max(1, self.ranks), side="left")
        while self.fe < len(d.fetch) and d.fetch[self.fe] < ahead:
            if steps[d.fetch[self.fe]] >= handed:   # (one handed out already: its reader asks for it now)
                ask(int(f[d.fetch[self.fe]]))
            self.fe += 1
        while self.s < len(d.stage) and d.stage[self.s] < ahead:
            i = int(d.stage[self.s])
            if steps[i] >= handed + self.margin:
                if not stage(int(f[i])):
                    break   # the readers free room as they go (the plan fits the tier at each read)
                self.staged_at[int(f[i])] = int(steps[i])
            self.s += 1

    def frontier(self) -> int:
        """The farthest access index handed on so far (staged or fetched)."""
        d = self.duty
        return int(max(d.stage[self.s - 1] if self.s else 0, d.fetch[self.fe - 1] if self.fe else 0))
