"""Atomic publish: write to a temporary name in the destination's file system, then rename.

A reader sees a whole sample or nothing. Temporary names carry the writer's
pid, so a later process can remove what a killed writer left behind.
"""

from __future__ import annotations

import errno
import itertools
import os
from typing import Callable

from ..errors import CacheError, ClairvoyantError, LocalStorageFull

_FULL = (errno.ENOSPC, errno.EDQUOT)


_SEQ = itertools.count()
_PID = [os.getpid()]
os.register_at_fork(after_in_child=lambda: _PID.__setitem__(0, os.getpid()))


def tmp_name(tmp_dir: str, final: str) -> str:
    """Unique per process (pid) and per write (a counter); the pid lets a later process
    recognise orphans of a killed writer."""
    return os.path.join(tmp_dir, f"{_PID[0]}.{os.path.basename(final)}.{next(_SEQ)}")


def publish(final: str, tmp_dir: str, fill: Callable[[int], int]) -> int:
    """Make ``final`` hold what ``fill(fd)`` writes, atomically; return ``fill``'s result.

    On any failure, ``fill``'s own included, neither a partial nor a temporary file is left.
    """
    tmp = tmp_name(tmp_dir, final)
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            n = fill(fd)
        finally:
            os.close(fd)
        os.replace(tmp, final)
        return n
    except BaseException as e:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        if isinstance(e, ClairvoyantError):  # the source's own error, raised inside fill
            raise
        if isinstance(e, OSError) and e.errno in _FULL:
            raise LocalStorageFull(
                f"the node-local device of {os.path.dirname(tmp_dir)} is full "
                f"({e.strerror}) while staging {os.path.basename(final)}: free space there or choose another "
                "local_dir= on a larger node-local disk") from e
        if isinstance(e, OSError):
            raise CacheError(f"cannot write {final} in the local cache: {e.strerror or e}") from e
        raise


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
