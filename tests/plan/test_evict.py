"""Eviction by farthest next use against a separate, simple reference of Belady's MIN."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from clairvoyant.plan.evict import NEVER, FarthestNextUse, next_uses
from clairvoyant.testing.reference import lru_hits


def simulate_farthest_next_use(sequence, sizes, capacity) -> int:
    """Hits of the Python policy (``FarthestNextUse``) on an access sequence, every miss admitted
    when allowed."""
    seq = np.asarray(sequence, dtype=np.int64)
    nxt = next_uses(seq)
    cache, hits = FarthestNextUse(capacity), 0
    for i, s in enumerate(seq.tolist()):
        if s in cache:
            hits += 1
            cache.touch(s, int(nxt[i]))
        else:
            cache.admit(s, int(sizes[s]), int(nxt[i]))
    return hits


def simulate_lru(sequence, sizes, capacity) -> int:
    return sum(lru_hits(sequence, sizes, capacity))


def naive_next_uses(seq):
    return [next((j for j in range(i + 1, len(seq)) if seq[j] == seq[i]), NEVER) for i in range(len(seq))]


def reference_min_hits(seq, slots):
    """Belady's MIN for equal sizes, written the slow, obvious way: on a miss with a full
    cache, evict the resident whose next access lies farthest ahead (or never comes)."""
    cache, hits = set(), 0
    for i, s in enumerate(seq):
        if s in cache:
            hits += 1
            continue
        if len(cache) >= slots:
            def ahead(x):
                return next((j for j in range(i + 1, len(seq)) if seq[j] == x), len(seq) + 1)
            # MIN may also decline to cache s if s itself comes back last of all
            far = max(cache, key=ahead)
            if ahead(far) <= ahead(s):
                continue
            cache.remove(far)
        cache.add(s)
    return hits


sequences = st.lists(st.integers(0, 11), min_size=1, max_size=80)


@settings(max_examples=80, deadline=None)
@given(seq=sequences)
def test_next_uses(seq):
    assert next_uses(seq).tolist() == naive_next_uses(seq)


@settings(max_examples=80, deadline=None)
@given(seq=sequences, slots=st.integers(1, 8))
def test_farthest_next_use_is_optimal_for_equal_sizes(seq, slots):
    sizes = [1] * 12
    assert simulate_farthest_next_use(seq, sizes, slots) == reference_min_hits(seq, slots)


def test_lru_fails_the_same_check():
    """Negative control: LRU on epoch-shuffled orders falls short of the optimum."""
    rng = np.random.default_rng(0)
    seq = np.concatenate([rng.permutation(20) for _ in range(4)]).tolist()
    sizes = [1] * 20
    opt = reference_min_hits(seq, 10)
    assert simulate_farthest_next_use(seq, sizes, 10) == opt
    assert simulate_lru(seq, sizes, 10) < opt


def test_hit_rate_under_reshuffled_epochs_is_about_the_capacity_fraction():
    """With a fresh permutation each epoch, the optimum keeps about f of the data useful; LRU about f^2/2."""
    rng = np.random.default_rng(1)
    n, epochs = 2000, 4
    seq = np.concatenate([rng.permutation(n) for _ in range(epochs)])
    sizes = np.ones(n, dtype=np.int64)
    f = 0.5
    later = (epochs - 1) * n
    best = simulate_farthest_next_use(seq, sizes, int(f * n)) / later
    lru = simulate_lru(seq, sizes, int(f * n)) / later
    assert abs(best - f) < 0.03 and lru < 0.25


@settings(max_examples=60, deadline=None)
@given(ops=st.lists(st.tuples(st.integers(0, 15), st.integers(1, 5), st.integers(0, 50)), max_size=60),
       capacity=st.integers(1, 12))
def test_admission_never_evicts_what_is_needed_sooner_and_respects_capacity(ops, capacity):
    cache = FarthestNextUse(capacity)
    sizes = {}
    for sample, size, nxt in ops:
        size = sizes.setdefault(sample, size)
        before = {s: cache._next[s] for s in list(cache._next)}
        victims = cache.admit(sample, size, nxt)
        assert cache.used <= capacity
        if victims is None:
            assert sample not in cache or sample in before
            assert {s: cache._next[s] for s in list(cache._next)} == before
        else:
            assert all(before[v] > nxt for v in victims)
        assert cache.used == sum(sizes[s] for s in cache._next)


def _next_use(seq, s, done):
    later = [p for p in range(done, len(seq)) if seq[p] == s]
    return later[0] if later else NEVER


def _replay(seq, n, residents, rng, forget_consumption=False):
    """Stage ``seq`` ahead with random reader progress and a random capacity (in files), asking
    StagedAhead for every victim and checking it against a scan of every resident (the rule it
    replaces in the mount: the farthest first use at or after the readers' position, if it comes
    after the file to stage). The number of choices that differ from the scan's."""
    from clairvoyant.plan.ahead import StagedAhead

    policy = StagedAhead(np.asarray(seq), n, residents)
    held, cap, done, differ = set(residents), int(rng.integers(1, 6)), 0, 0
    for pos, s in enumerate(seq):
        if s in held:
            continue
        while len(held) >= cap:
            done = min(pos, done + int(rng.integers(0, 3)))
            if not forget_consumption:
                policy.consumed(done)
            far = max(_next_use(seq, r, done) for r in held)
            got = policy.evict_for(pos)
            if got is None:
                differ += far > pos   # the scan would have evicted
                if done == pos:       # (only a policy blind to the readers gets here)
                    break
                done = pos            # the readers catch up
                if not forget_consumption:
                    policy.consumed(done)
                continue
            differ += _next_use(seq, got, done) != far   # ties (never used again) are equal choices
            held.discard(got)
        policy.staged(s, pos)
        held.add(s)
    return differ


