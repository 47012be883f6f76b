"""MECHANISM: the node-local staging directory of one source.

Layout under ``local_dir``::

    v1/<source id>/data/<xx>/<sha1 of key>   published samples
    v1/<source id>/tmp/<xx>/<pid>.<name>.<n> writes in progress
    v1/<source id>/locks                     byte-range locks, one byte per key hash

Several processes (the ranks of a node) may share one directory: a byte-range
lock on the key's slot in ``locks`` makes sure a sample is copied once. POSIX
record locks vanish with their process, so a killed rank never leaves a stale
lock behind.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import stat
import weakref
from typing import Callable

from ..errors import LocalDirNotWritable
from ..fileio import write_all
from . import publish as _publish
from .publish import remove_orphans

LAYOUT = "v1"


def prepare_root(local_dir: str) -> str:
    """Create ``local_dir`` with mode 0700 if needed and check that it is safe and writable."""
    local_dir = os.path.abspath(os.path.expanduser(local_dir))
    try:
        os.makedirs(local_dir, mode=0o700, exist_ok=True)
    except OSError as e:
        raise LocalDirNotWritable(
            f"cannot create local_dir {local_dir!r}: {e.strerror or e}; pass local_dir= on a writable node-local disk") from e
    st = os.stat(local_dir)
    if not stat.S_ISDIR(st.st_mode):
        raise LocalDirNotWritable(f"local_dir {local_dir!r} is not a directory: pass a directory")
    if st.st_uid != os.getuid():
        raise LocalDirNotWritable(
            f"local_dir {local_dir!r} belongs to uid {st.st_uid}, not to you: pass your own local_dir=")
    if not os.access(local_dir, os.W_OK | os.X_OK):
        raise LocalDirNotWritable(
            f"local_dir {local_dir!r} is not writable: fix its permissions or pass another local_dir=")
    return local_dir


def _digest(key: str) -> str:
    return hashlib.sha1(key.encode()).hexdigest()


class LocalStore:
    """Published samples of one source in one node-local directory."""

    def __init__(self, local_dir: str, source_uri: str) -> None:
        self.local_dir = prepare_root(local_dir)
        self.root = os.path.join(self.local_dir, LAYOUT, _digest(source_uri)[:16])
        self.data_dir = os.path.join(self.root, "data")
        self.tmp_dir = os.path.join(self.root, "tmp")
        try:
            # 256 shards each for data and temporary files: concurrent creates and renames of many
            # staging threads would otherwise queue on one directory's lock
            for d in (self.data_dir, self.tmp_dir):
                os.makedirs(d, mode=0o700, exist_ok=True)
                for i in range(256):
                    os.makedirs(os.path.join(d, f"{i:02x}"), exist_ok=True)
            self._lock_fd = os.open(os.path.join(self.root, "locks"), os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as e:
            raise LocalDirNotWritable(
                f"cannot set up the cache in {self.root!r}: {e.strerror or e}; pass another local_dir=") from e
        self._closer = weakref.finalize(self, os.close, self._lock_fd)  # closed with the store, at the latest
        self.orphans_removed = sum(remove_orphans(os.path.join(self.tmp_dir, f"{i:02x}")) for i in range(256))

    def close(self) -> None:
        self._closer()
        self._lock_fd = -1

    def path_for(self, key: str) -> str:
        d = _digest(key)
        return os.path.join(self.data_dir, d[:2], d)

    def _tmp_for(self, final: str) -> str:
        return os.path.join(self.tmp_dir, os.path.basename(final)[:2])

    def _offset(self, key: str) -> int:
        return int(_digest(key)[:8], 16)

    def claim(self, key: str, size: int) -> bool:
        """True if ``key`` is already here; else False, and the caller holds the node-wide lock
        of ``key`` until ``put_file(..., unlock=True)`` or ``release(key)``."""
        return _publish.claim(self._lock_fd, self._offset(key), self.path_for(key), size)

    def release(self, key: str) -> None:
        _publish.release(self._lock_fd, self._offset(key))

    def put(self, key: str, data: bytes) -> None:
        """Publish ``data`` as ``key``."""
        self.put_from(key, lambda fd: write_all(fd, data))

    def put_file(self, key: str, src: str, size: int, unlock: bool = False) -> int:
        """Publish a copy of the file ``src`` if it holds ``size`` bytes; return the bytes found.
        With ``unlock``, the lock taken by ``claim`` is released at the end, whatever happens."""
        final = self.path_for(key)
        lock = (self._lock_fd, self._offset(key)) if unlock else (-1, 0)
        return _publish.publish_file(final, self._tmp_for(final), src, size, lock)

    def put_from(self, key: str, fill: Callable[[int], int]) -> int:
        """Publish what ``fill(fd)`` writes (e.g. an in-kernel copy from the source)."""
        final = self.path_for(key)
        return _publish.publish(final, self._tmp_for(final), fill)
