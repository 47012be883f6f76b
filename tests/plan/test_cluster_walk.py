"""plan/cluster_walk.py: the decisions of a cluster of mounts with samplers, pure. Each check has a
control that fails on the wrong decision."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from clairvoyant.plan.cluster_walk import (LAG, WINDOW, Duty, NodeDuty, WalkCursor, cluster_plan, node_duty, orders_complete,
                                           plan_homes)


def _duty(n: int, *, stage=(), fetch=(), cuts=(), late=()) -> NodeDuty:
    """A node of one rank reading files 100..100+n-1 at steps 0..n-1."""
    return NodeDuty(files=np.arange(100, 100 + n, dtype=np.int64), steps=np.arange(n, dtype=np.int64),
                    duty=Duty({}, frozenset()), drop_at_start=np.zeros(0, np.int64),
                    stage=np.asarray(stage, np.int64), fetch=np.asarray(fetch, np.int64),
                    cuts=np.asarray(cuts, np.int64), late=np.asarray(late, np.int64).reshape(-1, 2))


class Effects:
    def __init__(self, room: int = 1 << 30, read: set | None = None) -> None:
        self.evicted, self.asked, self.staged, self.room, self.read = [], [], [], room, read or set()

    def advance(self, walk: WalkCursor, handed: int) -> None:
        walk.advance(handed, self.read.__contains__, self.evicted.append, self.asked.append, self._stage)

    def _stage(self, g: int) -> bool:
        if self.room <= 0:
            return False
        self.room -= 1
        self.staged.append(g)
        return True


def test_stagings_go_ahead_of_the_readers_within_the_window_past_the_margin():
    """Own files to stage: none within the margin of the readers (their reader may read it now),
    none past the window; in order. Control: a later look moves the window on."""
    n = 2 * WINDOW
    walk, fx = WalkCursor(_duty(n, stage=range(n)), ranks=1, margin=32), Effects()
    fx.advance(walk, 0)
    assert fx.staged == list(range(100 + 32, 100 + WINDOW))   # [margin, window)
    fx.advance(walk, 100)
    assert fx.staged[-1] == 100 + 100 + WINDOW - 1 and 100 + WINDOW in fx.staged   # control: moved on
    assert fx.staged == sorted(set(fx.staged))   # each once, in order


def test_a_refused_staging_waits_and_is_tried_again_first():
    """No room (or no slot): the walk stops at that file and starts there at the next look; files
    behind it are not skipped. Control: with room all go at once."""
    walk, fx = WalkCursor(_duty(50, stage=range(50)), ranks=1, margin=0), Effects(room=3)
    fx.advance(walk, 0)
    assert fx.staged == [100, 101, 102]
    fx.room = 100
    fx.advance(walk, 0)
    assert fx.staged == list(range(100, 150))
    walk2, fx2 = WalkCursor(_duty(50, stage=range(50)), ranks=1, margin=0), Effects()
    fx2.advance(walk2, 0)
    assert fx2.staged == list(range(100, 150))


def test_the_window_is_shared_by_the_nodes_ranks():
    """With 4 ranks the window ahead of each is WINDOW // 4 steps. Control: 1 rank, WINDOW steps."""
    n = WINDOW
    for ranks, want in ((4, WINDOW // 4), (1, WINDOW)):
        walk, fx = WalkCursor(_duty(n, fetch=range(n)), ranks=ranks, margin=0), Effects()
        fx.advance(walk, 0)
        assert len(fx.asked) == want, (ranks, len(fx.asked))


def test_fetches_skip_what_the_readers_were_handed_already():
    """A peer's file handed out already is asked for by its reader now: not fetched ahead. Control:
    the ones still ahead are."""
    walk, fx = WalkCursor(_duty(40, fetch=range(40)), ranks=1, margin=0), Effects()
    fx.advance(walk, 10)
    assert fx.asked == list(range(110, 140))


def test_a_cut_waits_for_the_read_or_LAG_then_spares_a_file_staged_again():
    """A file cut after the node's read goes once the readers are past it and the read was
    reported, or LAG past it unreported; a file staged again for a later read meanwhile stays.
    Controls: unreported and within LAG, it stays; the restaged file is the only one spared."""
    d = _duty(LAG + 20, cuts=[0, 1])
    d.files[LAG + 10] = d.files[1]   # file 101 is read again at step LAG + 10, staged for it
    d.stage = np.array([LAG + 10])
    walk, fx = WalkCursor(d, ranks=1, margin=0), Effects()
    fx.advance(walk, 5)
    assert fx.evicted == [] and fx.staged == []   # read not reported, within LAG: stays
    fx.advance(walk, 20)                      # 101's later read comes into the window: staged again
    assert fx.staged == [101] and fx.evicted == []
    fx.read.add(100)
    fx.advance(walk, 20)
    assert fx.evicted == [100]                # reported: goes
    fx.advance(walk, LAG + 2)                 # 101's first read is LAG behind now
    assert fx.evicted == [100]                # spared: staged for its later read


def test_late_drops_go_LAG_after_the_peers_read():
    """A file deleted after a peer's read goes once the readers are LAG past that step. Control:
    not before."""
    walk, fx = WalkCursor(_duty(10, late=[[5, 777]]), ranks=1, margin=0), Effects()
    fx.advance(walk, 5 + LAG)
    assert fx.evicted == []
    fx.advance(walk, 6 + LAG)
    assert fx.evicted == [777]


def _orders(node: int, files: list[int], residents: dict[int, int], capacity: int = 10**9):
    counts = np.ones(len(files), np.int64)
    r = SimpleNamespace(files=np.asarray(files, np.int64), counts=counts, next_files=np.zeros(0, np.int64),
                        next_counts=np.zeros(0, np.int64))
    return SimpleNamespace(node=node, epoch=0, capacity=capacity, residents=residents, ranks={node: r})


def test_homes_keep_what_a_tier_holds_and_give_the_rest_to_its_first_reader():
    """A file a tier holds already stays there; another goes to the node that reads it first in
    the epoch; a file nobody reads keeps its fallback. Control: without residents, the first reader."""
    orders = [_orders(0, [0, 1, 2], {3: 10}), _orders(1, [2, 3, 0], {})]
    fallback = np.array([1, 1, 0, 0, 1], np.int32)
    homes = plan_homes(orders, fallback, np.full(5, 10))
    assert homes.tolist() == [0, 0, 1, 0, 1]   # 2: node 1 reads it at step 0, node 0 at step 2; 3: held by 0
    plain = plan_homes([_orders(0, [0, 1, 2], {}), _orders(1, [2, 3, 0], {})], fallback, np.full(5, 10))
    assert plain[3] == 1 and plain[2] == 1 and plain[4] == 1


def test_a_nodes_duty_follows_the_plan():
    """node_duty over a real plan: it stages exactly its own files the plan keeps at a read that
    misses, reads from peers exactly the plan's peer reads, and reads from the store the others'
    files the plan sends there. Control: another node's duty differs."""
    rng = np.random.default_rng(0)
    n, sizes = 40, np.full(40, 100, np.int64)
    orders = [_orders(k, rng.permutation(n).tolist(), {}, capacity=1500) for k in range(2)]
    homes = plan_homes(orders, np.zeros(n, np.int32), sizes)
    plan = cluster_plan(orders, homes, sizes)
    for node in (0, 1):
        v = plan.for_node(node)
        d = node_duty(v, homes, node)
        own = homes[v.samples] == node
        assert d.stage.tolist() == np.flatnonzero(own & v.keep & ~v.hit).tolist()
        assert d.fetch.tolist() == np.flatnonzero(v.peer >= 0).tolist()
        assert d.duty.store == frozenset(v.samples[~own & (v.peer < 0)].tolist())
        assert all(homes[g] == node for g in d.duty.keep)
    assert node_duty(plan.for_node(0), homes, 0).duty.keep != node_duty(plan.for_node(1), homes, 1).duty.keep


def _node_orders(node: int, world: int, files: list[int], residents: dict | None = None):
    from clairvoyant.mount.cluster.orders import NodeOrders
    from clairvoyant.mount.numbering import Numbered
    f = np.asarray(files, np.int64)
    one = np.ones(len(f), np.int64)
    return NodeOrders(node, 0, world, 10**9, {node: Numbered(f, one, f, one)}, residents or {})


def test_a_lost_node_leaves_a_dense_plan_of_the_others_and_its_files_homed_among_them():
    """Node 2 of 4 lost: the orders of nodes 0, 1 and 3 are planned as nodes 0..2 with ranks 0..2;
    node 2's files go to their first reader among the three (file 6: node 3 reads it first), a file
    none of them reads to one of them by its number; the others' homes stay. Control: with every
    node there, the orders and homes are as they were."""
    from clairvoyant.plan.cluster_walk import dense_homes, survivors

    orders = [_node_orders(0, 4, [0, 1]), _node_orders(1, 4, [2, 3]), _node_orders(3, 4, [6, 7, 4])]
    dense, nodes_of = survivors(orders)
    assert nodes_of.tolist() == [0, 1, 3]
    assert [o.node for o in dense] == [0, 1, 2] and [sorted(o.ranks) for o in dense] == [[0], [1], [2]]
    assert all(o.world_size == 3 for o in dense)
    homes = np.array([0, 0, 1, 1, 2, 2, 2, 3, 2], np.int32)   # files 4, 5, 6, 8 were node 2's
    got = dense_homes(homes, nodes_of, 4, dense)
    assert got.tolist()[:4] == [0, 0, 1, 1] and got[7] == 2   # kept (as plan indices)
    assert got[4] == 2 and got[6] == 2                         # first read by node 3 (plan index 2)
    assert got[5] == 5 % 3 and got[8] == 8 % 3                 # read by none: by number
    assert (got == dense_homes(homes, nodes_of, 4, dense)).all()   # the same on every node
    whole = [_node_orders(n, 4, [n]) for n in range(4)]           # control
    same, ident = survivors(whole)
    assert same == whole and ident.tolist() == [0, 1, 2, 3]
    assert dense_homes(homes, ident, 4, same).tolist() == homes.tolist()


def test_gathered_orders_are_an_epochs_when_every_rank_is_there_once_or_a_lost_nodes_are_missing():
    """Every rank of the world once: complete. A rank missing: not, unless a node was lost
    (``partial``) and every node there has as many ranks as at the last whole gather. Controls: a
    rank twice, two world sizes, a node with fewer ranks than before, no ranks at all: never."""
    def node(n, ranks, world=4):
        return SimpleNamespace(node=n, ranks=dict.fromkeys(ranks), world_size=world)
    whole = [node(0, [0, 1]), node(1, [2, 3])]
    assert orders_complete(whole, False, {})
    assert not orders_complete([node(0, [0, 1]), node(1, [2])], False, {})   # a rank not published yet
    assert orders_complete([node(0, [0, 1])], True, {0: 2, 1: 2})             # node 1 lost
    assert not orders_complete([node(0, [0])], True, {0: 2, 1: 2})            # control: node 0 behind
    assert not orders_complete([node(0, [0, 1]), node(1, [1, 2])], True, {})  # control: rank 1 twice
    assert not orders_complete([node(0, [0, 1]), node(1, [2, 3], world=5)], True, {})   # control: two worlds
    assert not orders_complete([node(0, [])], True, {})                       # control: nothing published