def test_staged_ahead_evicts_what_a_scan_of_every_resident_would():
    """StagedAhead (plan/ahead.py) against the brute-force scan it replaces in the mount, over
    random sequences, reader progress and capacities. Control: a StagedAhead that is never told of
    the readers' progress keeps stale next uses, and differs from the scan."""
    rng = np.random.default_rng(0)
    differ = control = 0
    for _ in range(300):
        n = int(rng.integers(2, 9))
        seq = rng.integers(0, n, int(rng.integers(4, 40))).tolist()
        residents = sorted(set(rng.integers(0, n, int(rng.integers(0, 3))).tolist()))
        state = rng.bit_generator.state
        differ += _replay(seq, n, residents, rng)
        rng.bit_generator.state = state
        control += _replay(seq, n, residents, rng, forget_consumption=True)
    assert differ == 0
    assert control > 0


def test_a_file_chosen_while_its_copy_was_on_the_way_is_evicted_once_there():
    """The mount's ``Controller._settle`` (mount/controller.py): a file chosen for eviction while its
    copy was on the way is kept in mind while the copy flies, evicted once it lands (also when it
    lands between the look and the eviction), and let go if it is staged again or never comes.
    (Mutation-checked: without the in-flight look, or with it after the eviction, this fails.)"""
    from clairvoyant.mount.controller import Controller

    class Fake:
        def __init__(self, present, flying, lands_after_look=()):
            self.present, self.flying, self.lands = set(present), set(flying), set(lands_after_look)
            self.evicted = []

        def _in_flight(self, i):
            was = i in self.flying
            if i in self.lands:   # its copy lands right after this look
                self.flying.discard(i)
                self.present.add(i)
            return was

        def _evict(self, i):
            if i in self.present:
                self.present.discard(i)
                self.evicted.append(i)
                return True
            return False

    held = {7}   # file 7 was staged again since it was chosen
    f = Fake(present={1}, flying={2, 3}, lands_after_look={3})
    assert Controller._settle(f, [1, 2, 3, 4, 7], held) == [2]   # 2 still flies; 4 never comes
    assert f.evicted == [1, 3]                                    # 3 landed between look and eviction
    f.flying.discard(2)
    f.present.add(2)
    assert Controller._settle(f, [2], held) == [] and f.evicted == [1, 3, 2]



