"""MECHANISM: with a sampler, the daemon's first reads as the plan's thread takes them up.

The events thread (mount/controller.py) queues each first read the daemon reports, the file and
whether it came from the source (``heard``); the plan's thread (mount/walk.py), each time it looks
at the readers' progress, brings the plan up to them (``follow``): each read goes as plan/ahead.py's
``heard_read`` says (a resident's use moves on and its handoff goes, a read of the next epoch's
use waits for the next plan, a file read from the source is staged from its handoff for its next
use or let go), room for a kept one is made as ``keep_step`` says, and the uses handed out long
enough ago count as past. What is this module's own: the queue between the two threads, the room
in the tier, the staging slot, and the bytes an eviction freed.
"""

from __future__ import annotations

from collections import deque
from typing import Container

import numpy as np

from ..cache.entry import entry_size
from ..plan.ahead import DROP, EVICT, KEEP, LATER, STAGE, USED, StagedAhead, heard_read, keep_step
from .copies import BACKLOG, Copies
from .counters import Counters
from .orders import PROGRESS_EVERY

MIN_LAG = 2 * PROGRESS_EVERY   # positions handed out before a use unseen by the daemon counts as past


class ReadSince:
    """``f in`` it: ``f`` is in ``also``, or a read of it was taken up after the first ``taken``."""

    def __init__(self, heard_at: np.ndarray, taken: int, also: Container[int] = ()) -> None:
        self._heard_at, self._taken, self._also = heard_at, taken, also

    def __contains__(self, f: int) -> bool:
        return f in self._also or bool(self._heard_at[f] > self._taken)


class Follower:
    """The first reads heard and not yet taken up by the plan, and how far the readers trail their
    hand-outs (``lag``: ``MIN_LAG`` or more, kept from plan to plan)."""

    def __init__(self, copies: Copies, counters: Counters) -> None:
        self._copies, self._counters = copies, counters
        self._reads: deque[tuple[int, bool]] = deque()   # (file, from the source?)
        self.lag = MIN_LAG
        self.taken = 0   # reads taken up so far (a walk knows from it that its readers began)
        # per file, the count of reads taken up when its last read of a use was (-1: none): a walk
        # does not stage a file its readers read since it began (``read_since``)
        self.heard_at = np.full(len(copies.sizes), -1, np.int64)

    def heard(self, f: int, from_source: bool) -> bool:
        """Queue the daemon's report of a first read of ``f`` (from the events thread); False: the
        plan's thread is ``BACKLOG`` reads behind, and this one is not queued."""
        if len(self._reads) >= BACKLOG:
            return False
        self._reads.append((f, from_source))
        return True

    def read_since(self, taken: int, also: Container[int] = ()) -> ReadSince:
        """The files whose read was taken up after the first ``taken`` reads (a walk's start), and
        those in ``also``."""
        return ReadSince(self.heard_at, taken, also)

    def pending(self) -> bool:
        """Whether reads wait to be taken up."""
        return bool(self._reads)

    def follow(self, held: StagedAhead, handed: int, reach: int, capacity: int) -> None:
        """Bring the plan ``held`` up to the readers, handed positions up to ``handed`` (the fastest
        can be at ``reach``): the reads heard, as plan/ahead.py decides, then the uses handed out
        ``lag`` positions ago or more count as past."""
        later: list[tuple[int, bool]] = []   # reads of the next epoch's uses: for the next plan
        since = max(0, handed - self.lag)
        while self._reads:
            f, from_source = self._reads.popleft()
            self.taken += 1
            self._copies.was_read(f)   # whichever use it served, a staged copy was read
            h = heard_read(held, f, from_source, handed, reach, since, self.lag, defer=len(later) < BACKLOG)
            self.lag = h.lag
            if h.kind == LATER:   # the readers began the next epoch before its order came
                later.append((f, from_source))
                continue
            self.heard_at[f] = self.taken
            if h.kind == USED:
                if from_source and not self._copies.in_flight(f):   # a copy under way takes the handoff
                    self._copies.discard(f)
            elif h.kind == KEEP:
                self._keep(held, f, h.position, capacity)
            elif h.kind == DROP:
                self._let_go(f)
        self._reads.extendleft(reversed(later))
        held.consumed(since)

    def _keep(self, held: StagedAhead, f: int, position: int, capacity: int) -> None:
        """Stage ``f`` from its handoff for its use at ``position``, making room as ``keep_step``
        says; let it go where no room can be made or the stop comes first."""
        need = entry_size(int(self._copies.sizes[f]))
        room = capacity - self._copies.used()
        step = keep_step(held, position, need, room)
        while step.kind == EVICT:
            room += self._copies.evict(step.victim)   # (0 if its copy is still on the way)
            step = keep_step(held, position, need, room)
        if step.kind != STAGE or not self._copies.take_slot(wait=True):   # (a slot frees within a copy)
            self._let_go(f)
            return
        self._counters.add(kept_reads=1)
        self._copies.submit_files([f])
        held.staged(f, position)

    def _let_go(self, f: int) -> None:
        self._copies.discard(f)
        self._counters.add(not_staged=1)
