"""Writing a cache entry, and the claim on a sample that comes before it.

The node-wide lock of one sample (a byte-range lock) lets the ranks of a
node copy each sample once; the entry itself is written at its offset in an
extent (``write_at``; cache/extents.py). Files published whole (manifests,
indexes) go through ``fileio.write_atomically`` under ``tmp_name``: a name
that carries the writer's pid.
"""

from __future__ import annotations

import errno
import fcntl
import itertools
import os
import time

from ..errors import CacheError, LocalStorageFull
from ..nodeio.fileio import pid

_FULL = (errno.ENOSPC, errno.EDQUOT)


_SEQ = itertools.count()


def tmp_name(tmp_dir: str, final: str) -> str:
    """Unique per process (pid) and per write (a counter); the pid lets a later process
    recognise orphans of a killed writer."""
    return os.path.join(tmp_dir, f"{pid()}.{os.path.basename(final)}.{next(_SEQ)}")


def write_at(fd: int, data: bytes, trailer: bytes, offset: int) -> None:
    """Write an entry (the sample's bytes, then its trailer) at ``offset`` of an extent, with one
    system call where it can."""
    n = os.pwritev(fd, [data, trailer], offset)
    total = len(data) + len(trailer)
    if n < total:   # a short write: the rest piece by piece
        rest = memoryview(bytes(data) + trailer)[n:]
        while rest:
            k = os.pwrite(fd, rest, offset + n)
            n += k
            rest = rest[k:]


def lock(lock_fd: int, offset: int) -> None:
    """Wait for the node-wide lock of one sample (byte ``offset`` of ``lock_fd``)."""
    while True:
        try:
            fcntl.lockf(lock_fd, fcntl.LOCK_EX, 1, offset)
            return
        except OSError as e:
            # POSIX locks belong to processes: two processes whose threads wait on each other's
            # locks look like a deadlock to the kernel although no thread waits holding one
            if e.errno != errno.EDEADLK:
                raise
            time.sleep(0.001)


def release(lock_fd: int, offset: int) -> None:
    """Let go of the node-wide lock of one sample."""
    fcntl.lockf(lock_fd, fcntl.LOCK_UN, 1, offset)


def local_error(e: OSError, root: str, what: str) -> CacheError:
    """The typed error for an OSError met writing ``what`` (a sample's key, a file) under ``root``."""
    if e.errno in _FULL:
        return LocalStorageFull(
            f"the node-local device of {root} is full ({e.strerror}) while staging {what!r}: free space "
            "there or choose another local_dir= on a larger node-local disk")
    return CacheError(f"cannot write {what!r} in the local cache {root}: {e.strerror or e}")
