"""MECHANISM: how far each rank of the node has staged, for deadline scheduling across ranks.

One slot per rank of the node in a small shared file: the rank's staging
frontier (``epoch << 32 | first batch not yet fully staged``) and when it was
last written. A rank's staging threads do not take work whose deadline lies
more than ``slack`` batches beyond the slowest active rank's frontier, so the
node's shared storage serves the rank that is furthest behind first (earliest
deadline first across ranks, Lobster's balance among the GPUs of a node). A rank
that stopped writing for ``stale`` seconds (done, or gone) no longer holds the
others back, and no thread waits longer than ``max_wait`` for one item, so
nothing can deadlock on it.
"""

from __future__ import annotations

import mmap
import os
import struct
import time
import weakref

_SLOT = struct.Struct("<qd")   # frontier (-1: not staging), time of the last update


class NodeProgress:
    def __init__(self, root: str, index: int, size: int, *, slack: int = 4, stale: float = 5.0,
                 max_wait: float = 0.5) -> None:
        self.index, self.size, self.slack, self.stale, self.max_wait = index, size, slack, stale, max_wait
        path = os.path.join(root, f"progress.{size}")
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        if os.fstat(fd).st_size < _SLOT.size * size:
            os.ftruncate(fd, _SLOT.size * size)
        self._mm = mmap.mmap(fd, _SLOT.size * size)
        os.close(fd)
        self._closer = weakref.finalize(self, self._mm.close)
        self.set(-1)

    def set(self, frontier: int) -> None:
        _SLOT.pack_into(self._mm, _SLOT.size * self.index, frontier, time.time())

    def limit(self) -> int | None:
        """The latest deadline this rank may stage now, or None if no other rank holds it back."""
        now, low = time.time(), None
        for i in range(self.size):
            if i == self.index:
                continue
            frontier, stamp = _SLOT.unpack_from(self._mm, _SLOT.size * i)
            if frontier >= 0 and now - stamp < self.stale:
                low = frontier if low is None else min(low, frontier)
        return None if low is None else low + self.slack

    def wait_for(self, deadline: int, stopped) -> None:
        """Sleep while ``deadline`` is beyond what the slowest rank allows (at most ``max_wait``)."""
        end = None
        while True:
            lim = self.limit()
            if lim is None or deadline <= lim or stopped():
                return
            now = time.monotonic()
            end = end or now + self.max_wait
            if now >= end:
                return
            time.sleep(0.001)

    def close(self) -> None:
        try:
            self.set(-1)
        except ValueError:
            pass
        self._closer()
