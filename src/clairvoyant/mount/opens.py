"""MECHANISM: without a sampler, what programs open: read-through and read-ahead.

Each file a program reads from the source is staged after that read from the daemon's handoff, if
the tier has room (read-through caching in first-open order, no eviction): a second pass over a
data set that fits reads nothing from the source; one that does not fit keeps the first files
opened. A read heard while every staging slot is taken waits in a backlog (its handoff beside it)
and is taken up as slots free; the events thread never waits for the stager. And where the opens
follow the listing's order or repeat an earlier pass's, the files that come next are staged ahead
of the opens, and in a full tier the files opened last give way: plan/readahead.py decides both.
Where the opens follow no order and look like a shuffled first pass over the data set, the files
not opened yet are staged in the listing's order at the stager's concurrency (``fill``), while the
tier has room: nothing gives way for them.
Once a sampler publishes an order, all of this stands down (``stand_down``): the plan knows.

In a cluster of mounts (``cluster``, mount/cluster/node.py) a node keeps only its home files, as
plan/unplanned.py's ``HomesLRU`` decides (least recently read across the cluster goes first); a
file of another home read from the source here (its home did not answer) is kept nowhere, and
nothing is read ahead: the homes' tiers together are the cache.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from typing import Callable

from ..cache.entry import entry_size
from ..plan.readahead import Readahead
from .copies import BACKLOG, Copies
from .counters import Counters
from .orders import WATCH_EVERY

FILL_EACH = 64   # files the fill hands out at an open at most (as many as staging slots are free are staged)


class Opens:
    """The read-through and read-ahead of one mount process while ``sampler`` is not set.
    ``give_way``: how read-ahead makes room (bytes wanted -> bytes freed); None: ``give_way``."""

    def __init__(self, copies: Copies, counters: Counters, sampler: threading.Event, stop: threading.Event,
                 give_way: Callable[[int], int] | None = None, cluster=None) -> None:
        self._copies, self._counters, self._sampler, self._stop = copies, counters, sampler, stop
        self._cluster = cluster
        self._make_room = give_way or self.give_way
        self._backlog: deque[int] = deque()   # files read from the source waiting for a slot
        # read-ahead asks for at most half the files the tier holds at once: what a full tier gives
        # way to is what was read last, never what read-ahead still waits for
        sizes, capacity = copies.sizes, copies.tiers.local_capacity
        fit = capacity // max(1, entry_size(int(sizes.mean())) if len(sizes) else 1)
        half = int(max(1, fit // 2))
        self._readahead = Readahead(len(copies.manifest), max_window=min(64, half),
                                    max_outstanding=min(1024, half), busy=min(16, max(1, fit // 4)))
        self._giving_way = threading.Lock()   # held while read-ahead evicts; a plan starts after that
        self._full = False   # the fill met a full tier: it stops for good (it never makes room)
        self._filling: set[int] = set()   # the fill's files whose copies may still be under way

    @property
    def waiting(self) -> bool:
        """Whether reads wait in the backlog for a slot."""
        return bool(self._backlog)

    def drain(self) -> None:
        """Stage what waits in the backlog, as far as slots are free now."""
        backlog = self._backlog
        while backlog and self._copies.submit(backlog[0], wait=False):
            backlog.popleft()
            self._counters.add(read_through=1)

    def opened(self, f: int, from_source: bool) -> None:
        """The daemon's report of a first read of ``f``: what came from the source is cached from
        its handoff; then the files that follow it are read ahead, if the opens follow an order."""
        cluster = self._cluster
        if cluster is not None:
            own = cluster.owns(f)
            if not own or not cluster.read_own(f, from_source):
                if from_source:   # another home's file, or one its home does not keep: not here
                    self._copies.discard(f)
                    self._counters.add(**({"not_staged": 1} if own else {"not_home": 1}))
                return
        if from_source:
            if not self._backlog and self._copies.submit(f, wait=False):
                self._counters.add(read_through=1)
            elif len(self._backlog) < BACKLOG:
                self._backlog.append(f)
            else:   # far behind: let this one go rather than keep its handoff beside the tier
                self._copies.discard(f)
                self._counters.add(not_staged=1)
        if not self._sampler.is_set() and cluster is None:   # no order: guess the next files from the opens
            self._read_ahead(f)
            self._fill()

    def _read_ahead(self, f: int) -> None:
        ahead = self._readahead.opened(f, time.monotonic())
        if not ahead:
            return
        copies = self._copies
        room, n = copies.tiers.local_capacity - copies.used(), 0
        for g in ahead:
            if self._sampler.is_set():
                break
            if not copies.take_slot(wait=False):   # never hold the events up: later opens ask again
                break
            need = entry_size(int(copies.sizes[g]))
            if room < need:   # a slot is there: only now does anything give way
                room += self._make_room(need - room)
                if room < need:
                    copies.release()
                    self._counters.add(ahead_no_room=1)
                    break
            copies.submit(g, slot=True)
            room -= need
            n += 1
        if n < len(ahead):
            self._readahead.not_staged(ahead[n:])   # asked again at a later open
        self._counters.add(read_ahead=n)

    def _fill(self) -> None:
        """A shuffled first pass: stage the files not opened yet, as many as the fill's limit and the
        free slots allow now, while the tier has room (plan/readahead.py ``fill``)."""
        if self._full:
            return
        ra, copies = self._readahead, self._copies
        self._filling = {g for g in self._filling if copies.in_flight(g)}
        files = ra.fill(min(FILL_EACH, ra.fill_limit - len(self._filling)))
        if not files:   # (most opens: no shuffled pass, or nothing left; the tier's ledger is not read)
            return
        room, n = copies.tiers.local_capacity - copies.used(), 0
        for g in files:
            need = entry_size(int(copies.sizes[g]))
            if room < need:
                self._full = True   # the data set does not fit: what is staged stays, nothing more
                break
            if self._sampler.is_set() or not copies.take_slot(wait=False):
                break
            copies.submit(g, slot=True)
            self._filling.add(g)
            room -= need
            n += 1
        ra.not_filled(files[n:])
        if n:
            self._counters.add(filled=n)

    def give_way(self, nbytes: int) -> int:
        """Evict files opened last (plan/readahead.py) until ``nbytes`` are free; the bytes freed."""
        freed = tries = 0
        with self._giving_way:   # a sampler's plan, once started, sees the tier as no eviction leaves it
            for v in self._readahead.give_way():
                if freed >= nbytes or tries >= 256 or self._sampler.is_set():
                    break
                tries += 1
                freed += self._copies.evict(v)
        return freed

    def stand_down(self) -> None:
        """A sampler published an order: no more guessing from the opens. Returns once no eviction
        of read-ahead's is under way and its copies landed (2 s at most), so that the plan sees the
        tier as it is."""
        with self._giving_way:   # no read-ahead eviction under way from here on
            self._sampler.set()
        deadline = time.monotonic() + 2.0   # read-ahead's copies land before the tier is looked at
        while self._readahead.staged and self._copies.in_flight() and time.monotonic() < deadline:
            self._stop.wait(WATCH_EVERY)
