"""MECHANISM: the mount process's copies into the local tier, and its evictions from it.

One stager copies the files (native threads where they are built, else Python's: one interface,
chosen in one place for both front doors, stage/engines.py ``file_engine``), from the daemon's handoff where a
reader's read left one, else from the source. Copies in flight are bounded by staging slots: one
is taken before a file is submitted and given back when the stager tells of its copy (the
collector's batch at once: one wake of a thread waiting for a slot), or at once where no copy
starts (the file present already, no room for it, an error). A handoff that no copy takes is let
go (``discard``), never kept beside the tier. Nothing is decided here: the plan's walk
(mount/walk.py), the read follower (mount/follow.py) and the read-through (mount/opens.py) say
what to copy and what to evict.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from typing import Callable, Iterable

import numpy as np

from ..stage.native_files import Done
from ..stage.engines import file_engine
from ..tune.inflight import InFlight
from .counters import Counters

log = logging.getLogger("clairvoyant")
BACKLOG = 4096   # reads waiting for a staging slot or the plan's thread, at most (their handoffs beside them)


class Copies:
    """Copies of files of ``mount``'s manifest into its local tier, ``threads`` at once (twice that
    submitted); ``handoff``: where the stager takes the daemon's handoffs from (None: from the
    source only, as the tests' control does)."""

    def __init__(self, mount, handoff: str | None, threads: int, sizes: np.ndarray, counters: Counters,
                 stop: threading.Event, poll: float) -> None:
        self.tiers, self.manifest, self.sizes = mount.tiers, mount.manifest, sizes
        self._handoff = mount.handoff   # where the daemon leaves what it read (let go from here)
        self._counters, self._stop, self._poll = counters, stop, poll
        self._lock = threading.Lock()
        self._slots_back = 0   # slots of copies told done in the collector's current batch
        self._inflight = threading.Semaphore(2 * max(1, int(threads)))
        self._unread: set[int] = set()   # staged ahead by the plan and not read yet
        self.told: Callable[[Done], None] | None = None   # told of each copy too (the cluster: mount/cluster/node.py)
        # the requests in flight: the one policy of every door (tune/inflight.py), from the engine's
        # own counters after each batch of copies it tells; at most ``threads`` of the slots' twice
        self.inflight = InFlight(threads, hi=2 * max(1, int(threads)))
        self._tick_lock = threading.Lock()
        self._files = file_engine(self.tiers.local, self.tiers.local_capacity, mount.source.root, handoff,
                                  self.inflight.limit, self._copied, self._copies_told, most=self.inflight.hi)

    # -- slots and submission ---------------------------------------------------------------------

    def take_slot(self, wait: bool) -> bool:
        """One of the staging slots (in-flight copies); without ``wait``, only if one is free now."""
        if not wait:
            return self._inflight.acquire(blocking=False)
        while not self._inflight.acquire(timeout=self._poll):
            if self._stop.is_set():
                return False
        return True

    def release(self, n: int = 1) -> None:
        """Give back ``n`` slots taken for files that were never submitted."""
        self._inflight.release(n)

    def submit(self, i: int, wait: bool = True, slot: bool = False) -> bool:
        """Stage file ``i`` (True: handed to the stager); without ``wait``, only if a slot is free;
        ``slot``: the caller took one already."""
        if not (slot or self.take_slot(wait)):
            return False
        self.submit_files([i])
        return True

    def submit_files(self, files: list[int]) -> list[int]:
        """Stage ``files``, a slot taken for each, with one call into the stager; a file
        already in the tier, or with no room for it, gives its slot back at once. Returns the files
        that are neither in the tier nor on their way there (no room, or an error)."""
        items, refused = [], []
        for i in files:
            key, size = self.manifest.keys[i], int(self.sizes[i])
            try:
                if self.tiers.find_local(key, size) is None:
                    items.append((i, key, size))
                    continue
                self._counters.add(present=1)
            except Exception as e:
                self._failed(key, e)
                refused.append(i)
            self.discard(i)
            self._inflight.release()
        if not items:
            return refused
        try:
            got = self._files.submit_many(items)
        except Exception as e:
            for i, key, _ in items:
                self._failed(key, e)
                self.discard(i)
            self._inflight.release(len(items))
            return refused + [i for i, _, _ in items]
        back = 0
        for (i, key, _), g in zip(items, got):
            if g is True:
                continue   # _copied hears of it
            back += 1
            if isinstance(g, Exception):
                self._failed(key, g)
            elif g is False:
                self._counters.add(not_staged=1)
            if g is not None:   # None: its copy is under way; a handoff is that copy's to take
                self.discard(i)
                refused.append(i)
        if back:
            self._inflight.release(back)
        return refused

    def in_flight(self, i: int | None = None) -> bool:
        """Whether a copy of file ``i`` (None: of any file) by this process is under way."""
        return self._files.in_flight(i)

    # -- what the stager tells ---------------------------------------------------------------------

    def _failed(self, key: str, e: object) -> None:
        self._counters.add(failed=1)
        log.warning("clairvoyant mount: staging %s failed: %s", key, e)

    def _copied(self, d: Done) -> None:
        try:
            if d.loc is not None:
                self._counters.add(staged_local=1, staged_bytes=int(self.sizes[d.token]),
                                   handed_over=int(bool(d.handed_over)))
            elif d.present:   # another process of the node staged it meanwhile
                self._counters.add(present=1)
            elif not self._stop.is_set():   # at the stop, files not started are simply not staged
                self._failed(d.key, d.error)
        finally:
            if d.loc is None:   # the C thread removes a handoff it read; one it never got to goes here
                self.discard(d.token)
            with self._lock:   # (the Python engine tells from several threads)
                self._slots_back += 1   # given back with the batch's others: one wake of the plan's thread
            if self.told is not None:
                self.told(d)

    def _copies_told(self) -> None:
        with self._lock:
            n, self._slots_back = self._slots_back, 0
        if n:
            self._inflight.release(n)
        with self._tick_lock:   # (the Python twin tells from each of its threads)
            limit = self.inflight.follow(time.monotonic(), self._files.load())
            if limit is not None:
                self._files.limit(limit)
                self._counters.set(inflight=limit)

    # -- the tier ----------------------------------------------------------------------------------

    def discard(self, i: int) -> None:
        """A handed-over file this process did not cache (present already, or no room): let it go."""
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(self._handoff, str(i)))

    def used(self) -> int:
        """Bytes in the local tier, counting those on their way there (reserved when submitted)."""
        return self.tiers.local.ledger.read()[0]

    def staged_ahead(self, files: Iterable[int]) -> None:
        """``files`` were staged ahead of their readers: an eviction before their read is counted."""
        self._unread.update(files)

    def was_read(self, i: int) -> None:
        """File ``i`` was read (whichever use it served, a copy staged ahead was read)."""
        self._unread.discard(i)

    def evict(self, i: int) -> int:
        """Delete the entry of file ``i`` if it is there: the bytes freed (0: not there, e.g. its copy
        is on the way)."""
        freed = self.tiers.drop(self.manifest.keys[i])   # (counted by the tier too)
        if freed:
            self._counters.add(evicted=1)
            if i in self._unread:   # staged ahead and given way before anyone read it: wasted
                self._unread.discard(i)
                self._counters.add(evicted_unread=1)
        return freed

    def close(self) -> None:
        self._files.close()
