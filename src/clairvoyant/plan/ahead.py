"""POLICY, pure: which resident to evict while staging ahead of readers in a known sequence,
and whether a file the readers had to read from the source is worth keeping.

The mount (mount/walk.py) stages the node's merged order ahead of the slowest rank's
progress. When the tier is full, the resident whose next use, counted from the consumption point
on, is farthest gives way, but only if that use comes after the file about to be staged;
otherwise staging waits for the readers. ``StagedAhead`` keeps the residents in a lazy max-heap by
that next use (plan/evict.py's ``FarthestNextUse``) and moves a resident's next use on when the
readers pass its current one, so choosing a victim costs log R rather than a scan of every
resident (R is in the millions for ImageNet on a large local disk).

What to stage at all is the Loader's decision (``to_stage``): farthest-next-use over the node's
sequence of this epoch, looking into the next, says per access whether it is a hit and whether
the sample is kept after it; only a miss that is kept is staged ahead. A miss that is not kept
is left to its reader (read from the source at its open, as the Loader reads it into its RAM
window): staged ahead, it would hold room from its copy to its use, and what gave way for it
would be read again. So the mount reads the store once per miss of the Loader's plan.

A sampler hands out indices before its readers open the files (a DataLoader's workers run a
few batches behind it), so a resident's use counts as past only once its read was seen
(``read``) or the readers were handed positions well beyond it (``consumed``, which the caller
gives a lag): a file handed out but not yet opened is never the one to give way. A file read from
the source (not staged in time) is kept if the plan keeps that access (``keep_read``).

The mount hears of each first read after the fact (the daemon reports it through a pipe), and
``heard_read`` decides what one comes to: a resident's use moves on (and, when the read counts,
how far the readers trail their hand-outs: the lag after which a use unseen counts as past), a
read of the next epoch's use heard before its order came waits for the next plan, and a file
read from the source is kept for its next use or let go. Room for one kept is made by
``keep_step``: the resident needed farthest after that use gives way, none needed sooner; where
none can, the file is let go (its reader has it already: nothing waits). The mount
(mount/follow.py) carries these out and decides nothing itself.
"""

from __future__ import annotations

from typing import Container, Iterable, NamedTuple

import numpy as np

from .evict import FarthestNextUse
from .residency import first_positions, group_positions, next_use_positions, simulate_epoch


def to_stage(sequence: np.ndarray, following: np.ndarray, entry_sizes: np.ndarray, capacity: int,
             residents: dict[int, int]) -> np.ndarray:
    """Per access of ``sequence`` (this epoch's, the node's order): whether to stage it ahead: a
    miss that the Loader's plan (plan/residency.py, looking into ``following``) keeps."""
    plan = simulate_epoch(np.asarray(sequence, np.int64), np.asarray(following, np.int64), entry_sizes, capacity,
                          residents)
    return ~plan.hit & plan.keep


SKIP, STAGE, EVICT, WAIT = "skip", "stage", "evict", "wait"


class Step(NamedTuple):
    """What to do about one position of the sequence now: ``SKIP`` it (not a miss the plan keeps,
    handed out already, resident, or gathered for a copy), ``STAGE`` it (room is there), ``EVICT``
    ``victim`` to make room for it, or ``WAIT`` for the readers to move on (every resident is
    needed before it)."""

    kind: str
    victim: int = -1


def wanted(held: "StagedAhead", position: int, sample: int, stage: bool, handed: int,
           gathered: Container[int] = frozenset()) -> bool:
    """Whether ``position`` is still one to stage: a miss the plan keeps, not yet handed out to the
    readers (a reader takes such a file from wherever it is), not resident, not in ``gathered``
    (gathered for a copy; the mount adds the files its readers were heard reading)."""
    return stage and position >= handed and sample not in held and sample not in gathered


