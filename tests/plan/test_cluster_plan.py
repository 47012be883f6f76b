"""The cluster plan: every sample has one home, the tiers together hold the data set once.

Checked against plain reimplementations (the sequence from plan_epoch's batches, the home by a
first-access scan, farthest-next-use per home with dicts), by replaying its actions on model tiers
(capacity, who holds what when a peer is asked), and against the node-by-node plan it replaces.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from clairvoyant.errors import ConfigError
from clairvoyant.plan import plan_epoch
from clairvoyant.plan import residency
from clairvoyant.plan.cluster import home_nodes, plan_cluster_epoch, plan_cluster_sequence
from clairvoyant.plan.layout import NodeLayout
from clairvoyant.plan.residency import simulate_epoch
from clairvoyant.plan.sequence import cluster_sequence, interleave, node_sequence

needs_c = pytest.mark.skipif(residency._c_simulate is None,
                             reason="the C helper is not built (or CLAIRVOYANT_NO_CEXT is set): nothing to compare")


@st.composite
def layouts(draw, max_world=6, max_nodes=4, min_nodes=1):
    world = draw(st.integers(min_nodes, max_world))
    nodes = draw(st.integers(min_nodes, min(world, max_nodes)))
    ranks = draw(st.permutations(range(world)))
    cuts = sorted(draw(st.lists(st.integers(1, world - 1), min_size=nodes - 1, max_size=nodes - 1, unique=True))
                  if nodes > 1 else [])
    bounds = [0, *cuts, world]
    return NodeLayout(tuple(tuple(ranks[a:b]) for a, b in zip(bounds, bounds[1:])))


# ---------------------------------------------------------------------------------------------
# plain references


def reference_sequence(n, *, seed, epoch, batch_size, world_size, drop_last, position):
    """(sample, rank, step) per access: step by step, rank by rank, from each rank's own batches."""
    per_rank = [plan_epoch(n, seed=seed, epoch=epoch, rank=r, world_size=world_size, batch_size=batch_size,
                           drop_last=drop_last, position=position).batches for r in range(world_size)]
    return [(int(s), r, step) for step in range(len(per_rank[0])) for r in range(world_size)
            for s in per_rank[r][step]]


def reference_homes(n, layout, **kw):
    node_of = {r: i for i, ranks in enumerate(layout.nodes) for r in ranks}
    home = {}
    for s, r, _ in reference_sequence(n, epoch=0, world_size=layout.world_size, position=0, **kw):
        home.setdefault(s, node_of[r])
    return home


def reference_plan(accesses, following, home, node_of, sizes, caps, residents):
    """Rule 3 the plain way: per home node, farthest next use (ties: the smaller sample goes first)
    over the accesses to its samples, a miss admitted only where the home reads it."""
    inf = float("inf")
    full = [s for s, _, _ in accesses] + list(following)
    nxt, seen = [inf] * len(full), {}
    for i in range(len(full) - 1, -1, -1):
        nxt[i], seen[full[i]] = seen.get(full[i], inf), i
    first = seen   # after the backward scan: each sample's earliest position
    served = [-1] * len(accesses)
    keep = [False] * len(accesses)
    drops, lates, afters = [], [], []
    for n, cap in enumerate(caps):
        cache, size_of = {}, {}          # sample -> next use, sample -> bytes
        drop = sorted(s for s in residents[n] if home.get(s) != n)

        def admit(s, size, nu):
            if size > cap:
                return None
            victims = []
            while sum(size_of.values()) - sum(size_of[v] for v in victims) + size > cap:
                rest = [v for v in cache if v not in victims]
                far = max(rest, key=lambda v: (cache[v], -v)) if rest else None
                if far is None or cache[far] <= nu:
                    return None
                victims.append(far)
            for v in victims:
                del cache[v], size_of[v]
            cache[s], size_of[s] = nu, size
            return victims

        mine = [s for s in residents[n] if home.get(s) == n]
        for s in sorted(mine, key=lambda s: (first.get(s, inf), s)):
            if admit(s, residents[n][s], first.get(s, inf)) is None:
                drop.append(s)
        last = {}
        for i, (s, r, _) in enumerate(accesses):
            if home[s] != n:
                continue
            if s in cache:
                served[i], keep[i], cache[s] = n, True, nxt[i]
            elif node_of[r] == n:
                victims = admit(s, int(sizes[s]), nxt[i])
                if victims is None:
                    continue
                keep[i] = True
                for v in victims:
                    if v in last:
                        keep[last[v]] = False
                    else:
                        drop.append(v)
            else:
                continue
            last[s] = i
        drops.append(sorted(drop))
        lates.append([(st_, s) for i, (s, r, st_) in enumerate(accesses)
                      if home[s] == n and node_of[r] != n and served[i] == n and not keep[i]])
        afters.append(dict(size_of))
    return served, keep, drops, lates, afters


