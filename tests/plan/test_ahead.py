"""The mount's late reads: what a first read the daemon reported comes to (plan/ahead.py
``heard_read``), the room made for a file kept after one (``keep_step``), and mount/follow.py
carrying both out as the controller's ``_follow``/``_keep_read`` did before they moved there."""

from __future__ import annotations

from collections import deque

import numpy as np

from clairvoyant.cache.entry import entry_size
from clairvoyant.plan.ahead import (DROP, EVICT, KEEP, LATER, NONE, SKIP, STAGE, USED, WAIT, StagedAhead,
                                    heard_read, keep_step, next_step, to_stage, wanted)

TWO_EPOCHS = np.array([0, 1, 2, 3, 0, 1, 2, 3])   # this epoch's order, then the next's


def _plan(capacity: int) -> StagedAhead:
    """Four files of 10 bytes over two epochs, with the Loader's plan for ``capacity`` bytes."""
    keep = to_stage(TWO_EPOCHS[:4], TWO_EPOCHS[4:], np.full(4, 10), capacity, {})
    return StagedAhead(TWO_EPOCHS, 4, [], keep=keep)


def test_room_for_a_late_read_is_made_by_the_resident_needed_farthest_after_its_use():
    """``keep_step``: a kept file that fits is staged; else the resident needed farthest after its
    use gives way, one at a time; a resident needed at or before it never does, and then the file
    is let go (``SKIP``) where the walk's ``next_step`` would wait for the readers."""
    seq = np.array([0, 1, 2, 3, 4, 0, 1, 2])
    h = StagedAhead(seq, 5, [0, 1])
    h.consumed(2)   # the readers passed 0 and 1: the residents' next uses are 5 and 6
    assert keep_step(h, 7, 10, 10) == (STAGE, -1) and len(h) == 2     # it fits: nothing gives way
    assert keep_step(h, 7, 10, 9) == (SKIP, -1) and len(h) == 2       # 2, kept for 7: both are needed sooner
    assert next_step(h, 7, 2, True, 2, 10, 9).kind == WAIT             # (where the walk would wait)
    assert keep_step(h, 4, 10, 9) == (EVICT, 1) and 1 not in h and 0 in h   # control: for a use at 4, 6 goes
    assert keep_step(h, 4, 10, 9) == (EVICT, 0) and len(h) == 0       # then 5
    assert keep_step(h, 4, 10, 9) == (SKIP, -1)                        # nothing left to give way


def test_a_late_read_is_kept_where_the_plan_keeps_the_use_it_served():
    """A file read from the source, heard of after the readers moved on: kept for its next use
    where the Loader's plan keeps the access it served, else let go; a read from the tier of a file
    that is not resident changes nothing."""
    everything, half = _plan(40), _plan(20)
    assert half._keep.tolist() == [True, True, False, False]           # room for two: 2 and 3 not kept
    assert heard_read(everything, 0, True, 3, 10, 2, 1) == (KEEP, 1, 4)   # served its use at 0: kept for 4
    assert heard_read(everything, 2, True, 3, 10, 3, 0) == (KEEP, 0, 6)
    assert heard_read(half, 2, True, 3, 10, 3, 0) == (DROP, 0, -1)     # control: the plan drops that use
    assert heard_read(half, 0, True, 3, 10, 2, 1) == (KEEP, 1, 4)      # (and keeps the other)
    assert heard_read(everything, 1, False, 3, 10, 2, 1) == (NONE, 1, -1)   # read from the tier
    assert heard_read(everything, 1, True, 3, 10, 2, 1).kind == KEEP   # control: from the source, kept


def test_a_read_of_the_next_epochs_use_waits_for_the_next_plan():
    """Readers handed the whole epoch read a file of the next one before its plan: the read waits
    for that plan (resident or not). Controls: where it cannot wait (``defer`` False) it is weighed
    now, and before the readers were handed the whole epoch it is a read of this epoch's use."""
    h = _plan(40)
    assert heard_read(h, 0, True, 4, 10, 3, 1) == (LATER, 1, -1)
    assert heard_read(h, 0, True, 4, 10, 3, 1, defer=False) == (KEEP, 1, 4)   # control
    assert heard_read(h, 0, True, 3, 10, 3, 1).kind == KEEP                   # control
    r = StagedAhead(TWO_EPOCHS, 4, [0], keep=np.ones(4, bool))   # 0 resident, needed at 0, then at 4
    assert heard_read(r, 0, False, 1, 2, 0, 1) == (USED, 2, -1) and r.pending(0) == 4
    assert heard_read(r, 0, False, 4, 4, 3, 2) == (LATER, 2, -1) and r.pending(0) == 4
    assert heard_read(r, 0, False, 3, 4, 3, 2) == (USED, 2, -1) and r.pending(0) == 4   # control