def next_step(held: "StagedAhead", position: int, sample: int, stage: bool, handed: int, need: int, room: int,
              gathered: Container[int] = frozenset()) -> Step:
    """The mount's decision at ``position`` of the sequence (``sample`` there; ``stage``: the plan
    keeps this miss), the readers handed out up to ``handed``, ``need`` bytes for its entry and
    ``room`` bytes free in the tier: the rule of this module's docstring. An ``EVICT`` takes its
    victim out of ``held`` (the caller deletes its entry, then asks again)."""
    if not wanted(held, position, sample, stage, handed, gathered):
        return Step(SKIP)
    if need <= room:
        return Step(STAGE)
    victim = held.evict_for(position)
    return Step(WAIT) if victim is None else Step(EVICT, victim)


def keep_step(held: "StagedAhead", position: int, need: int, room: int) -> Step:
    """Room for a file read from the source and kept for its use at ``position`` (``heard_read``'s
    ``KEEP``), ``need`` bytes for its entry and ``room`` bytes free: ``STAGE`` it (it fits),
    ``EVICT`` ``victim`` (the resident needed farthest after ``position``, taken out of ``held``;
    the caller deletes its entry, counts the bytes that freed into ``room`` and asks again), or
    ``SKIP``: every resident is needed at or before it, and it is let go."""
    if need <= room:
        return Step(STAGE)
    victim = held.evict_for(position)
    return Step(SKIP) if victim is None else Step(EVICT, victim)


USED, LATER, KEEP, DROP, NONE = "used", "later", "keep", "drop", "none"


class Heard(NamedTuple):
    """What a first read the daemon reported comes to: ``USED`` (a resident was read: its use moved
    on, or it was a read of an earlier use; a handoff of it is not needed), ``LATER`` (a read of the
    next epoch's use, heard before that epoch's order: for the next plan), ``KEEP`` (read from the
    source, and the plan keeps that access: stage it for its next use at ``position``, room made by
    ``keep_step``), ``DROP`` (read from the source, not kept: let it go) or ``NONE`` (a file not
    resident, served from the tier: nothing to do). ``lag``: how far behind its hand-out a use
    unseen by the daemon may still be read, after this read."""

    kind: str
    lag: int
    position: int = -1


def heard_read(held: "StagedAhead", sample: int, from_source: bool, handed: int, reach: int, since: int,
               lag: int, defer: bool = True) -> Heard:
    """A first read of ``sample`` (``from_source``: not from the tier), heard with the readers handed
    positions up to ``handed``, the fastest able to have got to ``reach``, and surely past ``since``
    (``handed`` less ``lag``); ``defer``: a read of the next epoch's use can wait for the next plan
    (False: no room to hold it). A resident's read that counts (``StagedAhead.read``) moves its next
    use on and widens ``lag`` to twice how far it trailed its hand-out; a file not resident read
    from the source is kept if the plan keeps the use it served (``use_read``, ``keep_read``)."""
    p = held.pending(sample)
    if p is not None:   # a resident was read
        if held.read(sample, reach):
            return Heard(USED, max(lag, 2 * (handed - p)))
        if p >= held.span and handed >= held.span and defer:   # the readers began the next epoch early
            return Heard(LATER, lag)
        return Heard(USED, lag)
    if not from_source:
        return Heard(NONE, lag)
    q = held.position_of(sample, since)
    if (q is None or q >= held.span) and handed >= held.span and defer:
        return Heard(LATER, lag)
    nxt = held.keep_read(sample, held.use_read(sample, since))
    return Heard(DROP, lag) if nxt is None else Heard(KEEP, lag, nxt)


