"""plan_rank_epoch: each rank's slice of the node's residency plan, and nothing else."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from clairvoyant.plan import plan_epoch
from clairvoyant.plan.layout import rank_on_node as Layout
from clairvoyant.plan.rank_plan import PlanConfig, plan_rank_epoch
from clairvoyant.plan.residency import simulate_epoch
from clairvoyant.plan.sequence import node_sequence


def node_plans(n, sizes, config, world, node, epoch, capacity, residents, position):
    return [plan_rank_epoch(sizes, config, Layout(r, world, node), epoch=epoch, capacity=capacity,
                            residents=residents, position=position) for r in node]


@settings(max_examples=40, deadline=None)
@given(n=st.integers(5, 300), batch=st.integers(1, 9), nodes=st.integers(1, 3), per_node=st.integers(1, 3),
       cap=st.floats(0.0, 1.2), epoch=st.integers(0, 3), drop_last=st.booleans(), at=st.floats(0, 1),
       data=st.data())
def test_ranks_of_a_node_share_out_the_node_plan(n, batch, nodes, per_node, cap, epoch, drop_last, at, data):
    world = nodes * per_node
    config = PlanConfig(n, batch, seed=7, drop_last=drop_last)
    sizes = np.random.default_rng(n).integers(10, 100, n)
    capacity = max(int(sizes.max()), int(cap * sizes.sum()))
    position = int(at * n)
    residents = {int(s): int(sizes[s]) for s in data.draw(st.sets(st.integers(0, n - 1), max_size=8))}
    while sum(residents.values()) > capacity:
        residents.pop(next(iter(residents)))
    first = per_node * data.draw(st.integers(0, nodes - 1))
    node = range(first, first + per_node)
    plans = node_plans(n, sizes, config, world, node, epoch, capacity, residents, position)
    seq = node_sequence(n, seed=7, epoch=epoch, world_size=world, ranks=node, batch_size=batch,
                        drop_last=drop_last, position=position)
    following = node_sequence(n, seed=7, epoch=epoch + 1, world_size=world, ranks=node, batch_size=batch,
                              drop_last=drop_last)
    res = simulate_epoch(seq, following, sizes, capacity, dict(residents))
    # the batches are plan_epoch's; their hit/keep, interleaved step by step, are the node plan's
    for p in plans:
        ref = plan_epoch(n, seed=7, epoch=epoch, rank=p.rank, world_size=world, batch_size=batch,
                         drop_last=drop_last, position=position)
        assert [b.tolist() for b in p.batches] == [b.tolist() for b in ref.batches]
    steps = len(plans[0])
    inter = [(p.batches[b], p.hit[b], p.keep[b]) for b in range(steps) for p in plans]
    cat = lambda i: np.concatenate([x[i] for x in inter]) if inter else np.zeros(0)  # noqa: E731
    assert cat(0).tolist() == seq.tolist()
    assert cat(1).tolist() == res.hit.tolist() and cat(2).tolist() == res.keep.tolist()
    # every resident the node drops is dropped by exactly one of its ranks
    drops = [s for p in plans for s in p.drops]
    assert sorted(drops) == sorted(res.drop_at_start)
    assert all(p.residents_after == res.residents_after for p in plans)


def test_the_node_check_sees_a_rank_plan_of_another_node():
    """Negative control: a rank that plans with the wrong node's ranks gets another node's actions."""
    n, sizes = 400, np.full(400, 50)
    config = PlanConfig(n, 8, seed=3)
    right = plan_rank_epoch(sizes, config, Layout(0, 4, range(0, 2)), epoch=1, capacity=50 * 60, residents={})
    wrong = plan_rank_epoch(sizes, config, Layout(0, 4, range(0, 1)), epoch=1, capacity=50 * 60, residents={})
    assert [b.tolist() for b in right.batches] == [b.tolist() for b in wrong.batches]
    assert np.concatenate(right.keep).tolist() != np.concatenate(wrong.keep).tolist()
    assert right.residents_after != wrong.residents_after


def test_late_drops_read_once_go_when_served():
    """A home sample a peer reads last may be deleted as soon as that peer has been served, unless
    the epoch reads it twice (a padded twin): those wait for the step lag."""
    from clairvoyant.plan.rank_plan import cluster_tiers as ClusterSpec
    from clairvoyant.plan.sequence import cluster_sequence
    n, nodes = 203, 4   # 203 on 4 ranks: one padded sample read twice
    sizes = np.random.default_rng(3).integers(10, 30, n)
    cfg = PlanConfig(num_samples=n, batch_size=4, seed=5)
    spec = ClusterSpec(tuple(range(r, r + 1) for r in range(nodes)), 0, (int(0.1 * sizes.sum()),) * nodes)
    seq = cluster_sequence(n, seed=5, epoch=1, batch_size=4, world_size=nodes)[0]
    twice = {int(s) for s in np.flatnonzero(np.bincount(seq, minlength=n) > 1)}
    seen_once = 0
    for r in range(nodes):
        spec_r = ClusterSpec(spec.nodes, r, spec.capacities)
        p0 = plan_rank_epoch(sizes, cfg, Layout(r, nodes, range(r, r + 1)), epoch=0, capacity=0, residents={},
                             cluster=spec_r)
        spec1 = ClusterSpec(spec.nodes, r, spec.capacities, p0.cluster_residents)
        p = plan_rank_epoch(sizes, cfg, Layout(r, nodes, range(r, r + 1)), epoch=1, capacity=0, residents={},
                            cluster=spec1)
        late = {s for _, s in p.late_drops}
        assert p.late_on_serve == late - twice
        seen_once += len(p.late_on_serve)
    assert seen_once > 0 and twice   # the case is exercised
