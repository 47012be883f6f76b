"""Open file descriptors kept per process, so that hot files are read with ``pread`` alone.

An open on a shared file system costs milliseconds, and even a local one is a
path walk; readers of tar shards and of the local tier's extents read many
small ranges of few large files. At most ``limit`` descriptors stay open
(least recently used closed first, never one a thread is reading through). A
forked child closes its parent's copies and opens its own (the pid is checked
on each use), and a descriptor whose file was deleted meanwhile (an extent
removed, its name later reused) is dropped and the path opened again.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from contextlib import contextmanager
from typing import Callable, Hashable, Iterator

from .fileio import pid


def _open_ro(path: str) -> int:
    return os.open(path, os.O_RDONLY | os.O_CLOEXEC)


class FdCache:
    def __init__(self, limit: int = 64, opener: Callable[[str], int] = _open_ro, recheck: bool = False) -> None:
        """``opener(path)`` opens a file; ``recheck``: make sure a cached descriptor's file still has a
        name (one fstat per use) before it is handed out."""
        self.limit, self.opener, self.recheck = limit, opener, recheck
        self._pid = pid()
        self._lock = threading.Lock()
        self._open: OrderedDict[Hashable, list[int]] = OrderedDict()   # key -> [fd, users]

    def _after_fork(self) -> None:
        for fd, _ in self._open.values():   # the child's copies; the parent keeps its own
            try:
                os.close(fd)
            except OSError:
                pass
        self._open, self._lock, self._pid = OrderedDict(), threading.Lock(), pid()

    def acquire(self, key: Hashable, path: str) -> int:
        """A descriptor of ``path`` (cached under ``key``), held until ``release(key)``."""
        if self._pid != pid():
            self._after_fork()
        with self._lock:
            e = self._open.get(key)
            if e is not None and self.recheck and e[1] == 0 and os.fstat(e[0]).st_nlink == 0:
                os.close(self._open.pop(key)[0])   # deleted since: its name may now be another file's
                e = None
            if e is not None:
                e[1] += 1
                self._open.move_to_end(key)
                return e[0]
        fd = self.opener(path)   # outside the lock: an open on a shared file system is slow
        with self._lock:
            e = self._open.get(key)
            if e is None:
                self._open[key] = [fd, 1]
                self._trim()
                return fd
            e[1] += 1
        os.close(fd)   # another thread opened it meanwhile
        return e[0]

    def release(self, key: Hashable) -> None:
        with self._lock:
            e = self._open.get(key)
            if e is not None:
                e[1] -= 1
                self._trim()

    @contextmanager
    def using(self, key: Hashable, path: str) -> Iterator[int]:
        fd = self.acquire(key, path)
        try:
            yield fd
        finally:
            self.release(key)

    def forget(self, key: Hashable) -> None:
        """Close ``key``'s descriptor now if no thread reads through it (else at the next trim)."""
        with self._lock:
            e = self._open.get(key)
            if e is not None and e[1] == 0:
                os.close(self._open.pop(key)[0])

    def _trim(self) -> None:
        if len(self._open) <= self.limit:
            return
        for key in [k for k, (_, users) in self._open.items() if users == 0][:len(self._open) - self.limit]:
            os.close(self._open.pop(key)[0])

    def close(self) -> None:
        if self._pid == pid():
            with self._lock:
                while self._open:
                    os.close(self._open.popitem()[1][0])

    def __len__(self) -> int:
        return len(self._open)