class StagedAhead:
    """Residents of a tier over ``sequence`` (sample per position) staged ahead of consumption."""

    def __init__(self, sequence: np.ndarray, num_samples: int, residents: Iterable[int] = (),
                 keep: np.ndarray | None = None) -> None:
        """``keep``: per position (a prefix of the sequence), whether a read of it from the source
        is worth keeping (``to_stage``); None: any read with a later use is."""
        self.sequence = np.ascontiguousarray(sequence, dtype=np.int64)
        self._next = next_use_positions(self.sequence, num_samples)   # NEVER where none follows
        first = first_positions(self.sequence, num_samples)
        self._held = FarthestNextUse(1 << 62)   # its capacity plays no part: the tier's ledger decides
        for s in residents:
            self._held.admit(int(s), 0, int(first[s]))
        self._seen = 0   # positions whose consumption is accounted for
        self._keep = keep
        # the positions of each sample, for reads of files that are not residents
        self._by_sample, self._starts, _ = group_positions(self.sequence, num_samples, place=False)

    def __contains__(self, sample: int) -> bool:
        return sample in self._held

    def __len__(self) -> int:
        return len(self._held)

    def consumed(self, upto: int) -> None:
        """The readers have used every position before ``upto``: a resident used there is next
        needed at its following use."""
        seq, nxt = self.sequence, self._next
        for p in range(self._seen, min(int(upto), len(seq))):
            s = int(seq[p])
            if s in self._held:
                self._held.touch(s, int(nxt[p]))
        self._seen = max(self._seen, int(upto))

    @property
    def span(self) -> int:
        """Positions of this epoch (those ``keep`` covers; the rest are the next epoch's)."""
        return len(self.sequence) if self._keep is None else len(self._keep)

    def pending(self, sample: int) -> int | None:
        """The position of a resident's next use, or None if it is not resident."""
        return self._held.next_use(int(sample))

    def read(self, sample: int, before: int) -> bool:
        """A resident was read: the use it was held for is past, if that use comes before
        ``before`` (how far the readers can have got); its next one counts from now. False: a
        read of an earlier use (a file handed out before it was staged), nothing changes."""
        p = self.pending(sample)
        if p is None or p >= min(before, len(self.sequence)):
            return False
        self._held.touch(int(sample), int(self._next[p]))
        return True

    def position_of(self, sample: int, at_or_after: int) -> int | None:
        """The first position of ``sample`` at or after ``at_or_after``, or None."""
        s = int(sample)
        if not 0 <= s < len(self._starts) - 1:
            return None
        mine = self._by_sample[self._starts[s]:self._starts[s + 1]]
        k = int(np.searchsorted(mine, at_or_after))
        return int(mine[k]) if k < len(mine) else None

    def use_read(self, sample: int, since: int) -> int:
        """Where to look for the use a read of ``sample`` from the source served (``keep_read``'s
        ``at_or_after``): ``since`` (how far the readers are surely past) if the sample has a use
        of this sequence there or later; else its last use before ``since``: a read the mount
        heard of only after the readers had moved past its use (the readers' first batches, opened
        before any copy was made) still served that use, and the plan's word on it holds."""
        p = self.position_of(sample, since)
        if p is not None and p < self.span:
            return since
        s = int(sample)
        if not 0 <= s < len(self._starts) - 1:
            return since
        mine = self._by_sample[self._starts[s]:self._starts[s + 1]]
        k = int(np.searchsorted(mine, since)) - 1
        return int(mine[k]) if k >= 0 else since

    def keep_read(self, sample: int, at_or_after: int) -> int | None:
        """A file not resident was read from the source for its use at the first position at or
        after ``at_or_after``: the position of its next use (NEVER past the sequence) if it is
        worth keeping (the plan keeps that access; without a plan, some use follows), else None.
        The caller makes room with ``evict_for`` (which gives way only to residents needed later
        than that) and then calls ``staged``."""
        p = self.position_of(sample, at_or_after)
        if p is None:
            return None
        nxt = int(self._next[p])
        if self._keep is not None:   # the plan's word, also for a sample kept in room that was free
            return nxt if p < len(self._keep) and self._keep[p] else None
        return None if nxt >= len(self.sequence) else nxt

    def staged(self, sample: int, position: int) -> None:
        """``sample`` is being staged for its use at ``position``."""
        self._held.admit(int(sample), 0, int(position))

    def evict_for(self, position: int) -> int | None:
        """The resident to evict to make room for the file used at ``position`` (removed from the
        residents), or None when every resident is needed at or before it."""
        return self._held.pop_farthest(later_than=position)
