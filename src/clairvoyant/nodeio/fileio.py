"""Low-level file operations: whole-file reads, writes, atomic writes.

Each uses as few system calls as it can: on a few cores every call is a GIL
hand-off for the staging threads. Where the C helper (``_fastio.c``) is built,
a read with its file's modification time is one GIL-free call; the Python fallbacks do the same (``CLAIRVOYANT_NO_CEXT=1``
turns the helper off, for the tests).
"""

from __future__ import annotations

import os
from typing import Callable

try:
    if os.environ.get("CLAIRVOYANT_NO_CEXT"):
        raise ImportError("disabled by CLAIRVOYANT_NO_CEXT")
    from ._fastio import read_meta as _c_read_meta
except ImportError:
    _c_read_meta = None

_PID = [os.getpid()]
os.register_at_fork(after_in_child=lambda: _PID.__setitem__(0, os.getpid()))


def process_alive(p: int) -> bool:
    """Whether process ``p`` runs (this one does): who may still write a temporary file it named,
    whether a mount's member or daemon is still there. A zombie (exited, not yet reaped by its
    parent) is gone. The one such check of the package."""
    if p == pid():
        return True
    try:
        os.kill(p, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{p}/stat") as f:
            return f.read().rsplit(")", 1)[-1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def pid() -> int:
    """This process's id, kept current across fork without a getpid() system call each time."""
    return _PID[0]


def read_file(path: str, size: int = -1) -> bytes:
    """The whole file in as few system calls as possible (open, [fstat,] read, close)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        if size < 0:
            size = os.fstat(fd).st_size
        data = os.read(fd, size)
        if len(data) < size:  # short read: a large file, or a pipe-like file system
            chunks = [data]
            while chunk := os.read(fd, 1 << 20):
                chunks.append(chunk)
            data = b"".join(chunks)
        return data
    finally:
        os.close(fd)


def read_with_mtime(path: str) -> tuple[bytes, int]:
    """The whole file and its modification time (ns), from one open (OSError as the calls raise it)."""
    if _c_read_meta is not None:   # one GIL-free call
        return _c_read_meta(path)
    fd = os.open(path, os.O_RDONLY)
    try:
        st = os.fstat(fd)
        data = os.read(fd, st.st_size)
        while len(data) < st.st_size and (chunk := os.read(fd, 1 << 20)):
            data += chunk
        return data, st.st_mtime_ns
    finally:
        os.close(fd)


def write_all(fd: int, data: bytes | memoryview) -> int:
    """os.write until all of ``data`` is written; return its length."""
    view = memoryview(data)
    n = len(view)
    while view:
        view = view[os.write(fd, view):]
    return n


def write_atomically(final: str, tmp: str, fill: Callable[[int], int], expected: int = -1, *,
                     durable: bool = False) -> int:
    """Create ``tmp``, let ``fill(fd)`` write it, then rename it to ``final``; return ``fill``'s count.

    Readers of ``final`` see the old content or the new, never a part. Where
    ``expected`` >= 0 and the count differs, nothing is published. On any
    failure, ``fill``'s own included, ``tmp`` is removed. ``durable``: the data
    reaches the device before the rename and the rename before the return
    (fsync of the file and of its directory), so that a crash of the machine
    leaves the old file or the new, never an empty or partial one (for files
    written seldom and read at every start, such as manifests).
    """
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            n = fill(fd)
            if durable:
                os.fsync(fd)
        finally:
            os.close(fd)
        if 0 <= expected != n:
            os.unlink(tmp)
            return n
        os.replace(tmp, final)
        if durable:
            dfd = os.open(os.path.dirname(final) or ".", os.O_RDONLY | os.O_DIRECTORY)
            try:
                os.fsync(dfd)
            finally:
                os.close(dfd)
        return n
    except BaseException:
        discard(tmp)
        raise


def discard(path: str) -> None:
    """Remove ``path`` if it is there (a temporary file given up)."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
