"""The residency plan: replaying its actions gives the offline optimum's hits within capacity."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from clairvoyant.plan.layout import block_ranks as node_ranks
from clairvoyant.plan.residency import simulate_epoch
from clairvoyant.plan.sequence import node_sequence
from clairvoyant.plan import plan_epoch
from clairvoyant.testing.reference import belady_hits, lru_hits


def replay(epochs, sizes, capacity, residents=None):
    """Run the plan's actions on a model tier; check each hit against the model, return all hits."""
    tier = dict(residents or {})
    hits, peak = [], sum(tier.values())
    for e, seq in enumerate(epochs):
        following = epochs[e + 1] if e + 1 < len(epochs) else np.zeros(0, np.int64)
        plan = simulate_epoch(seq, following, sizes, capacity, dict(tier))
        for s in plan.drop_at_start:
            tier.pop(s, None)
        for i, s in enumerate(seq.tolist()):
            assert (s in tier) == bool(plan.hit[i]), (e, i, s)
            tier[s] = int(sizes[s])                      # staged (or read) for this access
            peak = max(peak, sum(tier.values()))
            if not plan.keep[i]:
                del tier[s]
            assert sum(tier.values()) <= capacity
        assert tier == plan.residents_after
        hits.extend(plan.hit.tolist())
    return hits, peak


def epochs_of(n, count, seed):
    rng = np.random.default_rng(seed)
    return [rng.permutation(n).astype(np.int64) for _ in range(count)]


@settings(max_examples=60, deadline=None)
@given(n=st.integers(2, 40), frac=st.floats(0.05, 1.0), seed=st.integers(0, 10_000), unit=st.booleans())
def test_replayed_plan_matches_the_reference_optimum(n, frac, seed, unit):
    rng = np.random.default_rng(seed)
    sizes = np.ones(n, np.int64) if unit else rng.integers(1, 5, n)
    capacity = max(int(sizes.max()), int(frac * sizes.sum()))
    epochs = epochs_of(n, 4, seed)
    hits, _ = replay(epochs, sizes, capacity)
    ref = belady_hits(np.concatenate(epochs), sizes, capacity)
    if unit:
        assert sum(hits) == sum(ref)
    else:   # by bytes, farthest-next-use is a heuristic; the plan and the reference apply the same rule
        assert sum(hits) >= sum(ref) - 1