def test_a_residents_read_counts_only_within_the_readers_reach_and_widens_the_lag():
    """A read of a resident moves its next use on if its pending use is within reach, and the lag
    after which an unseen use counts as past becomes twice how far the read trailed its hand-out.
    Control: out of reach, it is a read of an earlier use: nothing moves, the lag stays."""
    seq = np.array([0, 1, 2, 0, 1, 2])
    h = StagedAhead(seq, 3, [0])
    assert heard_read(h, 0, True, 5, 1, 0, 4) == (USED, 10, -1) and h.pending(0) == 3   # trailed by 5
    h = StagedAhead(seq, 3, [0])
    assert heard_read(h, 0, True, 5, 0, 0, 4) == (USED, 4, -1) and h.pending(0) == 0    # control
    h = StagedAhead(seq, 3, [0])
    assert heard_read(h, 0, True, 1, 1, 0, 4) == (USED, 4, -1) and h.pending(0) == 3    # trailed by 1 < lag


# -- mount/follow.py against the controller's code it replaced -------------------------------------

class _Tier:
    """The parts of mount/copies.py the follower uses, over a tier in memory; ``log``: what was done."""

    def __init__(self, sizes, present, flying):
        self.sizes = np.asarray(sizes, np.int64)
        self.entries = {int(f): entry_size(int(self.sizes[f])) for f in present}
        self.flying = set(flying)
        self.log: list[tuple] = []

    def was_read(self, f):
        self.log.append(("read", f))

    def in_flight(self, f=None):
        return f in self.flying

    def discard(self, f):
        self.log.append(("discard", f))

    def used(self):
        return sum(self.entries.values())

    def evict(self, f):
        freed = self.entries.pop(f, 0)
        self.log.append(("evict", f, freed))
        return freed

    def take_slot(self, wait):
        return True

    def submit_files(self, files):
        for f in files:
            self.entries[f] = entry_size(int(self.sizes[f]))
            self.log.append(("submit", f))

    def add(self, **deltas):
        self.log.append(("count", *sorted(deltas)))


class _Before:
    """``Controller._follow`` and ``_keep_read`` as they were (mount/controller.py before the
    split), over ``_Tier``. ``look_back=False``: the defect ``use_read`` fixed (a late read looked
    for from where the readers are)."""

    def __init__(self, tier, lag, look_back=True):
        self.tier, self._lag, self._reads, self.look_back = tier, lag, deque(), look_back

    def _follow(self, held, handed, reach, capacity):
        t, later, backlog = self.tier, [], 4096
        since = max(0, handed - self._lag)
        while self._reads:
            f, from_source = self._reads.popleft()
            t.was_read(f)
            p = held.pending(f)
            if p is not None:
                if held.read(f, reach):
                    self._lag = max(self._lag, 2 * (handed - p))
                elif p >= held.span and handed >= held.span and len(later) < backlog:
                    later.append((f, from_source))
                    continue
                if from_source and not t.in_flight(f):
                    t.discard(f)
                continue
            if not from_source:
                continue
            q = held.position_of(f, since)
            if (q is None or q >= held.span) and handed >= held.span and len(later) < backlog:
                later.append((f, from_source))
                continue
            self._keep_read(held, f, since, capacity)
        self._reads.extendleft(reversed(later))
        held.consumed(since)

    def _keep_read(self, held, f, since, capacity):
        t = self.tier
        nxt = held.keep_read(f, held.use_read(f, since) if self.look_back else since)
        need = entry_size(int(t.sizes[f]))
        room = capacity - t.used()
        while nxt is not None and room < need:
            victim = held.evict_for(nxt)
            if victim is None:
                break
            room += t.evict(victim)
        if nxt is None or room < need or not t.take_slot(wait=True):
            t.discard(f)
            t.add(not_staged=1)
            return
        t.add(kept_reads=1)
        t.submit_files([f])
        held.staged(f, nxt)


