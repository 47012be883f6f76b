"""Atomic publish, and the claim on a sample that comes before it.

Publishing writes to a temporary name in the destination's file system, then
renames: a reader sees a whole sample or nothing. Temporary names carry the
writer's pid, so a later process can remove what a killed writer left behind.
Claiming takes the node-wide lock of one sample and checks whether it is
already published, so that the ranks of a node copy each sample once.
"""

from __future__ import annotations

import errno
import fcntl
import itertools
import os
import time
from typing import Callable

from ..errors import CacheError, ClairvoyantError, LocalStorageFull
from ..fileio import c_claim as _c_claim
from ..fileio import c_write_publish as _c_write_publish
from ..fileio import pid, write_atomically

_FULL = (errno.ENOSPC, errno.EDQUOT)


_SEQ = itertools.count()


def tmp_name(tmp_dir: str, final: str) -> str:
    """Unique per process (pid) and per write (a counter); the pid lets a later process
    recognise orphans of a killed writer."""
    return os.path.join(tmp_dir, f"{pid()}.{os.path.basename(final)}.{next(_SEQ)}")


def publish(final: str, tmp_dir: str, fill: Callable[[int], int]) -> int:
    """Make ``final`` hold what ``fill(fd)`` writes, atomically; return ``fill``'s result.

    On any failure, ``fill``'s own included, neither a partial nor a temporary file is left.
    """
    try:
        return write_atomically(final, tmp_name(tmp_dir, final), fill)
    except ClairvoyantError:  # the source's own error, raised inside fill
        raise
    except OSError as e:
        raise _local_error(e, final, tmp_dir) from e




def publish_entry(final: str, tmp_dir: str, data: bytes, trailer: bytes,
                  after_write: Callable[[], None] | None = None, reuse: str | None = None) -> None:
    """Publish ``data`` followed by ``trailer`` as ``final``, atomically: one GIL-free C call where
    the helper is built (and no ``after_write`` hook is asked for), else the same steps in Python.
    ``reuse``: a spare file of ours (an evicted entry's inode) to write instead of creating one."""
    tmp = reuse or tmp_name(tmp_dir, final)
    if _c_write_publish is not None and after_write is None:
        try:
            _c_write_publish(tmp, final, data, trailer, reuse is not None)
        except OSError as e:
            raise _local_error(e, final, tmp_dir) from e
        return

    def fill(fd: int) -> int:
        n = write_entry(fd, data, trailer)
        if after_write is not None:
            after_write()
        return n
    try:
        write_atomically(final, tmp, fill, reuse=reuse is not None)
    except OSError as e:
        raise _local_error(e, final, tmp_dir) from e


def write_entry(fd: int, data: bytes, trailer: bytes) -> int:
    """Write an entry (the sample's bytes, then its trailer) with one system call where it can."""
    n = os.writev(fd, [data, trailer])
    total = len(data) + len(trailer)
    if n < total:  # a short write: finish it piece by piece
        rest = (bytes(data) + trailer)[n:]
        while rest:
            rest = rest[os.write(fd, rest):]
    return len(data)


def _lock(lock_fd: int, offset: int) -> None:
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


def _py_claim(lock_fd: int, offset: int, path: str, size: int) -> bool:
    _lock(lock_fd, offset)
    try:
        present = os.stat(path).st_size == size
    except FileNotFoundError:
        present = False
    if present:
        release(lock_fd, offset)
    return present


def claim(lock_fd: int, offset: int, path: str, size: int) -> bool:
    """Take the node-wide lock of one sample (byte ``offset`` of ``lock_fd``) and look at ``path``:
    True if it is published with ``size`` bytes (the lock is released again), else False and the
    lock stays held for the caller's copy."""
    return (_c_claim or _py_claim)(lock_fd, offset, path, size)


def release(lock_fd: int, offset: int) -> None:
    """Let go of the node-wide lock of one sample."""
    fcntl.lockf(lock_fd, fcntl.LOCK_UN, 1, offset)


def _local_error(e: OSError, final: str, tmp_dir: str) -> CacheError:
    if e.errno in _FULL:
        return LocalStorageFull(
            f"the node-local device of {os.path.dirname(os.path.dirname(tmp_dir))} is full ({e.strerror}) while staging "
            f"{os.path.basename(final)}: free space there or choose another local_dir= on a larger node-local disk")
    return CacheError(f"cannot write {final} in the local cache: {e.strerror or e}")


def remove_orphans(tmp_dir: str) -> int:
    """Delete temporary files whose writer process is gone; return how many."""
    removed = 0
    try:
        names = os.listdir(tmp_dir)
    except FileNotFoundError:
        return 0
    for name in names:
        pid_text = name.split(".", 1)[0]
        if pid_text.isdigit() and _alive(int(pid_text)):
            continue
        try:
            os.unlink(os.path.join(tmp_dir, name))
            removed += 1
        except FileNotFoundError:
            pass
    return removed


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