def replay(plan, caps, before):
    """Carry out the plan's actions on model tiers, one dict per node; fail on any impossible step."""
    tiers = [dict(t) for t in before]
    for n, t in enumerate(tiers):
        for s in plan.drop_at_start[n].tolist():
            assert s in t, f"node {n} drops {s}, which it does not hold"
            del t[s]
        assert all(plan.home[s] == n for s in t), f"node {n} holds another home's sample"
    used = [sum(t.values()) for t in tiers]
    late = [[] for _ in tiers]
    for i in range(len(plan)):
        s, m, by, k = int(plan.samples[i]), int(plan.node[i]), int(plan.served_by[i]), bool(plan.keep[i])
        h = int(plan.home[s])
        if by >= 0:
            assert s in tiers[by], f"access {i}: node {by} serves sample {s}, which it does not hold"
        else:
            assert s not in tiers[h], f"access {i}: sample {s} read from the store while node {h} holds it"
        if k:
            assert m == h or s in tiers[h], f"access {i}: node {h} keeps {s}, which it neither read nor held"
            if s not in tiers[h]:
                tiers[h][s] = int(plan.sizes[s])
                used[h] += int(plan.sizes[s])
                assert used[h] <= caps[h], f"access {i}: node {h} holds {used[h]} bytes > {caps[h]}"
        elif s in tiers[h]:
            used[h] -= tiers[h].pop(s)
            if m != h:
                late[h].append((int(plan.step[i]), s))
    for n, t in enumerate(tiers):
        assert t == plan.residents_after[n], f"node {n} ends with other residents than planned"
        assert late[n] == [tuple(x) for x in plan.late_drops[n].tolist()], f"node {n}: late drops differ"
    return tiers


def node_by_node_store_reads(n, epochs, layout, sizes, cap, **kw):
    """Today's plan: each node alone over its own ranks' sequence; samples read from the store per epoch."""
    out, res = [], [{} for _ in layout.nodes]
    seqs = [[node_sequence(n, epoch=e, world_size=layout.world_size, ranks=ranks, **kw) for ranks in layout.nodes]
            for e in range(epochs + 1)]
    for e in range(epochs):
        misses = 0
        for i in range(layout.num_nodes):
            r = simulate_epoch(seqs[e][i], seqs[e + 1][i], sizes, cap, res[i])
            res[i], misses = r.residents_after, misses + int((~r.hit).sum())
        out.append(misses)
    return out


# ---------------------------------------------------------------------------------------------
# sequence, homes, layout


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 60), layout=layouts(), batch=st.integers(1, 7), drop_last=st.booleans(),
       seed=st.integers(0, 1000), where=st.floats(0, 1))
def test_cluster_sequence_is_the_ranks_batches_step_by_step(n, layout, batch, drop_last, seed, where):
    w = layout.world_size
    position = int(where * n)
    kw = dict(seed=seed, epoch=2, batch_size=batch, drop_last=drop_last, position=position)
    samples, rank, step = cluster_sequence(n, world_size=w, **kw)
    assert list(zip(samples.tolist(), rank.tolist(), step.tolist())) == reference_sequence(n, world_size=w, **kw)
    assert samples.dtype == np.int64 and rank.dtype == np.int32 and step.dtype == np.int32
    node = layout.node_of_rank()[rank]
    for i, ranks in enumerate(layout.nodes):   # restricted to a node's ranks: today's node sequence
        assert samples[node == i].tolist() == node_sequence(n, world_size=w, ranks=ranks, **kw).tolist()


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 60), layout=layouts(), batch=st.integers(1, 7), drop_last=st.booleans(),
       seed=st.integers(0, 1000))