def test_lru_falls_short_of_the_same_check():
    """Negative control: the replayed optimum beats LRU by far at half capacity."""
    n = 200
    sizes = np.ones(n, np.int64)
    epochs = epochs_of(n, 4, 1)
    hits, _ = replay(epochs, sizes, n // 2)
    seq = np.concatenate(epochs)
    assert sum(hits) == sum(belady_hits(seq, sizes, n // 2))
    assert sum(lru_hits(seq, sizes, n // 2)) < 0.6 * sum(hits)


def test_a_wrong_plan_fails_the_replay():
    """Negative control for the replay itself: flipping one keep decision is caught."""
    n, sizes = 30, np.ones(30, np.int64)
    epochs = epochs_of(n, 2, 3)
    plan = simulate_epoch(epochs[0], epochs[1], sizes, 10, {})
    i = int(np.flatnonzero(plan.keep)[0])
    plan.keep[i] = False
    tier = {}
    with_error = False
    nxt_plan = simulate_epoch(epochs[1], np.zeros(0, np.int64), sizes, 10, plan.residents_after)
    for j, s in enumerate(epochs[0].tolist()):
        tier[s] = 1
        if not plan.keep[j]:
            del tier[s]
    for j, s in enumerate(epochs[1].tolist()):
        if (s in tier) != bool(nxt_plan.hit[j]):
            with_error = True
            break
        tier[s] = 1
        if not nxt_plan.keep[j]:
            del tier[s]
    assert with_error


def test_warm_residents_are_hits_or_dropped():
    n, sizes = 50, np.ones(50, np.int64)
    epochs = epochs_of(n, 2, 5)
    residents = {s: 1 for s in range(40)}     # more than fits in 20
    hits, _ = replay(epochs, sizes, 20, residents)
    ref = belady_hits(np.concatenate(epochs), sizes, 20, residents)
    assert sum(hits) == sum(ref)
    assert sum(hits[:n]) == 20                # the 20 soonest-needed residents all hit in epoch 0


def test_node_sequence_interleaves_the_node_ranks_by_step():
    kw = dict(seed=4, epoch=1, world_size=4, batch_size=3)
    seq = node_sequence(25, ranks=node_ranks(2, 4, 2), **kw)
    p2 = plan_epoch(25, rank=2, **kw).batches
    p3 = plan_epoch(25, rank=3, **kw).batches
    want = np.concatenate([b for s in range(len(p2)) for b in (p2[s], p3[s])])
    assert seq.tolist() == want.tolist()
    assert list(node_ranks(2, 4, 2)) == [2, 3] and list(node_ranks(1, 3, 2)) == [0, 1]
    later = node_sequence(25, ranks=node_ranks(2, 4, 2), position=3 * 4, **kw)   # one batch of 3 on 4 ranks
    assert later.tolist() == want[6:].tolist()


@settings(max_examples=80, deadline=None)
@given(n=st.integers(2, 40), frac=st.floats(0.02, 1.0), seed=st.integers(0, 10_000), warm=st.integers(0, 40),
       dup=st.booleans())
def test_the_c_loop_takes_the_python_loops_decisions(n, frac, seed, warm, dup):
    from clairvoyant.plan import residency
    if residency._c_simulate is None:
        import pytest
        pytest.skip("the C helper is not built (or CLAIRVOYANT_NO_CEXT is set)")
    rng = np.random.default_rng(seed)
    sizes = rng.integers(1, 6, n)
    capacity = max(int(sizes.max()), int(frac * sizes.sum()))
    seq, following = rng.permutation(n), rng.permutation(n)
    if dup:   # padding repeats samples within an epoch, and a sample may be missing from the next
        seq = np.concatenate([seq, seq[:3]])
        following = following[: n // 2]
    residents = {int(s): int(sizes[s]) for s in rng.permutation(n)[:min(warm, n)]}
    c = simulate_epoch(seq, following, sizes, capacity, dict(residents))
    py = simulate_epoch(seq, following, sizes, capacity, dict(residents), use_c=False)
    assert c.hit.tolist() == py.hit.tolist() and c.keep.tolist() == py.keep.tolist()
    assert c.drop_at_start == py.drop_at_start and c.residents_after == py.residents_after


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 30), length=st.integers(0, 80), groups=st.integers(1, 6), seed=st.integers(0, 10_000))
def test_the_c_grouping_and_next_uses_match_numpys(n, length, groups, seed):
    """The O(n) helpers the cluster plan runs on (group_positions, next_use_positions) against
    plain numpy; a wrong answer (a shifted next use) must fail the same comparison."""
    import pytest

    from clairvoyant.plan import residency
    from clairvoyant.plan.evict import next_uses
    if residency._c_group_by is None:
        pytest.skip("the C helper is not built (or CLAIRVOYANT_NO_CEXT is set)")
    rng = np.random.default_rng(seed)
    seq = rng.integers(0, n, length)
    keys = rng.integers(0, groups, length)
    order, cuts, place = residency.group_positions(keys, groups)
    want = np.argsort(keys, kind="stable")
    assert order.tolist() == want.tolist()
    for g in range(groups):
        members = np.flatnonzero(keys == g)
        assert order[cuts[g]:cuts[g + 1]].tolist() == members.tolist()
        assert place[members].tolist() == list(range(len(members)))
    got = residency.next_use_positions(seq, n)
    assert got.tolist() == next_uses(seq).tolist()
    if length and (got != residency.NEVER).any():
        wrong = got.copy()
        wrong[np.flatnonzero(got != residency.NEVER)[0]] += 1
        assert wrong.tolist() != next_uses(seq).tolist()


def test_residents_are_a_mapping_over_sorted_arrays():
    from clairvoyant.plan.residents import Residents
    d = {7: 3, 2: 5, 11: 1}
    r = Residents.of(d)
    assert r == d and d == r and dict(r) == d and list(r) == [2, 7, 11] and r[7] == 3 and 11 in r
    assert 4 not in r and "x" not in r and len(r) == 3 and r.nbytes == 9
    assert r != {7: 3, 2: 5, 11: 2} and r != {7: 3, 2: 5}   # negative controls: a size, a sample
    assert Residents.of(r) is r and Residents.of({}) == {}
    import pytest
    with pytest.raises(KeyError):
        r[4]
    with pytest.raises(ValueError, match="twice"):
        Residents(np.array([3, 1, 3]), np.array([1, 1, 1]))


def test_residents_enter_soonest_needed_first():
    from clairvoyant.plan.evict import NEVER
    from clairvoyant.plan.residency import soonest_first
    first = np.array([9, NEVER, 2, NEVER, 5])
    assert soonest_first(first).tolist() == [2, 4, 0, 1, 3]
    assert soonest_first(first).tolist() == np.argsort(first, kind="stable").tolist()
    import pytest
    with pytest.raises(ValueError, match="share"):
        soonest_first(np.array([4, 4]))