def test_staged_ahead_counts_a_read_only_where_the_readers_can_be_and_keeps_what_the_plan_keeps():
    """A read moves a resident's next use on only if its pending use is within the readers' reach
    (else it was a read of an earlier use); a file read from the source is kept only where the
    Loader's plan keeps that access (to_stage), and then with its next use, NEVER included."""
    from clairvoyant.plan.ahead import StagedAhead, to_stage
    from clairvoyant.plan.evict import NEVER

    seq = np.array([3, 1, 2, 3, 1, 0])
    h = StagedAhead(seq, 4, [1])             # sample 1 resident, needed at position 1
    assert not h.read(1, before=1) and h.pending(1) == 1   # control: out of reach, nothing moves
    assert h.read(1, before=2) and h.pending(1) == 4
    assert h.read(1, before=5) and h.pending(1) == NEVER
    keep = to_stage(seq, np.zeros(0, np.int64), np.full(4, 10), 20, {})   # room for two samples
    assert keep.tolist() == [True, True, False, False, False, False]   # 3 and 1 kept; 2 would evict sooner uses
    k = StagedAhead(seq, 4, [], keep=keep)
    assert k.keep_read(3, 0) == 3 and k.keep_read(2, 0) is None and k.keep_read(0, 0) is None
    assert StagedAhead(seq, 4, []).keep_read(2, 0) is None   # without a plan: no later use, not kept
    # a read heard of after the readers moved past its use: the use it served is found behind them
    assert k.use_read(3, 2) == 2 and k.use_read(0, 2) == 2   # a use at or after 2: looked for from there
    assert k.use_read(1, 5) == 4 and k.use_read(3, 5) == 3   # none: the last one before
    once = np.array([3, 1, 2, 0])
    all_kept = StagedAhead(once, 4, [], keep=np.ones(4, bool))
    assert all_kept.keep_read(3, all_kept.use_read(3, 2)) == NEVER   # kept: the plan keeps its use at 0
    assert all_kept.keep_read(3, 2) is None   # control: looking from where the readers are finds none


def test_the_mounts_step_decision_is_the_plans():
    """plan/ahead.py decides each position of the mount's walk (the controller carries it out):
    skip, stage, evict the resident needed farthest after it, or wait for the readers."""
    from clairvoyant.plan.ahead import EVICT, SKIP, STAGE, WAIT, StagedAhead, next_step

    seq = np.array([0, 1, 2, 3, 4, 0, 1])
    h = StagedAhead(seq, 5, [0, 1])        # 0 and 1 resident, next used at 0 and 1 (then 5 and 6)
    assert next_step(h, 2, 2, False, 0, 10, 100).kind == SKIP     # the plan does not keep this miss
    assert next_step(h, 2, 2, True, 3, 10, 100).kind == SKIP      # handed out already
    assert next_step(h, 0, 0, True, 0, 10, 100).kind == SKIP      # resident
    assert next_step(h, 2, 2, True, 0, 10, 100, {2}).kind == SKIP  # gathered for a copy
    assert next_step(h, 2, 2, True, 0, 10, 100) == (STAGE, -1)    # room for it
    assert next_step(h, 2, 2, True, 0, 10, 5) == (WAIT, -1)       # both residents are needed before 2
    h.consumed(2)   # the readers passed 0 and 1: the residents' next uses are 5 and 6
    step = next_step(h, 2, 2, True, 2, 10, 5)
    assert step == (EVICT, 1) and 1 not in h and 0 in h            # 1 (next used at 6) gives way, not 0
    assert next_step(h, 5, 0, True, 2, 10, 5).kind == SKIP         # control: a resident is never staged


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 5), st.integers(0, 5)), min_size=2, max_size=2))
def test_the_python_and_c_eviction_rules_agree(pair):
    """One rule, two languages: FarthestNextUse.key orders residents as _belady.c's ``farther``
    (every C heap's comparator). Control: a rule that breaks ties the other way disagrees."""
    import pytest
    _belady = pytest.importorskip("clairvoyant.plan._belady")
    (na, sa), (nb, sb) = pair
    key = FarthestNextUse.key
    assert _belady.farther(na, sa, nb, sb) == (key(na, sa) < key(nb, sb))
    assert _belady.farther(NEVER, sa, nb, sb) == (key(NEVER, sa) < key(nb, sb))


def test_a_rule_with_other_ties_disagrees_with_c():
    import pytest
    _belady = pytest.importorskip("clairvoyant.plan._belady")
    other = lambda nu, s: (-nu, -s)   # noqa: E731  (ties: the larger sample first)
    assert any(_belady.farther(3, a, 3, b) != (other(3, a) < other(3, b)) for a in range(3) for b in range(3))