def test_home_is_the_first_reader_in_the_first_epoch(n, layout, batch, drop_last, seed):
    kw = dict(seed=seed, batch_size=batch, drop_last=drop_last)
    home = home_nodes(n, layout=layout, **kw)
    assert home.shape == (n,) and home.dtype == np.int32
    assert home.min() >= 0 and home.max() < layout.num_nodes   # also the samples drop_last leaves out
    ref = reference_homes(n, layout, **kw)
    assert {s: int(home[s]) for s in ref} == ref
    assert home.tolist() == home_nodes(n, layout=layout, **kw).tolist()


def test_homes_are_balanced_and_depend_on_the_seed():
    layout = NodeLayout.blocks(16, 4)
    a = home_nodes(40_000, seed=1, batch_size=32, layout=layout)
    assert np.bincount(a, minlength=4).min() > 9_500
    b = home_nodes(40_000, seed=2, batch_size=32, layout=layout)
    assert (a != b).mean() > 0.5     # control: another seed, other homes


def test_layout_is_checked_and_canonical():
    assert NodeLayout(((3, 1), (0, 2))).nodes == ((1, 3), (0, 2))
    assert NodeLayout.blocks(5, 2).nodes == ((0, 1), (2, 3), (4,))
    assert NodeLayout(((1,), (0, 2))).node_of_rank().tolist() == [1, 0, 1]
    for bad in [(), ((0,), ()), ((0, 1), (1, 2)), ((0, 2),)]:
        with pytest.raises(ConfigError):
            NodeLayout(bad)
    kw = dict(seed=0, epoch=0, batch_size=2, layout=NodeLayout.blocks(2, 1), sizes=np.ones(4, np.int64))
    with pytest.raises(ConfigError, match="one capacity"):
        plan_cluster_epoch(4, capacities=[1, 2, 3], **kw)
    with pytest.raises(ConfigError, match="one dict per node"):
        plan_cluster_epoch(4, capacities=2, residents=[{}], **kw)
    with pytest.raises(ConfigError, match="one per sample"):
        plan_cluster_epoch(5, capacities=2, **kw)


# ---------------------------------------------------------------------------------------------
# the plan against the plain reference, and the C loop against the Python loop


@settings(max_examples=150, deadline=None)
@given(n=st.integers(1, 60), layout=layouts(min_nodes=2), batch=st.integers(1, 5), drop_last=st.booleans(),
       seed=st.integers(0, 1000), fracs=st.lists(st.floats(0, 1.2), min_size=4, max_size=4),
       warm=st.integers(0, 20), use_c=st.booleans())
def test_plan_matches_the_plain_reference(n, layout, batch, drop_last, seed, fracs, warm, use_c):
    rng = np.random.default_rng(seed)
    sizes = rng.integers(1, 5, n)
    caps = [int(f * sizes.sum() / layout.num_nodes) for f in fracs[:layout.num_nodes]]   # around a home's share
    kw = dict(seed=seed, batch_size=batch, drop_last=drop_last)
    home = reference_homes(n, layout, **kw)
    home.update({int(s): int(h) for s, h in enumerate(home_nodes(n, layout=layout, **kw)) if s not in home})
    node_of = {r: i for i, ranks in enumerate(layout.nodes) for r in ranks}
    # warm tiers, some of their samples homed elsewhere (say, from a run with another layout)
    residents = [{int(s): int(sizes[s]) for s in rng.permutation(n)[:warm] if rng.random() < 0.5}
                 for _ in layout.nodes]
    for epoch in range(3):
        position = min(n, batch * layout.world_size) if epoch == 1 else 0   # a resumed epoch too
        acc = reference_sequence(n, epoch=epoch, world_size=layout.world_size, position=position, **kw)
        fol = [s for s, _, _ in reference_sequence(n, epoch=epoch + 1, world_size=layout.world_size, position=0,
                                                   **kw)]
        served, keep, drops, lates, afters = reference_plan(acc, fol, home, node_of, sizes, caps, residents)
        plan = plan_cluster_epoch(n, epoch=epoch, layout=layout, capacities=caps, sizes=sizes, position=position,
                                  residents=residents, use_c=use_c, **kw)
        assert plan.served_by.tolist() == served
        assert plan.keep.tolist() == keep
        assert [sorted(d.tolist()) for d in plan.drop_at_start] == drops
        assert [[tuple(x) for x in late.tolist()] for late in plan.late_drops] == lates
        assert list(plan.residents_after) == afters
        replay(plan, caps, residents)
        residents = list(plan.residents_after)


