"""Atomic publish: write to a temporary name in the destination's file system, then rename.

A reader sees a whole sample or nothing. Temporary names carry the writer's
pid, so a later process can remove what a killed writer left behind.
"""

from __future__ import annotations

import errno
import os

from ..errors import CacheError, LocalStorageFull

_FULL = (errno.ENOSPC, errno.EDQUOT)


def tmp_name(tmp_dir: str, final: str) -> str:
    return os.path.join(tmp_dir, f"{os.getpid()}.{os.path.basename(final)}.{os.urandom(4).hex()}")


def write_all(fd: int, data: bytes | memoryview) -> None:
    """os.write until done (a hook that fault injection replaces)."""
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def publish(data: bytes, final: str, tmp_dir: str) -> None:
    """Make ``final`` hold ``data`` atomically; on any failure leave neither a partial nor a temporary file."""
    tmp = tmp_name(tmp_dir, final)
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            write_all(fd, data)
        finally:
            os.close(fd)
        os.replace(tmp, final)
    except BaseException as e:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        if isinstance(e, OSError) and e.errno in _FULL:
            raise LocalStorageFull(
                f"the node-local device of {os.path.dirname(os.path.dirname(final))} is full "
                f"({e.strerror}) while staging {len(data)} bytes: free space there or choose another "
                "local_dir= on a larger node-local disk") from e
        if isinstance(e, OSError) and not isinstance(e, CacheError):
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
