"""MECHANISM: with a sampler, the daemon's first reads as the plan's thread takes them up.

The events thread (mount/controller.py) queues each first read the daemon reports, the file and
whether it came from the source (``heard``); the plan's thread (mount/walk.py), each time it looks
at the readers' progress, brings the plan up to them (``follow``): the uses handed out long enough
ago count as past, each read the daemon saw moves its file's next use on, and a file read from the
source is kept if the plan would keep it (plan/ahead.py), else its handoff goes. (Which late-read
file to keep and which resident gives way for it are still weighed here, beside the mechanism.)
"""

from __future__ import annotations

from collections import deque

from ..cache.entry import entry_size
from ..plan.ahead import StagedAhead
from .copies import BACKLOG, Copies
from .counters import Counters
from .orders import PROGRESS_EVERY

MIN_LAG = 2 * PROGRESS_EVERY   # positions handed out before a use unseen by the daemon counts as past


class Follower:
    """The first reads heard and not yet taken up by the plan, and how far the readers trail their
    hand-outs (``lag``: ``MIN_LAG`` or more, kept from plan to plan)."""

    def __init__(self, copies: Copies, counters: Counters) -> None:
        self._copies, self._counters = copies, counters
        self._reads: deque[tuple[int, bool]] = deque()   # (file, from the source?)
        self.lag = MIN_LAG

    def heard(self, f: int, from_source: bool) -> bool:
        """Queue the daemon's report of a first read of ``f`` (from the events thread); False: the
        plan's thread is ``BACKLOG`` reads behind, and this one is not queued."""
        if len(self._reads) >= BACKLOG:
            return False
        self._reads.append((f, from_source))
        return True

    def pending(self) -> bool:
        """Whether reads wait to be taken up."""
        return bool(self._reads)

    def follow(self, held: StagedAhead, handed: int, reach: int, capacity: int) -> None:
        """Bring the plan up to the readers: the uses they were handed long enough ago count as
        past (``MIN_LAG``, or twice the longest a seen read trailed its hand-out), each read the
        daemon saw moves its file's next use on, and a file read from the source is kept if the
        plan would keep it (plan/ahead.py), else its handoff goes."""
        later: list[tuple[int, bool]] = []   # reads of the next epoch's uses: for the next plan
        since = max(0, handed - self.lag)
        while self._reads:
            f, from_source = self._reads.popleft()
            self._copies.was_read(f)   # whichever use it served, a staged copy was read
            p = held.pending(f)
            if p is not None:
                if held.read(f, reach):
                    self.lag = max(self.lag, 2 * (handed - p))
                elif p >= held.span and handed >= held.span and len(later) < BACKLOG:
                    later.append((f, from_source))   # the readers began the next epoch before its order came
                    continue
                if from_source and not self._copies.in_flight(f):   # a copy under way takes the handoff
                    self._copies.discard(f)
                continue
            if not from_source:
                continue
            q = held.position_of(f, since)
            if (q is None or q >= held.span) and handed >= held.span and len(later) < BACKLOG:
                later.append((f, from_source))
                continue
            self._keep_read(held, f, since, capacity)
        self._reads.extendleft(reversed(later))
        held.consumed(since)

    def _keep_read(self, held: StagedAhead, f: int, since: int, capacity: int) -> None:
        nxt = held.keep_read(f, held.use_read(f, since))
        need = entry_size(int(self._copies.sizes[f]))
        room = capacity - self._copies.used()
        while nxt is not None and room < need:
            victim = held.evict_for(nxt)
            if victim is None:
                break
            room += self._copies.evict(victim)
        if nxt is None or room < need or not self._copies.take_slot(wait=True):   # (a slot frees within a copy)
            self._copies.discard(f)
            self._counters.add(not_staged=1)
            return
        self._counters.add(kept_reads=1)
        self._copies.submit_files([f])
        held.staged(f, nxt)