@needs_c
@settings(max_examples=80, deadline=None)
@given(n=st.integers(2, 40), frac=st.floats(0.02, 1.0), seed=st.integers(0, 10_000), warm=st.integers(0, 40),
       dup=st.booleans(), share=st.floats(0, 1))
def test_the_c_loop_takes_the_python_loops_decisions_with_admit(n, frac, seed, warm, dup, share):
    rng = np.random.default_rng(seed)
    sizes = rng.integers(1, 6, n)
    capacity = max(int(sizes.max()), int(frac * sizes.sum()))
    seq, following = rng.permutation(n), rng.permutation(n)
    if dup:
        seq = np.concatenate([seq, seq[:3]])
        following = following[: n // 2]
    admit = rng.random(len(seq)) < share
    residents = {int(s): int(sizes[s]) for s in rng.permutation(n)[:min(warm, n)]}
    c = simulate_epoch(seq, following, sizes, capacity, dict(residents), admit=admit)
    py = simulate_epoch(seq, following, sizes, capacity, dict(residents), admit=admit, use_c=False)
    assert c.hit.tolist() == py.hit.tolist() and c.keep.tolist() == py.keep.tolist()
    assert c.drop_at_start == py.drop_at_start and c.residents_after == py.residents_after
    assert not (c.keep & ~c.hit & ~admit).any()       # a miss where admission is barred is never kept


@pytest.mark.parametrize("use_c", [True, False])
def test_admit_all_true_is_the_plain_simulation_and_all_false_only_serves_residents(use_c):
    if use_c and residency._c_simulate is None:
        pytest.skip("the C helper is not built (or CLAIRVOYANT_NO_CEXT is set)")
    rng = np.random.default_rng(7)
    n, sizes = 60, np.ones(60, np.int64)
    seq, following = rng.permutation(n), rng.permutation(n)
    residents = {int(s): 1 for s in seq[-10:]}
    plain = simulate_epoch(seq, following, sizes, 20, dict(residents), use_c=use_c)
    same = simulate_epoch(seq, following, sizes, 20, dict(residents), use_c=use_c, admit=np.ones(n, bool))
    assert plain.hit.tolist() == same.hit.tolist() and plain.keep.tolist() == same.keep.tolist()
    none = simulate_epoch(seq, following, sizes, 20, dict(residents), use_c=use_c, admit=np.zeros(n, bool))
    assert set(seq[none.hit].tolist()) == set(residents) and set(none.residents_after) <= set(residents)
    with pytest.raises(ValueError, match="one per access"):
        simulate_epoch(seq, following, sizes, 20, {}, use_c=use_c, admit=np.ones(n - 1, bool))


# ---------------------------------------------------------------------------------------------
# conservation, capacity, peers: replayed


@settings(max_examples=80, deadline=None)
@given(n=st.integers(1, 80), layout=layouts(), batch=st.integers(1, 6), drop_last=st.booleans(),
       seed=st.integers(0, 1000), frac=st.floats(0, 0.6))
def test_every_access_is_served_once_within_capacity(n, layout, batch, drop_last, seed, frac):
    rng = np.random.default_rng(seed)
    sizes = rng.integers(1, 9, n)
    caps = [int(frac * sizes.sum() * rng.random()) for _ in layout.nodes]
    kw = dict(seed=seed, batch_size=batch, drop_last=drop_last, layout=layout, capacities=caps, sizes=sizes)
    residents = None
    for epoch in range(3):
        plan = plan_cluster_epoch(n, epoch=epoch, residents=residents, **kw)
        replay(plan, caps, residents or [{} for _ in layout.nodes])
        s = plan.summary()
        assert plan.served_by.min(initial=-1) >= -1 and plan.served_by.max(initial=-1) < layout.num_nodes
        assert sum(s.own_samples) + sum(s.peer_samples) + sum(s.store_samples) == len(plan)
        assert sum(s.own_bytes) + sum(s.peer_bytes) + sum(s.store_bytes) == int(sizes[plan.samples].sum())
        assert sum(s.sent_samples) == sum(s.peer_samples) and sum(s.sent_bytes) == sum(s.peer_bytes)
        for i in range(layout.num_nodes):
            mine = plan.node == i
            assert s.own_samples[i] + s.peer_samples[i] + s.store_samples[i] == int(mine.sum())
            v = plan.for_node(i)
            assert v.samples.tolist() == node_sequence(n, epoch=epoch, world_size=layout.world_size,
                                                       ranks=layout.nodes[i], seed=seed, batch_size=batch,
                                                       drop_last=drop_last).tolist()
            assert int(v.hit.sum()) == s.own_samples[i] and int((v.peer >= 0).sum()) == s.peer_samples[i]
            assert int(v.store.sum()) == s.store_samples[i]
            assert not (v.hit & (v.peer >= 0)).any()
            assert not (v.keep & (plan.home[v.samples] != i)).any()   # a node keeps only its home samples
            assert (np.diff(v.late_drops[:, 0]) >= 0).all()
        residents = list(plan.residents_after)


def _small_plan():
    layout = NodeLayout.blocks(8, 2)
    sizes = np.ones(400, np.int64)
    caps = [60] * 4
    kw = dict(seed=5, batch_size=8, layout=layout, capacities=caps, sizes=sizes)
    p0 = plan_cluster_epoch(400, epoch=0, **kw)
    p1 = plan_cluster_epoch(400, epoch=1, residents=p0.residents_after, **kw)
    return p0, p1, caps


def test_a_peer_that_does_not_hold_the_sample_fails_the_replay():
    """Negative controls for the replay: a hit (served by the home) where the home does not hold
    the sample, a keep where the home neither read nor held the sample, and a capacity too small
    are all caught."""
    p0, p1, caps = _small_plan()
    replay(p1, caps, p0.residents_after)
    i = int(np.flatnonzero(p1.served_by < 0)[0])
    wrong = p1.hit.copy()
    wrong[i] = True
    with pytest.raises(AssertionError, match="does not hold"):
        replay(dataclasses.replace(p1, hit=wrong), caps, p0.residents_after)
    j = int(np.flatnonzero((p1.served_by < 0) & (p1.node != p1.home[p1.samples]))[0])
    keep = p1.keep.copy()
    keep[j] = True
    with pytest.raises(AssertionError, match="neither read nor held"):
        replay(dataclasses.replace(p1, keep=keep), caps, p0.residents_after)
    with pytest.raises(AssertionError, match="bytes >"):
        replay(p0, [c - 1 for c in caps], [{} for _ in caps])


def test_late_drops_are_the_home_samples_a_peer_read_last():
    p0, p1, _ = _small_plan()
    for n in range(4):
        v = p1.for_node(n)
        for step, sample in v.late_drops.tolist():
            assert p1.home[sample] == n
            at = np.flatnonzero((p1.samples == sample) & (p1.step == step))
            assert len(at) and all(p1.node[a] != n and p1.served_by[a] == n and not p1.keep[a] for a in at)
    assert sum(len(x) for x in p1.late_drops) > 0   # the case is exercised


# ---------------------------------------------------------------------------------------------
# what it is for: the store is read about once


def _store_reads(n, layout, frac, epochs, sizes, **kw):
    cap = int(frac * sizes.sum())
    out, residents, home = [], None, home_nodes(n, layout=layout, **kw)
    for epoch in range(epochs):
        plan = plan_cluster_epoch(n, epoch=epoch, layout=layout, capacities=cap, sizes=sizes, residents=residents,
                                  home=home, **kw)
        replay(plan, [cap] * layout.num_nodes, residents or [{} for _ in layout.nodes])
        out.append(plan.summary())
        residents = plan.residents_after
    return out


def test_the_cluster_holds_the_data_set_once_at_30_percent_a_node():
    n, layout, kw = 4000, NodeLayout.blocks(8, 2), dict(seed=11, batch_size=16)
    sizes = np.full(n, 100_000, np.int64)
    runs = _store_reads(n, layout, 0.30, 4, sizes, **kw)
    assert sum(runs[0].store_samples) == n and sum(runs[0].store_bytes) == n * 100_000   # each sample once
    for s in runs[1:]:
        assert sum(s.store_samples) == 0
        assert sum(s.peer_samples) > 0.7 * n     # three quarters come from the other nodes' tiers
    # negative control: node by node, the same tiers still read most of the data set every epoch
    base = node_by_node_store_reads(n, 4, layout, sizes, int(0.30 * sizes.sum()), **kw)
    assert base[0] == n and min(base[1:]) > 0.5 * n


def test_the_cluster_beats_node_by_node_at_10_percent_a_node():
    n, layout, kw = 4000, NodeLayout.blocks(8, 2), dict(seed=12, batch_size=16)
    sizes = np.full(n, 100_000, np.int64)
    runs = _store_reads(n, layout, 0.10, 4, sizes, **kw)
    base = node_by_node_store_reads(n, 4, layout, sizes, int(0.10 * sizes.sum()), **kw)
    for e in (1, 2, 3):
        ours = sum(runs[e].store_samples)
        assert ours <= 0.62 * n, (e, ours)
        assert ours < base[e] - 0.08 * n, (e, ours, base[e])
    assert min(base[1:]) > 0.65 * n    # the reference it beats


def test_padding_is_the_only_store_read_when_everything_fits():
    n, layout, kw = 1001, NodeLayout.blocks(8, 4), dict(seed=3, batch_size=5)   # 7 padding samples
    sizes = np.full(n, 10, np.int64)
    runs = _store_reads(n, layout, 0.6, 3, sizes, **kw)
    assert sum(runs[0].store_samples) <= n and sum(runs[0].store_samples) >= n - 7
    assert all(sum(s.store_samples) == 0 for s in runs[1:])


# ---------------------------------------------------------------------------------------------
# one node: today's plan


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 60), ranks=st.integers(1, 4), batch=st.integers(1, 6), drop_last=st.booleans(),
       seed=st.integers(0, 1000), frac=st.floats(0, 1), unit=st.booleans())