def _differences(seed: int, look_back: bool = True) -> int:
    """Random epochs, plans, residents, copies in flight and rounds of reads heard, followed by
    mount/follow.py and by the code it replaced: the rounds after which what they did, the plan's
    residents and next uses, the lag or the reads left for the next plan differ."""
    from clairvoyant.mount.follow import Follower

    rng = np.random.default_rng(seed)
    n = int(rng.integers(3, 9))
    this, nxt = rng.permutation(n), rng.permutation(n)
    if rng.random() < 0.3:
        nxt = nxt[:0]   # the next epoch's order not published
    sizes = rng.integers(1, 4, n) * 100
    entries = sizes + entry_size(0)
    capacity = int(entries.mean() * rng.integers(1, n + 1))
    present, used = [], 0
    for f in rng.permutation(n).tolist():   # residents of an earlier session, within the capacity
        if rng.random() < 0.4 and used + entries[f] <= capacity:
            present.append(f)
            used += int(entries[f])
    flying = set(rng.permutation(n)[:int(rng.integers(0, 3))].tolist())
    keep = to_stage(this, nxt, entries, capacity, {f: int(entries[f]) for f in present})
    seq = np.concatenate([this, nxt])
    held_new = StagedAhead(seq, n, present, keep=keep)
    held_old = StagedAhead(seq, n, present, keep=keep)
    new_tier, old_tier = _Tier(sizes, present, flying), _Tier(sizes, present, flying)
    new = Follower(new_tier, new_tier)
    lag = int(rng.integers(0, 4))
    new.lag = lag
    old = _Before(old_tier, lag, look_back)
    differ, handed = 0, 0
    for _ in range(int(rng.integers(1, 6))):
        handed = min(len(seq), handed + int(rng.integers(0, n)))
        reach = handed + int(rng.integers(0, 3))
        for _ in range(int(rng.integers(0, 2 * n))):
            read = (int(rng.integers(0, n)), bool(rng.random() < 0.7))
            assert new.heard(*read)
            old._reads.append(read)
        new.follow(held_new, handed, reach, capacity)
        old._follow(held_old, handed, reach, capacity)
        same = (new_tier.log == old_tier.log and new.lag == old._lag and list(new._reads) == list(old._reads)
                and len(held_new) == len(held_old)
                and all(held_new.pending(f) == held_old.pending(f) for f in range(n)))
        differ += not same
    return differ


def test_the_follower_does_what_the_controllers_code_did():
    """mount/follow.py with plan/ahead.py's decisions against the controller's ``_follow`` and
    ``_keep_read`` before the split, over random plans and reads: the same discards, evictions,
    copies and counts, the same plan state after each round. Control: the old code with the defect
    ``use_read`` fixed (a late read looked for from where the readers are) differs, so the
    comparison sees a difference in what is kept."""
    assert sum(_differences(seed) for seed in range(300)) == 0
    assert sum(_differences(seed, look_back=False) for seed in range(300)) > 0


def test_the_mount_does_not_stage_a_file_its_readers_were_heard_reading():
    """Issue 51's capacity flake, the race it closes: a file the readers read (its handoff let go at
    once: no copy was under way) while the walk's view of their progress was older stays out of the
    walk's staging: ``read_since`` the walk's start has it (``wanted`` is False for it), so no copy
    reads the store a second time. Control: a file read before the walk began, or never, is not in
    it, and ``wanted`` stays True for it."""
    from clairvoyant.mount.follow import Follower

    n = 6
    sizes = np.full(n, 100)
    tier = _Tier(sizes, [], set())
    follower = Follower(tier, tier)
    seq = np.arange(n)
    held = StagedAhead(seq, n, [], keep=np.ones(n, bool))
    assert follower.heard(0, True)
    follower.follow(held, 0, 0, 10**6)   # read before the walk began
    start = follower.taken
    assert follower.heard(4, True)       # read ahead of the progress the walk last saw (0)
    follower.follow(held, 0, 0, 10**6)
    seen = follower.read_since(start)
    assert 4 in seen and not wanted(held, 4, 4, True, 0, seen)
    assert 0 not in seen and 5 not in seen and wanted(held, 5, 5, True, 0, seen)   # control
