"""MECHANISM: the byte accounting of one cache tier, shared by every process of the node.

A 16-byte file (bytes in use, peak bytes in use) mapped into each process and
updated under ``flock`` (processes) and a thread lock (threads of one process).
Space is reserved before an entry is written and given back when it is
removed or its write fails, so the tier's bytes never exceed its capacity. A
process killed between the two steps leaves the count off; the first process
of the next session counts the bytes on disk again (``set``).
"""

from __future__ import annotations

import fcntl
import mmap
import os
import struct
import threading
import weakref

_FMT = struct.Struct("<qq")


class Ledger:
    def __init__(self, path: str) -> None:
        self.path = path
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        if os.fstat(fd).st_size < _FMT.size:
            os.ftruncate(fd, _FMT.size)
        self._fd = fd
        self._mm = mmap.mmap(fd, _FMT.size)
        self._tlock = threading.Lock()
        self._closer = weakref.finalize(self, _close, self._mm, fd)

    def close(self) -> None:
        self._closer()

    def _update(self, fn) -> tuple[int, int]:
        with self._tlock:
            fcntl.flock(self._fd, fcntl.LOCK_EX)
            try:
                used, peak = _FMT.unpack_from(self._mm, 0)
                new = fn(used)
                if new is not None:
                    used = new
                    peak = max(peak, used)
                    _FMT.pack_into(self._mm, 0, used, peak)
                return used, peak
            finally:
                fcntl.flock(self._fd, fcntl.LOCK_UN)

    def reserve(self, nbytes: int, capacity: int) -> bool:
        """Take ``nbytes`` if that stays within ``capacity``."""
        got = []

        def take(used: int) -> int | None:
            if used + nbytes > capacity:
                return None
            got.append(True)
            return used + nbytes
        self._update(take)
        return bool(got)

    def give_back(self, nbytes: int) -> None:
        self._update(lambda used: max(0, used - nbytes))

    def set(self, used: int, reset_peak: bool = True) -> None:
        with self._tlock:
            fcntl.flock(self._fd, fcntl.LOCK_EX)
            try:
                peak = used if reset_peak else max(used, _FMT.unpack_from(self._mm, 0)[1])
                _FMT.pack_into(self._mm, 0, used, peak)
            finally:
                fcntl.flock(self._fd, fcntl.LOCK_UN)

    def read(self) -> tuple[int, int]:
        """(bytes in use, peak bytes in use)."""
        return self._update(lambda used: None)


def _close(mm: mmap.mmap, fd: int) -> None:
    mm.close()
    os.close(fd)