def test_one_node_is_the_node_plan(n, ranks, batch, drop_last, seed, frac, unit):
    rng = np.random.default_rng(seed)
    sizes = np.ones(n, np.int64) if unit else rng.integers(1, 6, n)
    cap = int(frac * sizes.sum())
    layout = NodeLayout((tuple(range(ranks)),))
    kw = dict(seed=seed, batch_size=batch, drop_last=drop_last)
    mine, theirs = None, {}
    for epoch in range(3):
        plan = plan_cluster_epoch(n, epoch=epoch, layout=layout, capacities=cap, sizes=sizes, residents=mine, **kw)
        seq, fol = (node_sequence(n, epoch=e, world_size=ranks, ranks=range(ranks), **kw) for e in (epoch, epoch + 1))
        ref = simulate_epoch(seq, fol, sizes, cap, dict(sorted(theirs.items())))
        v = plan.for_node(0)
        assert v.samples.tolist() == seq.tolist()
        assert v.hit.tolist() == ref.hit.tolist() and v.keep.tolist() == ref.keep.tolist()
        assert (v.peer == -1).all() and len(v.late_drops) == 0
        assert sorted(v.drop_at_start.tolist()) == sorted(ref.drop_at_start)
        assert v.residents_after == ref.residents_after
        mine, theirs = plan.residents_after, ref.residents_after


def _plans_agree(a, b) -> bool:
    return (np.array_equal(a.hit, b.hit) and np.array_equal(a.keep, b.keep)
            and all(x.tolist() == y.tolist() for x, y in zip(a.drop_at_start, b.drop_at_start))
            and all(x.tolist() == y.tolist() for x, y in zip(a.late_drops, b.late_drops))
            and all(x.tolist() == y.tolist() for x, y in zip(a.late_once, b.late_once))
            and all(x == y for x, y in zip(a.residents_after, b.residents_after)))


@needs_c
@pytest.mark.parametrize("trial", range(6))
def test_the_one_pass_c_plan_takes_the_home_by_home_decisions(trial):
    """``_belady.plan_homes`` (every home at once, a heap only once a tier is full, compaction) against
    the home-by-home Python path, over epochs whose tiers shrink below what they hold (residents
    re-admitted soonest first), with residents homed elsewhere or outside the data set, a resumed
    position and a final epoch; with a negative control that must tell two plans apart."""
    rng = np.random.default_rng(trial)
    n = int(rng.integers(3000, 12000))
    layout = NodeLayout.blocks(int(rng.integers(2, 9)), int(rng.integers(1, 3)))
    sizes = rng.integers(1, 100, n)
    big = [int(sizes.sum() * 0.6 / layout.num_nodes)] * layout.num_nodes
    small = [int(c * rng.uniform(0.1, 0.9)) for c in big]
    kw = dict(seed=trial, batch_size=int(rng.integers(1, 40)), layout=layout, sizes=sizes,
              drop_last=bool(trial % 2))
    p0 = plan_cluster_epoch(n, epoch=0, capacities=big, **kw)
    assert _plans_agree(p0, plan_cluster_epoch(n, epoch=0, capacities=big, use_c=False, **kw))
    held = [dict(r) for r in p0.residents_after]
    held[0].update({int(s): 7 for s in rng.choice(n, 50, replace=False)})   # some homed elsewhere
    held[-1][n + 5] = 3                                                      # and one unknown
    args = dict(epoch=1, capacities=small, residents=held, position=int(rng.integers(0, n // 2)),
                final=trial >= 4, **kw)
    c, py = plan_cluster_epoch(n, **args), plan_cluster_epoch(n, use_c=False, **args)
    assert _plans_agree(c, py)
    assert sum(len(d) for d in c.drop_at_start) > 50 and c.hit.any()   # the cases are exercised
    args["capacities"] = [x + 40 for x in small]
    assert not _plans_agree(c, plan_cluster_epoch(n, use_c=False, **args))   # control


@needs_c
@pytest.mark.parametrize("trial", range(5))
def test_the_mounts_plan_runs_on_the_same_c_kernel_with_the_same_decisions(trial):
    """The mount's plan (``plan_cluster_sequence``: orders its samplers published, so batches of
    uneven counts, repeated files, ranks that stop early, a next epoch in any order or unknown)
    runs on the C kernel the Loader's does, taking the interleaved accesses and the node of each;
    it decides as the home-by-home Python reference. Control: a changed capacity is told apart."""
    rng = np.random.default_rng(200 + trial)
    n = int(rng.integers(2000, 6000))
    layout = NodeLayout.blocks(int(rng.integers(2, 6)), int(rng.integers(1, 3)))
    nodes, world = layout.num_nodes, layout.world_size
    files, counts = [], []
    for _ in range(world):
        m = int(rng.integers(n // (2 * world), 2 * n // world))
        files.append(rng.integers(0, n, m))   # repeats, and samples no rank reads
        c = rng.integers(1, 33, m)
        c = c[:int(np.searchsorted(np.cumsum(c), m)) + 1]
        c[-1] -= int(c.sum()) - m
        counts.append(c[c > 0])
    seq = interleave(files, counts)
    following = (np.zeros(0, np.int64) if trial == 4
                 else np.concatenate([rng.permutation(n), rng.integers(0, n, n // 10)]))
    home = rng.integers(0, nodes, n).astype(np.int32)
    sizes = rng.integers(1, 100, n)
    caps = [int(sizes.sum() * rng.uniform(0.05, 0.4) / nodes) for _ in range(nodes)]
    held = [{int(s): int(sizes[s]) for s in rng.choice(n, n // (3 * nodes), replace=False)} for _ in range(nodes)]
    held[0][n + 3] = 5   # one outside the data set
    kw = dict(home=home, layout=layout, sizes=sizes, residents=held, batch_size=16)
    c = plan_cluster_sequence(seq, following, capacities=caps, **kw)
    py = plan_cluster_sequence(seq, following, capacities=caps, use_c=False, **kw)
    assert _plans_agree(c, py)
    assert c.hit.any() and c.keep.any() and sum(len(d) for d in c.drop_at_start) > 0   # the cases are exercised
    assert not _plans_agree(c, plan_cluster_sequence(seq, following, capacities=[x + 400 for x in caps],
                                                     use_c=False, **kw))   # control


def test_the_plan_holds_no_copy_of_the_order_per_rank():
    """Regression: the plan once padded a copy of the epoch's order for each rank (40 GB at 1.28 M
    samples on 1,024 nodes x 4 ranks). The numpy memory it allocates (tracemalloc sees numpy's
    buffers; the C helper's own work space is a few bytes per sample on top) stays within a few
    dozen bytes per sample at 4,096 ranks; the control allocates one copy per rank and is caught."""
    import tracemalloc

    n, layout = 60_000, NodeLayout.blocks(4096, 4)
    sizes = np.full(n, 1000, np.int64)
    kw = dict(seed=1, batch_size=16, layout=layout, capacities=[10**9] * layout.num_nodes, sizes=sizes)

    def peak(fn) -> int:
        tracemalloc.start()
        try:
            fn()
            return tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()

    bound = 120 * n + 2_000_000
    p0 = plan_cluster_epoch(n, epoch=0, **kw)
    assert peak(lambda: plan_cluster_epoch(n, epoch=1, residents=p0.residents_after, **kw).for_node(3)) < bound
    order = np.arange(n)
    assert peak(lambda: [np.concatenate([order, order[:r % 7]]) for r in range(64)]) > bound   # control


def test_a_runs_homes_keep_what_the_tiers_hold():
    """homes_held: a sample a node's tier holds is homed there (the lowest such node) where no node
    below its share reads it first; any other at its first reader, as home_nodes. Control: without
    residents it is home_nodes exactly, and the held samples' first readers are mostly other nodes."""
    from clairvoyant.plan.cluster import home_nodes, homes_held

    layout = NodeLayout(((0,), (1,), (2,)))
    kw = dict(seed=3, batch_size=4, layout=layout, sizes=np.full(90, 10), capacities=[100, 1000, 100])
    base = home_nodes(90, seed=3, batch_size=4, layout=layout)
    held = {s: 10 for s in range(0, 90, 3)}   # node 1 holds every third sample (its share: most)
    assert base[7] == 0                        # node 2 holds sample 7, which node 0 reads first
    home = homes_held(90, residents=[{}, held, {7: 10}], **kw)
    assert all(home[s] == 1 for s in held) and home[7] == 2
    rest = [s for s in range(90) if s not in held and s != 7]
    assert (home[rest] == base[rest]).all()
    assert (homes_held(90, residents=[{}, {}, {}], **kw) == base).all()   # control
    assert (base[list(held)] != 1).sum() > 10                               # control: they moved


def test_a_node_whose_tier_is_empty_homes_its_share_of_what_the_others_hold():
    """keep_held, the case of a node back after a loss (issue 51): nodes 0-2 kept every sample
    while node 3 was away (each a third), node 3's tier is empty. Node 3 homes its fair share (a
    quarter, within 20%), taken from the samples it reads first, and no node homes more than 20%
    over its share; a sample held by its first reader stays there, as does every sample a holder
    keeps. Control: with node 3's capacity 0 (no share) it homes nothing."""
    from clairvoyant.plan.cluster import keep_held

    n, rng = 1200, np.random.default_rng(5)
    sizes = rng.integers(900, 1100, n)
    first = rng.integers(0, 4, n).astype(np.int32)   # the first readers of the epoch planned
    residents = [{int(s): int(sizes[s]) for s in range(k, n, 3)} for k in range(3)] + [{}]
    home = keep_held(first.copy(), residents, sizes, [10**6] * 4)
    fair = sizes.sum() / 4
    homed = np.bincount(home, weights=sizes, minlength=4)
    assert 0.8 * fair <= homed[3] <= 1.2 * fair and (homed <= 1.2 * fair).all(), homed / fair
    assert (first[home == 3] == 3).all()   # node 3 reads each of its homes in the epoch planned
    holder = np.arange(n) % 3
    assert (home[first == holder] == holder[first == holder]).all()   # held by its first reader: stays
    assert ((home == holder) | (home == first)).all()                  # else its holder's or first reader's
    assert (keep_held(first.copy(), residents, sizes, [10**6] * 4) == home).all()   # the same on every node
    assert not (keep_held(first.copy(), residents, sizes, [10**6] * 3 + [0]) == 3).any()   # control


def test_tiers_near_their_shares_keep_every_file_they_hold():
    """keep_held moves no held file between nodes near their shares (each move costs a store
    read): two tiers that hold 22 and 18 of 40 files (55% and 45%) keep them all, whoever reads
    them first. Control: with the second tier empty, the second node takes the files it reads
    first."""
    from clairvoyant.plan.cluster import keep_held

    first = np.random.default_rng(1).integers(0, 2, 40).astype(np.int32)
    sizes = np.full(40, 1000)
    residents = [{s: 1000 for s in range(22)}, {s: 1000 for s in range(22, 40)}]
    home = keep_held(first.copy(), residents, sizes, [30000, 30000])
    assert (home[:22] == 0).all() and (home[22:] == 1).all()
    emptied = keep_held(first.copy(), [{s: 1000 for s in range(40)}, {}], sizes, [30000, 30000])
    assert (emptied[first == 1] == 1).all() and (emptied[first == 0] == 0).all()   # control
